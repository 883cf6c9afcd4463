"""The public API is documented: every name in ``indextar.__all__`` has a docstring
(classes, and their public methods and properties too) and is mentioned in README.md
or docs/*.md, so a reader can find it without reading the source."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import indextar

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = [name for name in indextar.__all__ if name != "__version__"]


def _own_doc(obj: object) -> str:
    # inspect.getdoc would inherit a base class's docstring; a class must have its own.
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return (doc or "").strip()


def _public_members(cls: type) -> list[tuple[str, object]]:
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            members.append((name, value.fget))
        elif isinstance(value, (classmethod, staticmethod)):
            members.append((name, value.__func__))
        elif inspect.isfunction(value):
            members.append((name, value))
    return members


def test_all_names_exist() -> None:
    missing = [name for name in indextar.__all__ if not hasattr(indextar, name)]
    assert not missing, missing


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_docstrings(name: str) -> None:
    obj = getattr(indextar, name)
    undocumented = [] if _own_doc(obj) else [name]
    if inspect.isclass(obj):
        undocumented += [
            f"{name}.{member}" for member, fn in _public_members(obj) if not _own_doc(fn)
        ]
    assert not undocumented, f"no docstring: {undocumented}"


def test_public_names_are_mentioned_in_the_docs() -> None:
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    unmentioned = [name for name in PUBLIC if not re.search(rf"\b{re.escape(name)}\b", text)]
    assert not unmentioned, (
        f"public names that no page of README.md or docs/ mentions: {unmentioned}"
    )


def test_the_check_catches_an_undocumented_method() -> None:
    class Documented:
        """Has a docstring."""

        def method(self) -> None:
            pass

    assert _own_doc(Documented) and [
        m for m, fn in _public_members(Documented) if not _own_doc(fn)
    ] == ["method"]


def _resolves(dotted: str) -> bool:
    obj: object = importlib.import_module("indextar")
    parts = dotted.split(".")
    for i, part in enumerate(parts[1:], start=2):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            return False
    return True


def test_dotted_names_in_the_docs_exist() -> None:
    """Prose such as ``indextar.errors.RemoteReadError`` is not run; check it names something."""
    wrong = sorted(
        {
            f"{page.name}: {m.group(0)}"
            for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
            for m in re.finditer(r"\bindextar(?:\.[A-Za-z_]\w*)+", page.read_text())
            if not _resolves(m.group(0))
        }
    )
    assert not wrong, f"the docs name what indextar does not have: {wrong}"
