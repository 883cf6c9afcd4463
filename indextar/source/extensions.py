"""The source room's C extensions: copies out of shard maps, one-pass gunzip.

Each is ``None`` where it did not build or ``INDEXTAR_PURE_PYTHON`` is set
(:mod:`indextar.native`); the callers then use their Python references.
"""

from __future__ import annotations

from types import ModuleType

from ..native import use

try:
    from . import _mapread
except ImportError:  # pragma: no cover - only where the extension did not compile
    _mapread = None  # type: ignore[assignment]
try:
    from . import _gunzip
except ImportError:  # pragma: no cover - only where the extension did not compile
    _gunzip = None  # type: ignore[assignment]

__all__ = ["mapread", "gunzip"]


def mapread() -> ModuleType | None:
    """The guarded copy out of shard maps (``_mapread.c``), or ``None`` for slices."""
    return use(_mapread)


def gunzip() -> ModuleType | None:
    """The one-pass gzip decompression with seek points (``_gunzip.c``), or ``None``
    for zlib's pass and then indexed_gzip's."""
    return use(_gunzip)
