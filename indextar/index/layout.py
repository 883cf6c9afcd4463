"""A compressed shard's layout, stored in its index beside its arrays (format 3).

Random access into a compressed shard needs, besides its arrays
(:mod:`~indextar.index.arrays`, offsets into the uncompressed tar), how those
uncompressed offsets map onto its file, which a reader reads at the same open:

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
import sqlite3
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
from .arrays import connect_readonly

__all__ = ["LayoutMeta", "CompressedLayout", "decompressed", "read_layout", "layout_from"]


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
