"""The reader's arrays of one shard, stored in its index as packed numpy blobs.

Random access needs, per sample, its byte span, its members and its key. The
``members`` and ``samples`` tables say all of it, but turning their rows into arrays
costs milliseconds per shard, more than reading the shard's samples does. So the
index also stores those arrays, derived from the same grouping in the same
transaction, in the ``arrays`` table (see ``schema.sql``): opening a shard is then one
``SELECT`` and a ``np.frombuffer`` per array. The tables stay the inspectable truth;
:func:`~indextar.verify_index` checks that the arrays agree with them, and an index
without the ``arrays`` table is read from its tables (:func:`arrays_from_tables`).
A compressed shard's frames or seek points are in :mod:`~indextar.index.layout`.
"""

from __future__ import annotations

import itertools
import json
import logging
import sqlite3
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import IndexFormatError
from .naming import from_sql

__all__ = [
    "SAMPLE_COLUMNS",
    "MEMBER_COLUMNS",
    "ShardArrays",
    "read_arrays",
    "arrays_from_tables",
    "arrays_from",
    "write_arrays",
    "connect_readonly",
]

log = logging.getLogger(__name__)

SAMPLE_COLUMNS = (
    "start_offset",
    "end_offset",
    "first_member",
    "member_count",
    "key_start",
    "key_end",
)
MEMBER_COLUMNS = ("span_offset", "size", "ext_code")
_INT = "<i8"


@dataclass(frozen=True, slots=True)
class ShardArrays:
    """What random access reads of one shard, in flat arrays.

    Attributes
    ----------
    samples
        ``(num_samples, 6)`` int64, columns :data:`SAMPLE_COLUMNS`.
    members
        ``(num_members, 3)`` int64, columns :data:`MEMBER_COLUMNS`; ``span_offset`` is
        the member's data offset minus its sample's ``start_offset``.
    key_blob
        Every sample's key, concatenated; sample ``i`` is
        ``key_blob[key_start[i]:key_end[i]]``. These are the key's raw bytes, as in the
        tar header: ``key.encode("utf-8", "surrogateescape")``, and a reader's key is
        ``.decode("utf-8", "surrogateescape")`` of them.
    ext_names
        Extension of each ``ext_code``, sorted.
    checksums
        Each sample's checksum (:mod:`indextar.index.checksums`), where the index
        recorded them; else ``None``.
    """

    samples: npt.NDArray[np.int64]
    members: npt.NDArray[np.int64]
    key_blob: bytes
    ext_names: tuple[str, ...]
    checksums: npt.NDArray[np.uint64] | None = None

    @classmethod
    def make(
        cls,
        *,
        start_offset: npt.NDArray[np.int64],
        end_offset: npt.NDArray[np.int64],
        first_member: npt.NDArray[np.int64],
        member_count: npt.NDArray[np.int64],
        keys: Sequence[str],
        data_offset: npt.NDArray[np.int64],
        size: npt.NDArray[np.int64],
        ext_code: npt.NDArray[np.int64],
        ext_names: Sequence[str],
        checksums: npt.NDArray[np.uint64] | None = None,
    ) -> ShardArrays:
        """Pack per-sample and per-member columns; ``ext_code`` indexes the sorted ``ext_names``."""
        # Raw bytes: a key read from a name that is not UTF-8 keeps its bytes (docs/format.md).
        key_blob = "".join(keys).encode("utf-8", "surrogateescape")
        key_length = np.fromiter(map(len, keys), np.int64, len(keys))
        if len(key_blob) != int(key_length.sum()):  # not all ASCII: lengths in bytes
            key_length = np.fromiter(
                (len(key.encode("utf-8", "surrogateescape")) for key in keys), np.int64, len(keys)
            )
        samples = np.empty((len(keys), len(SAMPLE_COLUMNS)), np.int64)
        samples[:, 0] = start_offset
        samples[:, 1] = end_offset
        samples[:, 2] = first_member
        samples[:, 3] = member_count
        np.cumsum(key_length, out=samples[:, 5])
        samples[:, 4] = samples[:, 5] - key_length
        members = np.empty((len(data_offset), len(MEMBER_COLUMNS)), np.int64)
        members[:, 0] = data_offset - np.repeat(samples[:, 0], samples[:, 3])
        members[:, 1] = size
        members[:, 2] = ext_code
        return cls(
            samples=samples,
            members=members,
            key_blob=key_blob,
            ext_names=tuple(ext_names),
            checksums=checksums,
        )

    def equals(self, other: ShardArrays) -> bool:
        """Whether both hold the same values (``==`` on arrays is elementwise)."""
        return (
            np.array_equal(self.samples, other.samples)
            and np.array_equal(self.members, other.members)
            and self.key_blob == other.key_blob
            and self.ext_names == other.ext_names
        )


def arrays_from(
    conn: sqlite3.Connection, path: Path, num_samples: int, num_members: int
) -> ShardArrays:
    """The arrays random access reads, through ``conn`` to the index at ``path``: those
    stored (:func:`read_arrays`), else made from its tables."""
    arrays = read_arrays(conn, path, num_samples, num_members)
    return arrays if arrays is not None else arrays_from_tables(conn)


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection to the index at ``path``."""
    # immutable=1: index files are replaced, never modified in place, so SQLite
    # may skip locking; this also works on read-only filesystems.
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True)


# name -> (dtype, columns) of each row of the arrays table.
_LAYOUT = {
    "samples": (_INT, ",".join(SAMPLE_COLUMNS)),
    "members": (_INT, ",".join(MEMBER_COLUMNS)),
    "keys": ("utf-8", ""),
    "exts": ("json", ""),
}
# An optional row: each sample's checksum, where the index recorded them.
_CHECKSUMS = ("checksums", "<u8", "")
# The rows read_arrays reads: not key_lengths, which only a join reads (keyblob.read_keys).
_READ_ROWS = (*_LAYOUT, _CHECKSUMS[0])


def write_arrays(conn: sqlite3.Connection, arrays: ShardArrays) -> None:
    """Insert the arrays (inside the caller's transaction)."""
    data = {
        "samples": arrays.samples.astype(_INT, copy=False).tobytes(),
        "members": arrays.members.astype(_INT, copy=False).tobytes(),
        "keys": arrays.key_blob,
        "exts": json.dumps(list(arrays.ext_names)).encode(),
    }
    conn.executemany(
        "INSERT INTO arrays VALUES (?, ?, ?, ?)",
        ((name, dtype, columns, data[name]) for name, (dtype, columns) in _LAYOUT.items()),
    )
    if arrays.checksums is not None:
        conn.execute(
            "INSERT INTO arrays VALUES (?, ?, ?, ?)",
            (*_CHECKSUMS, arrays.checksums.astype(_CHECKSUMS[1], copy=False).tobytes()),
        )


def read_arrays(
    conn: sqlite3.Connection, path: Path, num_samples: int, num_members: int
) -> ShardArrays | None:
    """The stored arrays; ``None`` if the index has none or another layout of them.

    Raises
    ------
    IndexFormatError
        If the arrays' sizes disagree with the index's sample and member counts.
    """
    try:
        marks = ", ".join("?" * len(_READ_ROWS))
        sql = f"SELECT name, dtype, columns, data FROM arrays WHERE name IN ({marks})"
        rows = conn.execute(sql, _READ_ROWS).fetchall()
    except sqlite3.OperationalError:  # no arrays table
        return None
    stored = {str(name): (dtype, columns, data) for name, dtype, columns, data in rows}
    if {name: stored[name][:2] for name in _LAYOUT if name in stored} != _LAYOUT:
        log.debug("index %s has no arrays of this layout; reading its tables", path)
        return None
    samples = np.frombuffer(stored["samples"][2], _INT)
    members = np.frombuffer(stored["members"][2], _INT)
    got = (len(samples) // len(SAMPLE_COLUMNS), len(members) // len(MEMBER_COLUMNS))
    if (len(samples), len(members)) != (
        num_samples * len(SAMPLE_COLUMNS),
        num_members * len(MEMBER_COLUMNS),
    ):
        raise IndexFormatError(
            f"index {str(path)!r} has arrays of {got[0]} samples and {got[1]} members; its meta "
            f"says {num_samples} and {num_members} (rebuild it with build_index(shard, force=True))"
        )
    return ShardArrays(
        samples=samples.reshape(num_samples, len(SAMPLE_COLUMNS)).astype(np.int64, copy=False),
        members=members.reshape(num_members, len(MEMBER_COLUMNS)).astype(np.int64, copy=False),
        key_blob=bytes(stored["keys"][2]),
        ext_names=tuple(json.loads(stored["exts"][2])),
        checksums=_stored_checksums(stored, path, num_samples),
    )


def _stored_checksums(
    stored: dict[str, tuple[str, str, bytes]], path: Path, num_samples: int
) -> npt.NDArray[np.uint64] | None:
    """The ``checksums`` row, if the index has one."""
    name, dtype, _ = _CHECKSUMS
    if name not in stored:
        return None
    if stored[name][0] != dtype or len(stored[name][2]) != 8 * num_samples:
        raise IndexFormatError(
            f"index {str(path)!r} has a checksums array of {len(stored[name][2])} bytes of "
            f"{stored[name][0]!r}; its meta says {num_samples} samples "
            "(rebuild it with build_index(shard, force=True))"
        )
    return np.frombuffer(stored[name][2], dtype).astype(np.uint64, copy=False)


def arrays_from_tables(conn: sqlite3.Connection) -> ShardArrays:
    """The arrays, derived from the ``samples`` and ``members`` rows (milliseconds per shard).

    Rows come back as plain int tuples (extensions mapped to codes in SQL), which numpy
    converts in one call per table.
    """
    rows = conn.execute(
        "SELECT start_offset, end_offset, first_member, member_count, key, raw_key "
        "FROM samples ORDER BY sample_id"
    ).fetchall()
    ext_names = tuple(
        str(r[0]) for r in conn.execute("SELECT DISTINCT ext FROM members ORDER BY ext")
    )
    code = " ".join(f"WHEN ? THEN {n}" for n in range(len(ext_names)))
    member_rows = conn.execute(
        f"SELECT data_offset, size, CASE ext {code} END FROM members ORDER BY member_id"
        if ext_names
        else "SELECT data_offset, size, 0 FROM members",
        ext_names,
    ).fetchall()
    # fromiter over the flattened rows: twice as fast as np.array on a list of tuples.
    sample_columns = np.fromiter(
        itertools.chain.from_iterable(row[:4] for row in rows), np.int64, 4 * len(rows)
    ).reshape(-1, 4)
    member_columns = np.fromiter(
        itertools.chain.from_iterable(member_rows), np.int64, 3 * len(member_rows)
    ).reshape(-1, 3)
    return ShardArrays.make(
        start_offset=sample_columns[:, 0],
        end_offset=sample_columns[:, 1],
        first_member=sample_columns[:, 2],
        member_count=sample_columns[:, 3],
        keys=[from_sql(row[4], row[5]) for row in rows],
        data_offset=member_columns[:, 0],
        size=member_columns[:, 1],
        ext_code=member_columns[:, 2],
        ext_names=ext_names,
    )
