"""Whether to use the optional C extensions, and which were built.

indextar's hot paths have small C versions, built by ``pip install`` where a
compiler is present (``optional = true`` in pyproject.toml). Each room loads its own
(its ``extensions`` module), so this module imports no room:

* ``tar/_tarwalk``: the common case of the tar walk, member names and their grouping;
* ``index/_sqlitebulk``: an index's bulk rows through SQLite's C API;
* ``source/_mapread``: a sample's members copied straight out of a shard's memory map,
  a truncated shard's SIGBUS caught;
* ``order/_permute``: the keyed permutation of the sampler's orders, element by element;
* ``order/_pack``: best and first fit decreasing of documents into packs (sequence
  packing);
* ``read/_keyjoin``: the hash join of two datasets' keys (``IndexedTarDataset.join``);
* ``source/_gunzip``: a gzip shard decompressed and checked in one pass, its seek points
  placed on the way (the reference: :mod:`zlib`'s checked pass, then
  ``indexed_gzip``'s);
* ``source/_http11``: the direct S3 client's answer heads parsed, and its bodies'
  buffers made without being zeroed first.

Each has a Python reference that gives identical results and handles every case,
including the unusual ones the C code hands back. Setting the environment variable
``INDEXTAR_PURE_PYTHON`` makes indextar use the references alone; the test suite
runs both ways.
"""

from __future__ import annotations

import os
from importlib.machinery import PathFinder
from pathlib import Path
from types import ModuleType

__all__ = ["PURE_PYTHON_ENV", "use", "built"]

#: Set this environment variable to use only the Python references.
PURE_PYTHON_ENV = "INDEXTAR_PURE_PYTHON"

# Each extension and the room (a folder of the package) that builds and loads it.
_ROOMS = {
    "_tarwalk": "tar",
    "_sqlitebulk": "index",
    "_mapread": "source",
    "_permute": "order",
    "_pack": "order",
    "_gunzip": "source",
    "_http11": "source",
    "_keyjoin": "read",
}


def use(extension: ModuleType | None) -> ModuleType | None:
    """``extension`` (a room's C extension, ``None`` where it did not build), or
    ``None`` where :data:`PURE_PYTHON_ENV` asks for the Python references."""
    return None if os.environ.get(PURE_PYTHON_ENV) else extension


def built() -> dict[str, bool]:
    """Which C extensions this installation has (found in their rooms' folders,
    without importing the rooms)."""
    package = Path(__file__).resolve().parent
    return {
        name: PathFinder.find_spec(name, [str(package / room)]) is not None
        for name, room in _ROOMS.items()
    }
