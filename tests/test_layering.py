"""The package's rooms and who may import whom, read from the source with ``ast``.

Lower rooms never import higher ones, so a change cannot quietly make ``tar/`` import
``read/``. The rules are the ones each room's ``__init__`` docstring states; the
shared top-level modules (``errors``, ``atomic``, ``native``,
``_version``) may be imported by every room and import no room themselves: each room
loads its own C extension, and ``native`` only says whether to use them. Only ``cli/``
prints or exits.

Rooms share public names only: no module imports another's ``_private`` name (the C
extensions apart), nor reaches one by ``getattr``. And no two modules import each
other, however far round: every import counts, in functions and under
``TYPE_CHECKING`` too, since a circle there is the same coupling, however it is loaded.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from indextar import native

PACKAGE = Path(__file__).resolve().parents[1] / "indextar"
SHARED = frozenset({"errors", "atomic", "native", "_version"})
# room -> the rooms it may import (each may import itself and the shared modules)
ALLOWED: dict[str, frozenset[str]] = {
    "tar": frozenset(),
    "source": frozenset({"tar"}),
    "index": frozenset({"tar", "source"}),
    "order": frozenset(),
    "read": frozenset({"tar", "source", "index", "order"}),
    "write": frozenset({"tar", "source", "index"}),
    "train": frozenset({"order", "read"}),
    # other frameworks' pipelines (optional extras, never imported by `import indextar`)
    "grain": frozenset({"read"}),
    "ray": frozenset({"index", "read"}),
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
        for line, target, _taken in imported(name, path, top):
            target_room = room_of(target) if target else ""
            if room in TOP_LEVEL_API or target_room in ("", room) or target_room in SHARED:
                continue
            if room in SHARED:
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
    assert any("native.py:1: shared module imports room 'tar'" in v for v in found), found
    assert len(found) == 6, found  # read/ importing tar/ is fine


# -- private names ---------------------------------------------------------------------

# The C extensions are private modules that their own room imports by name.
EXTENSIONS = frozenset(native.built())  # the C extensions, each imported by its room
# Private attributes of other projects' objects, reached where they offer no public one.
FOREIGN_PRIVATE = {
    "_cache": "fsspec's instance cache of each filesystem class (source/filesystems.py)",
    "_sampler": "Lightning's wrapper of the sampler it replaced (train/lightning.py)",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names(package: Path, top: str = "indextar") -> list[str]:
    """Every ``from x import _name`` of another module of the package (the extensions
    apart) and every ``getattr``/``hasattr`` of a constant private name."""
    found = []
    for name, path in modules(package):
        where = f"{path.relative_to(package.parent)}"
        for line, target, taken in imported(name, path, top):
            for leaf in taken or [target.split(".")[-1]]:  # from . import module too
                if _private(leaf) and leaf not in EXTENSIONS:
                    found.append(f"{where}:{line}: imports private {leaf!r}")
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr", "setattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and _private(node.args[1].value)
                and node.args[1].value not in FOREIGN_PRIVATE
            ):
                found.append(
                    f"{where}:{node.lineno}: {node.func.id}() of private {node.args[1].value!r}"
                )
    return found


def test_no_module_takes_another_modules_private_names() -> None:
    assert private_names(PACKAGE) == []


def test_a_private_name_taken_across_modules_is_caught(tmp_path: Path) -> None:
    package = write(
        tmp_path / "indextar",
        {
            "__init__.py": "",
            "tar/__init__.py": "",
            "tar/scan.py": "from ._tarwalk import walk\nclass _Scanner: ...\n",
            "tar/stream.py": "from .scan import _Scanner\nfrom . import _tarwalk\n",
            "read/__init__.py": "",
            "read/mix.py": "def f(d):\n    return getattr(d, '_read'), getattr(d, '__len__')\n",
        },
    )
    found = private_names(package)
    assert found == [
        "indextar/read/mix.py:2: getattr() of private '_read'",
        "indextar/tar/stream.py:1: imports private '_Scanner'",
    ], found


# -- circles ---------------------------------------------------------------------------


def _module(name: str) -> str:
    """``tar`` for ``tar.__init__``, ``""`` for the package's own ``__init__``."""
    return "" if name == "__init__" else name.removesuffix(".__init__")


def import_graph(package: Path, top: str = "indextar") -> dict[str, set[str]]:
    """Module -> the modules of the package it imports (``a.b`` for ``a/b.py`` and
    ``a`` for ``a/__init__.py``), every import statement counted wherever it stands."""
    names = {_module(name) for name, _ in modules(package)}
    graph: dict[str, set[str]] = {}
    for name, path in modules(package):
        module = _module(name)
        targets = graph.setdefault(module, set())
        for _line, target, taken in imported(name, path, top):
            for leaf in taken or [None]:
                sub = f"{target}.{leaf}" if target and leaf else leaf or target
                if sub in names:  # from . import module, from .room import module
                    targets.add(sub)
                elif target in names:
                    targets.add(target)
        targets.discard(module)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return sorted(found)


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert circles(import_graph(PACKAGE)) == []


def test_a_circle_through_a_function_or_type_checking_is_caught(tmp_path: Path) -> None:
    package = write(
        tmp_path / "indextar",
        {
            "__init__.py": "from .read.dataset import Dataset\n",
            "read/__init__.py": "",
            "read/dataset.py": "from .subset import Subset\nclass Dataset: ...\n",
            "read/subset.py": "def f():\n    from . import lookup\nclass Subset: ...\n",
            "read/lookup.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from indextar.read.dataset import Dataset\n"
            ),
            "read/decode.py": "from ..read import dataset\n",
        },
    )
    graph = import_graph(package)
    assert graph["read.decode"] == {"read.dataset"} and graph[""] == {"read.dataset"}
    assert circles(graph) == [["read.dataset", "read.lookup", "read.subset"]]


# -- where a shard lives ---------------------------------------------------------------

# Whether a shard is local or remote is decided from its name in these modules only: the
# location type (ShardLocation.of and url_scheme, the one test) and the scheme registry
# (filesystems.split_url, which splits a URL already known to be remote, for the
# backend of its scheme). Every other module asks a ShardLocation (``.remote``,
# ``.scheme``; remote_shards for a dataset's names at once), or is told (``remote=``).
DECIDES_WHERE = frozenset({"source/location.py", "source/filesystems.py"})
# The string tests: a call of one is a decision, wherever it stands.
SCHEME_TESTS = frozenset({"url_scheme", "is_url"})
SCHEMES = frozenset({"http", "https", "s3", "s3a", "gs", "gcs", "az", "abfs", "hf", "file"})


def _decides(node: ast.AST) -> str:
    """Why ``node`` decides from a name whether it is a URL, or ``""``: a scheme test
    called, ``"://"`` looked for (``in``, ``partition``, ``split``, ...), a name tested
    for a scheme's prefix (``startswith("http")``)."""
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(isinstance(o, ast.Constant) and o.value == "://" for o in operands):
            return "'://' in"
    if not isinstance(node, ast.Call):
        return ""
    func = node.func
    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if called in SCHEME_TESTS:
        return f"{called}()"
    texts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if isinstance(func, ast.Attribute) and any("://" in text for text in texts):
        return f"{called}('://')"
    if called in ("startswith", "removeprefix") and any(
        text.lower().rstrip(":/") in SCHEMES for text in texts
    ):
        return f"{called}() of a scheme"
    return ""


def deciding_sites(package: Path) -> list[str]:
    """``file:line: why`` of every place that decides from a name whether it is a URL."""
    found = []
    for _name, path in modules(package):
        where = path.relative_to(package).as_posix()
        lines = {}
        for node in ast.walk(ast.parse(path.read_text())):
            why = _decides(node)
            if why:
                lines.setdefault(node.lineno, why)  # type: ignore[attr-defined]
        found += [f"{where}:{line}: {why}" for line, why in sorted(lines.items())]
    return found


def test_only_the_location_and_its_registry_decide_where_a_shard_lives() -> None:
    found = deciding_sites(PACKAGE)
    assert [site for site in found if site.split(":")[0] not in DECIDES_WHERE] == []
    assert {site.split(":")[0] for site in found} == DECIDES_WHERE and len(DECIDES_WHERE) <= 3


def test_a_new_place_that_decides_where_a_shard_lives_is_caught(tmp_path: Path) -> None:
    package = write(
        tmp_path / "indextar",
        {
            "__init__.py": "",
            "source/__init__.py": "",
            "source/location.py": 'def url_scheme(n):\n    """A://b."""\n    return "://" in n\n',
            "read/__init__.py": "",
            "read/shard.py": (
                "from ..source.location import url_scheme\n"
                "def f(n, s):\n    return url_scheme(n), f'{s}://{n}', print(help='a://b')\n"
                "def g(n):\n    return n.startswith('http')\n"
            ),
            "index/__init__.py": "",
            "index/manifest.py": "def g(n):\n    return n.partition('://')[0]\n",
        },
    )
    assert deciding_sites(package) == [
        "index/manifest.py:2: partition('://')",
        "read/shard.py:3: url_scheme()",
        "read/shard.py:5: startswith() of a scheme",
        "source/location.py:3: '://' in",
    ]


MAX_MODULE_LINES = 450


def test_no_module_is_over_450_lines() -> None:
    """Small single-purpose modules: a module past the cap is split, not grown."""
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
