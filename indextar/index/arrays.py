"""The reader's arrays of one shard, stored in its index as packed numpy blobs.

Random access needs, per sample, its byte span, its members and its key. The
``members`` and ``samples`` tables say all of it, but turning their rows into arrays
costs milliseconds per shard, more than reading the shard's samples does. So the
index also stores those arrays, derived from the same grouping in the same
transaction, in the ``arrays`` table (see ``schema.sql``): opening a shard is then one
``SELECT`` and a ``np.frombuffer`` per array. The tables stay the inspectable truth;
:func:`~indextar.verify_index` checks that the arrays agree with them, and an index
without the ``arrays`` table is read from its tables (:func:`arrays_from_tables`).

A compressed shard's index adds how those uncompressed offsets map onto its file,
which a reader reads at the same open (format 3):

* ``frames``: a shard of independent gzip members or zstd frames (a per-sample shard
  from ``ShardWriter(compress=...)``, a multi-frame ``.tar.zst``): each frame's
  compressed and uncompressed span. A read decompresses the frames that cover it.
* ``seek_points``: a single-stream ``.tar.gz`` (``tar czf``): zran's seek points, each
  a compressed offset and bit, an uncompressed offset and a 32 KiB window. A read
  decompresses from the last point before it.

``meta`` says which: ``compression`` (``gzip`` or ``zstd``; empty for a plain tar) and
``seek_spacing`` (0 for frames). :func:`decompressed` wraps the shard's raw bytes in
the source that decompresses them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import sqlite3
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..errors import IndexFormatError
from ..source.base import ByteSource
from ..source.frames import FramedSource
from ..source.gzipped import GzipSeekSource
from ..source.seekpoints import SeekPoints
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
    "LayoutMeta",
    "CompressedLayout",
    "decompressed",
    "read_layout",
    "layout_from",
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


# -- a compressed shard's frames or seek points ---------------------------------


class LayoutMeta(Protocol):
    """What the layout's checks read of an index's ``meta``
    (:class:`~indextar.index.meta.IndexMeta`)."""

    @property
    def compression(self) -> str: ...
    @property
    def seek_spacing(self) -> int: ...
    @property
    def shard_size(self) -> int: ...
    @property
    def uncompressed_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class CompressedLayout:
    """How a compressed shard's uncompressed offsets map onto its file: ``frames``
    ``(compressed_offset, compressed_size, uncompressed_offset, uncompressed_size)``
    rows, or ``seek_points`` (exactly one of the two)."""

    codec: str
    frames: npt.NDArray[np.int64] | None = None
    seek_points: SeekPoints | None = None

    @property
    def seek_spacing(self) -> int:
        """``meta.seek_spacing``: the seek points' spacing; 0 for a shard read by frames."""
        return self.seek_points.spacing if self.seek_points is not None else 0

    def index_bytes(self) -> int:
        """What the frames or seek points take in the index, roughly (8 bytes a number)."""
        if self.frames is not None:
            return int(self.frames.size) * 8
        assert self.seek_points is not None
        points = self.seek_points
        return int(points.points.size) * 8 + sum(map(len, points.windows))


def read_layout(path: Path, meta: LayoutMeta) -> CompressedLayout:
    """The frames or seek points of the compressed shard that the index ``path`` describes."""
    with contextlib.closing(connect_readonly(path)) as conn:
        return layout_from(conn, path, meta)


def layout_from(conn: sqlite3.Connection, path: Path, meta: LayoutMeta) -> CompressedLayout:
    """:func:`read_layout` through ``conn``, a connection to the index at ``path``."""
    try:
        if meta.seek_spacing:
            rows = conn.execute(
                "SELECT compressed_offset, bits, uncompressed_offset, window "
                "FROM seek_points ORDER BY point_id"
            ).fetchall()
            points = SeekPoints(
                compressed_size=meta.shard_size,
                uncompressed_size=meta.uncompressed_size,
                spacing=meta.seek_spacing,
                points=np.array([row[:3] for row in rows], np.int64).reshape(-1, 3),
                windows=tuple(bytes(row[3] or b"") for row in rows),
            )
            _check_layout(path, meta, points.points, _POINT_RULES)
            return CompressedLayout(meta.compression, seek_points=points)
        rows = conn.execute(
            "SELECT compressed_offset, compressed_size, uncompressed_offset, "
            "uncompressed_size FROM frames ORDER BY frame_id"
        ).fetchall()
    except sqlite3.DatabaseError as e:
        raise IndexFormatError(
            f"index {str(path)!r} of a {meta.compression} shard has no readable frames or "
            f"seek points ({e}); rebuild it with build_index(shard, force=True)"
        ) from e
    if not rows:
        raise IndexFormatError(
            f"index {str(path)!r} of a {meta.compression} shard records no frames; rebuild it "
            "with build_index(shard, force=True)"
        )
    frames = np.array(rows, np.int64).reshape(-1, 4)
    _check_layout(path, meta, frames, _FRAME_RULES)
    return CompressedLayout(meta.compression, frames=frames)


# What a table read back must satisfy, else the index is corrupt: each rule a name and
# a test of the rows (as written, they always hold; reads rely on them).
_FRAME_RULES: tuple[tuple[str, Any], ...] = (
    ("sizes are positive", lambda f, m: (f[:, 1] > 0).all() and (f[:, 3] > 0).all()),
    ("frames follow each other", lambda f, m: (f[1:, 0] >= f[:-1, 0] + f[:-1, 1]).all()),
    ("the tar is covered in order", lambda f, m: (f[1:, 2] == f[:-1, 2] + f[:-1, 3]).all()),
    ("the tar starts at 0", lambda f, m: f[0, 2] == 0),
    (
        "frames lie inside the file",
        lambda f, m: f[0, 0] >= 0 and f[-1, 0] + f[-1, 1] <= m.shard_size,
    ),
)
_POINT_RULES: tuple[tuple[str, Any], ...] = (
    ("bits are 0 to 7", lambda p, m: ((p[:, 1] >= 0) & (p[:, 1] <= 7)).all()),
    ("points increase", lambda p, m: (np.diff(p[:, 0]) > 0).all() and (np.diff(p[:, 2]) > 0).all()),
    (
        "points lie inside the file",
        lambda p, m: (p[:, 0] >= 1).all() and (p[:, 0] <= m.shard_size).all(),
    ),
    (
        "points lie inside the tar",
        lambda p, m: (p[:, 2] >= 0).all() and (p[:, 2] <= m.uncompressed_size).all(),
    ),
)


def _check_layout(path: Path, meta: LayoutMeta, rows: npt.NDArray[np.int64], rules: Any) -> None:
    """Raise ``IndexFormatError`` naming the rule the frames or seek points break."""
    if not len(rows):
        return
    with np.errstate(over="ignore"):
        broken = [name for name, holds in rules if not holds(rows, meta)]
    if broken:
        raise IndexFormatError(
            f"index {str(path)!r} of a {meta.compression} shard is corrupt: not all its "
            f"{'seek points' if rows.shape[1] == 3 else 'frames'} hold ({broken[0]}); "
            "rebuild it with build_index(shard, force=True)"
        )


def decompressed(
    raw: ByteSource, layout: CompressedLayout, *, local_path: str | None = None
) -> ByteSource:
    """A source of the uncompressed bytes of ``raw``, a compressed shard of ``layout``
    (``local_path``: the file ``raw`` reads, if local)."""
    if layout.seek_points is not None:
        return GzipSeekSource(raw, layout.seek_points, local_path=local_path)
    assert layout.frames is not None
    return FramedSource(raw, layout.codec, layout.frames)
