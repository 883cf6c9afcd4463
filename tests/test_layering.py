"""The package's rooms and who may import whom, read from the source with ``ast``.

Lower rooms never import higher ones, so a change cannot quietly make ``tar/`` import
``read/``. The rules are the ones each room's ``__init__`` docstring states; the
shared top-level modules (``errors``, ``patterns``, ``atomic``, ``native``,
``_version``) may be imported by every room and import no room themselves, except
that ``native`` loads the rooms' C extensions, which import nothing of indextar.
Only ``cli/`` prints or exits.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "indextar"
SHARED = frozenset({"errors", "patterns", "atomic", "native", "_version"})
# room -> the rooms it may import (each may import itself and the shared modules)
ALLOWED: dict[str, frozenset[str]] = {
    "tar": frozenset(),
    "source": frozenset({"tar"}),
    "index": frozenset({"tar", "source"}),
    "order": frozenset(),
    "read": frozenset({"tar", "source", "index", "order"}),
    "write": frozenset({"tar", "source", "index"}),
    "train": frozenset({"order", "read"}),
    "cli": frozenset({"tar", "source", "index", "order", "read", "write", "train"}),
}
TOP_LEVEL_API = frozenset({"__init__", "__main__"})  # the public API: every room


def modules(package: Path) -> Iterator[tuple[str, Path]]:
    """``(dotted name relative to the package, path)`` of every module."""
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        yield ".".join(parts), path


def imported(name: str, path: Path, top: str) -> Iterator[tuple[int, str, list[str]]]:
    """``(line, dotted target relative to the package, names taken from it)`` of every
    import in module ``name``."""
    package = name.split(".")[:-1]  # tar.scan and tar.__init__ both live in tar
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
                taken = [alias.name for alias in node.names]
                if node.module is None:  # from . import a, b: each name may be a module
                    for alias in taken:
                        yield node.lineno, ".".join([*target, alias]), []
                    continue
                yield node.lineno, ".".join(target), taken
            elif node.module and (node.module == top or node.module.startswith(top + ".")):
                taken = [alias.name for alias in node.names]
                yield node.lineno, node.module.removeprefix(top).lstrip("."), taken
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(top + "."):
                    yield node.lineno, alias.name.removeprefix(top + "."), []


def room_of(dotted: str) -> str:
    return dotted.split(".")[0]


def violations(package: Path, top: str = "indextar") -> list[str]:
    """Every import that breaks the rules, and every print or exit outside ``cli/``."""
    found = []
    rooms = set(ALLOWED)
    for name, path in modules(package):
        room = room_of(name)
        where = f"{path.relative_to(package.parent)}"
        if room not in rooms | SHARED | TOP_LEVEL_API:
            found.append(f"{where}: module outside any room")
            continue
        for line, target, taken in imported(name, path, top):
            target_room = room_of(target) if target else ""
            if room in TOP_LEVEL_API or target_room in ("", room) or target_room in SHARED:
                continue
            if room in SHARED:
                leaves = taken or [target.split(".")[-1]]
                extension = target_room in rooms and all(leaf.startswith("_") for leaf in leaves)
                if not (room == "native" and extension):
                    found.append(f"{where}:{line}: shared module imports room {target!r}")
                continue
            if target_room not in ALLOWED[room]:
                found.append(f"{where}:{line}: {room}/ imports {target!r} ({target_room}/)")
        if room not in ("cli", "__main__"):  # python -m indextar is the CLI too
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    func = node.func
                    called = (
                        func.id
                        if isinstance(func, ast.Name)
                        else f"{ast.unparse(func.value)}.{func.attr}"
                        if isinstance(func, ast.Attribute)
                        else ""
                    )
                    if called in ("print", "exit", "sys.exit", "quit", "os._exit"):
                        found.append(f"{where}:{node.lineno}: {called}() outside cli/")
    return found


def test_every_room_imports_only_what_its_rules_allow() -> None:
    assert violations(PACKAGE) == []


def test_every_module_lives_in_a_room_or_is_shared() -> None:
    loose = [
        name
        for name, _ in modules(PACKAGE)
        if "." not in name and name not in SHARED | TOP_LEVEL_API
    ]
    assert loose == []
    assert {room_of(name) for name, _ in modules(PACKAGE) if "." in name} == set(ALLOWED)


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_each_room_says_what_it_may_import(room: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / room / "__init__.py").read_text()))
    assert doc and "May import" in doc and "Must not import" in doc, room


def write(package: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return package


def test_a_deliberate_violation_is_caught(tmp_path: Path) -> None:
    package = write(
        tmp_path / "indextar",
        {
            "__init__.py": "from .read.dataset import Dataset\n",
            "errors.py": "class IndextarError(Exception): ...\n",
            "native.py": "from .tar import _tarwalk\n",
            "tar/__init__.py": "",
            "tar/scan.py": "from ..errors import IndextarError\nfrom ..read import dataset\n",
            "tar/walk.py": "def f():\n    from indextar.read.dataset import Dataset\n",
            "read/__init__.py": "",
            "read/dataset.py": "from ..tar.scan import f\nclass Dataset: ...\n",
            "order/__init__.py": "",
            "order/sampler.py": "import indextar.source.remote\nprint('hello')\n",
            "errors2.py": "",
        },
    )
    found = violations(package)
    assert any("tar/scan.py:2: tar/ imports 'read'" in v for v in found), found
    assert any("tar/walk.py:2: tar/ imports 'read.dataset'" in v for v in found), found
    assert any("order/sampler.py:1: order/ imports 'source.remote'" in v for v in found), found
    assert any("order/sampler.py:2: print() outside cli/" in v for v in found), found
    assert any("errors2.py: module outside any room" in v for v in found), found
    assert len(found) == 5, found  # read/ importing tar/ and native's extension are fine
