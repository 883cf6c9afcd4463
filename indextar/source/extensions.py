"""The source room's C extensions: copies out of shard maps, one-pass gunzip, the
direct S3 client's answer heads.

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

try:
    from . import _http11
except ImportError:  # pragma: no cover - only where the extension did not compile
    _http11 = None  # type: ignore[assignment]

__all__ = ["gunzip", "http11", "mapread"]


def mapread() -> ModuleType | None:
    """The guarded copy out of shard maps (``_mapread.c``), or ``None`` for slices."""
    return use(_mapread)


def gunzip() -> ModuleType | None:
    """The one-pass gzip decompression with seek points (``_gunzip.c``), or ``None``
    for zlib's pass and then indexed_gzip's."""
    return use(_gunzip)


def http11() -> ModuleType | None:
    """An answer's head parsed, and a body's buffer made unzeroed (``_http11.c``), or
    ``None`` for :mod:`.http11`'s Python parsing and ``bytearray(n)``."""
    return use(_http11)
