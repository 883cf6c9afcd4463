"""The index room's C extension: the bulk row writer.

Each is ``None`` where it did not build or ``INDEXTAR_PURE_PYTHON`` is set
(:mod:`indextar.native`); the callers then use their Python references.
"""

from __future__ import annotations

from types import ModuleType

from ..native import use

try:
    from . import _sqlitebulk
except ImportError:  # pragma: no cover - only where the extension did not compile
    _sqlitebulk = None  # type: ignore[assignment]

__all__ = ["sqlitebulk"]


def sqlitebulk() -> ModuleType | None:
    """The C index row writer (``_sqlitebulk.c``), or ``None`` for executemany."""
    return use(_sqlitebulk)
