"""The read room's C extension: the hash join of two datasets' keys.

``None`` where it did not build or ``INDEXTAR_PURE_PYTHON`` is set
(:mod:`indextar.native`); :mod:`indextar.read.keyjoin` then joins in numpy.
"""

from __future__ import annotations

from types import ModuleType

from ..native import use

try:
    from . import _keyjoin
except ImportError:  # pragma: no cover - only where the extension did not compile
    _keyjoin = None  # type: ignore[assignment]

__all__ = ["keyjoin"]


def keyjoin() -> ModuleType | None:
    """The hash join of keys in C (``_keyjoin.c``), or ``None`` for the numpy one."""
    return use(_keyjoin)
