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
