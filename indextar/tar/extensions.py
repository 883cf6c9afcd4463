"""The tar room's C extension: the walker.

Each is ``None`` where it did not build or ``INDEXTAR_PURE_PYTHON`` is set
(:mod:`indextar.native`); the callers then use their Python references.
"""

from __future__ import annotations

from types import ModuleType

from ..native import use

try:
    from . import _tarwalk
except ImportError:  # pragma: no cover - only where the extension did not compile
    _tarwalk = None  # type: ignore[assignment]

__all__ = ["tarwalk"]


def tarwalk() -> ModuleType | None:
    """The C tar walker (``_tarwalk.c``), or ``None`` where the reference is to be used."""
    return use(_tarwalk)
