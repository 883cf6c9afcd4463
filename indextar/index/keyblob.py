"""Every key of a shard, read from its index without the rest of its arrays.

A join (:mod:`indextar.read.keyjoin`) reads every key of two datasets. The ``keys``
row of ``arrays`` holds them, one after another; where each ends is in ``samples``,
which takes 48 bytes a sample against a key's 10 or 20 (at 1e7 samples, 480 MB to read
from disk for 170 MB of keys). So the index also stores each key's length, in a
``key_lengths`` row of the narrowest unsigned dtype that holds them (``<u1`` for keys
under 256 bytes), written beside the arrays in the same transaction
(:func:`write_key_lengths`). An index written before it has none: its keys' ends are
then read from ``samples`` (:func:`read_keys`), as before. Readers that do not know the
row ignore it, as they do ``checksums``; ``verify_index`` checks it against ``samples``.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import IndexFormatError
from .arrays import ShardArrays, read_arrays

__all__ = ["KEY_LENGTHS", "ShardKeys", "read_keys", "write_key_lengths"]

KEY_LENGTHS = "key_lengths"
"""The name of the ``arrays`` row of key lengths."""
_DTYPES = ("<u1", "<u2", "<u4", "<u8")


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """Every sample's key, ``blob[starts[i]:ends[i]]``: its raw bytes (as
    :attr:`ShardArrays.key_blob <indextar.index.arrays.ShardArrays.key_blob>`); and the
    shard's member extensions."""

    blob: bytes
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    ext_names: tuple[str, ...]

    @classmethod
    def of(cls, arrays: ShardArrays) -> ShardKeys:
        """The keys of loaded arrays."""
        return cls(arrays.key_blob, arrays.samples[:, 4], arrays.samples[:, 5], arrays.ext_names)


def write_key_lengths(conn: sqlite3.Connection, arrays: ShardArrays) -> None:
    """Insert the ``key_lengths`` row of ``arrays`` (inside the caller's transaction)."""
    lengths = arrays.samples[:, 5] - arrays.samples[:, 4]
    top = int(lengths.max()) if lengths.size else 0
    dtype = next(d for d in _DTYPES if top >> (8 * np.dtype(d).itemsize - 1) <= 1)
    conn.execute(
        "INSERT INTO arrays VALUES (?, ?, ?, ?)",
        (KEY_LENGTHS, dtype, "", lengths.astype(dtype).tobytes()),
    )


def read_keys(
    conn: sqlite3.Connection, path: Path, num_samples: int, num_members: int
) -> ShardKeys | None:
    """The keys, from the ``keys`` and ``key_lengths`` rows alone (from all the arrays
    where the index has no ``key_lengths``); ``None`` where it has no arrays of this
    layout.

    Raises
    ------
    IndexFormatError
        If the key lengths disagree with the sample count or the keys' size.
    """
    try:
        rows = conn.execute(
            "SELECT name, dtype, data FROM arrays WHERE name IN ('keys', 'exts', ?)",
            (KEY_LENGTHS,),
        ).fetchall()
    except sqlite3.OperationalError:  # no arrays table
        return None
    stored = {str(name): (str(dtype), data) for name, dtype, data in rows}
    dtype, data = stored.get(KEY_LENGTHS, ("", b""))
    layout = (stored.get("keys", ("",))[0], stored.get("exts", ("",))[0])
    if dtype not in _DTYPES or layout != ("utf-8", "json"):
        arrays = read_arrays(conn, path, num_samples, num_members)
        return None if arrays is None else ShardKeys.of(arrays)
    blob = bytes(stored["keys"][1])
    lengths = np.frombuffer(data, dtype)
    ends = np.cumsum(lengths, dtype=np.int64)
    total = int(ends[-1]) if ends.size else 0
    if ends.size != num_samples or total != len(blob):
        raise IndexFormatError(
            f"index {str(path)!r} has {ends.size} key lengths of {total} bytes in all; its meta "
            f"says {num_samples} samples and its keys take {len(blob)} bytes "
            "(rebuild it with build_index(shard, force=True))"
        )
    return ShardKeys(blob, ends - lengths, ends, tuple(json.loads(stored["exts"][1])))
