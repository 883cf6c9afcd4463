"""The order room's C extensions: the keyed permutation, and packing by fit.

Each is ``None`` where it did not build or ``INDEXTAR_PURE_PYTHON`` is set
(:mod:`indextar.native`); the callers then use their Python references.
"""

from __future__ import annotations

from types import ModuleType

from ..native import use

try:
    from . import _permute
except ImportError:  # pragma: no cover - only where the extension did not compile
    _permute = None  # type: ignore[assignment]

try:
    from . import _pack
except ImportError:  # pragma: no cover - only where the extension did not compile
    _pack = None  # type: ignore[assignment]

__all__ = ["permute", "pack"]


def permute() -> ModuleType | None:
    """The keyed permutation in C (``_permute.c``), or ``None`` for the numpy one."""
    return use(_permute)


def pack() -> ModuleType | None:
    """Best and first fit decreasing in C (``_pack.c``), or ``None`` for the Python ones."""
    return use(_pack)
