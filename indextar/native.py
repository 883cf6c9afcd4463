"""The optional C extensions, and whether to use them.

indextar's hot paths have small C versions, built by ``pip install`` where a
compiler is present (``optional = true`` in pyproject.toml):

* ``_tarwalk``: the common case of the tar walk, member names and their grouping;
* ``_sqlitebulk``: an index's bulk rows through SQLite's C API;
* ``_mapread``: a sample's members copied straight out of a shard's memory map, a
  truncated shard's SIGBUS caught;
* ``_permute``: the keyed permutation of the sampler's orders, element by element;
* ``_pack``: best and first fit decreasing of documents into packs (sequence packing);
* ``_gunzip``: a gzip shard decompressed and checked in one pass, its seek points placed
  on the way (the reference: :mod:`zlib`'s checked pass, then ``indexed_gzip``'s).

Each has a Python reference that gives identical results and handles every case,
including the unusual ones the C code hands back. Setting the environment variable
``INDEXTAR_PURE_PYTHON`` makes indextar use the references alone; the test suite
runs both ways.
"""

from __future__ import annotations

import os
from types import ModuleType

try:
    from .tar import _tarwalk
except ImportError:  # pragma: no cover - only where the extension did not compile
    _tarwalk = None  # type: ignore[assignment]
try:
    from .source import _mapread
except ImportError:  # pragma: no cover - only where the extension did not compile
    _mapread = None  # type: ignore[assignment]
try:
    from .index import _sqlitebulk
except ImportError:  # pragma: no cover - only where the extension did not compile
    _sqlitebulk = None  # type: ignore[assignment]
try:
    from .order import _permute
except ImportError:  # pragma: no cover - only where the extension did not compile
    _permute = None  # type: ignore[assignment]
try:
    from .order import _pack
except ImportError:  # pragma: no cover - only where the extension did not compile
    _pack = None  # type: ignore[assignment]
try:
    from .source import _gunzip
except ImportError:  # pragma: no cover - only where the extension did not compile
    _gunzip = None  # type: ignore[assignment]

__all__ = [
    "PURE_PYTHON_ENV",
    "tarwalk",
    "sqlitebulk",
    "mapread",
    "permute",
    "pack",
    "gunzip",
    "built",
]

#: Set this environment variable to use only the Python references.
PURE_PYTHON_ENV = "INDEXTAR_PURE_PYTHON"


def _chosen(module: ModuleType | None) -> ModuleType | None:
    return None if os.environ.get(PURE_PYTHON_ENV) else module


def tarwalk() -> ModuleType | None:
    """The C tar walker (``_tarwalk.c``), or ``None`` where the reference is to be used."""
    return _chosen(_tarwalk)


def sqlitebulk() -> ModuleType | None:
    """The C index row writer (``_sqlitebulk.c``), or ``None`` for executemany."""
    return _chosen(_sqlitebulk)


def mapread() -> ModuleType | None:
    """The guarded copy out of shard maps (``_mapread.c``), or ``None`` for slices."""
    return _chosen(_mapread)


def permute() -> ModuleType | None:
    """The keyed permutation in C (``_permute.c``), or ``None`` for the numpy one."""
    return _chosen(_permute)


def pack() -> ModuleType | None:
    """Best and first fit decreasing in C (``_pack.c``), or ``None`` for the Python ones."""
    return _chosen(_pack)


def gunzip() -> ModuleType | None:
    """The one-pass gzip decompression with seek points (``_gunzip.c``), or ``None`` for
    zlib's pass and then indexed_gzip's."""
    return _chosen(_gunzip)


def built() -> dict[str, bool]:
    """Which C extensions this installation has."""
    return {
        "_tarwalk": _tarwalk is not None,
        "_sqlitebulk": _sqlitebulk is not None,
        "_mapread": _mapread is not None,
        "_permute": _permute is not None,
        "_pack": _pack is not None,
        "_gunzip": _gunzip is not None,
    }
