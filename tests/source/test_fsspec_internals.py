"""The names indextar takes from under fsspec's public API are all still there.

``indextar/source/fsspec_internals.py`` lists them; an fsspec (or s3fs) release that
moves one fails here, naming the version and the attribute, before any read does.
"""

from __future__ import annotations

import ast
from importlib import metadata
from pathlib import Path

import pytest
from fsspec.implementations.http import HTTPFileSystem

from indextar.source import fsspec_internals
from indextar.source.fsspec_internals import INTERNALS, missing_internals

SOURCE = Path(fsspec_internals.__file__).parent


def test_every_internal_indextar_uses_is_in_the_installed_fsspec() -> None:
    missing = missing_internals()
    assert not missing, "fsspec changed under indextar:\n" + "\n".join(missing)


def test_a_missing_internal_is_named_with_the_fsspec_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(HTTPFileSystem, "_raise_not_found_for_status")
    (line,) = missing_internals()
    version = metadata.version("fsspec")
    assert line.startswith(
        f"fsspec {version} has no fsspec.implementations.http.HTTPFileSystem."
        "_raise_not_found_for_status"
    ), line
    with pytest.raises(
        AttributeError, match=rf"HTTPFileSystem\._raise_not_found_for_status.*fsspec {version}"
    ):
        fsspec_internals.http_raise_for_status(HTTPFileSystem(), None, "x")


def test_no_other_module_reaches_under_fsspec() -> None:
    """Elsewhere in ``source/``: no private attribute of a filesystem (``fs._x``, a
    class's ``_cache``) and no fsspec module but ``fsspec.core`` (``url_to_fs``)."""
    found = []
    for path in sorted(SOURCE.glob("*.py")):
        if path.name == "fsspec_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                if isinstance(node.value, ast.Name) and node.value.id in ("fs", "cls"):
                    found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            found += [
                f"{path.name}:{node.lineno}: import {name}"
                for name in names
                if name.startswith("fsspec") and name != "fsspec.core"
            ]
    assert not found, found


def test_the_list_names_each_attribute_once() -> None:
    keys = [(i.module, i.owner, i.name) for i in INTERNALS]
    assert len(keys) == len(set(keys))


_LOOP_PROBE = """
import asyncio, os, sys
from indextar.source.fsspec_internals import default_loop, run_on_default_loop

async def kind():
    return type(asyncio.get_running_loop()).__module__

first = default_loop()
print(run_on_default_loop(kind))
pid = os.fork()
if pid == 0:  # a forked child: a fresh loop of the same kind, running, not the parent's
    ok = default_loop() is not first and run_on_default_loop(kind) == type(first).__module__
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), run_on_default_loop(kind))
"""


@pytest.mark.parametrize(("setting", "module"), [("1", "uvloop"), ("0", "asyncio.unix_events")])
def test_remote_reads_run_on_uvloop_unless_told_not(setting: str, module: str) -> None:
    """uvloop is in ``indextar[remote]``: fsspec's loop, made by indextar first, is a
    uvloop one (``INDEXTAR_UVLOOP=0``: asyncio's); a forked child makes its own, and the
    parent's still runs after the child ends."""
    import os
    import subprocess
    import sys

    pytest.importorskip("uvloop", reason="uvloop does not install on this platform")
    env = dict(os.environ, INDEXTAR_UVLOOP=setting)
    out = subprocess.run(
        [sys.executable, "-c", _LOOP_PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [module, "0", module]
