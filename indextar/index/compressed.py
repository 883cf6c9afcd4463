"""What the index of a compressed shard adds: its frames or its seek points (format 3).

Every offset in ``members`` and ``samples`` is an offset into the **uncompressed** tar;
these tables map them onto the compressed file:

* ``frames``: a shard of independent gzip members or zstd frames (a per-sample shard
  from ``ShardWriter(compress=...)``, a multi-frame ``.tar.zst``): each frame's
  compressed and uncompressed span. A read decompresses the frames that cover it.
* ``seek_points``: a single-stream ``.tar.gz`` (``tar czf``): zran's seek points, each
  a compressed offset and bit, an uncompressed offset and a 32 KiB window. A read
  decompresses from the last point before it.

``meta`` says which: ``compression`` (``gzip`` or ``zstd``; empty for a plain tar) and
``seek_spacing`` (0 for frames).
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import IndexFormatError
from ..source.base import ByteSource
from ..source.frames import FramedSource
from ..source.gzipped import GzipSeekSource
from ..source.seekpoints import SeekPoints
from .meta import IndexMeta, connect_readonly

__all__ = ["CompressedLayout", "decompressing_source", "read_layout"]


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

    def write(self, conn: sqlite3.Connection) -> None:
        """Insert the frames or seek points (inside the caller's transaction)."""
        if self.frames is not None:
            conn.executemany(
                "INSERT INTO frames VALUES (?, ?, ?, ?, ?)",
                ((n, *row) for n, row in enumerate(self.frames.tolist())),
            )
        if self.seek_points is not None:
            conn.executemany(
                "INSERT INTO seek_points VALUES (?, ?, ?, ?, ?)",
                (
                    (n, c_offset, bits, u_offset, window or None)
                    for n, ((c_offset, bits, u_offset), window) in enumerate(
                        zip(self.seek_points.points.tolist(), self.seek_points.windows)
                    )
                ),
            )

    def index_bytes(self) -> int:
        """What the frames or seek points take in the index, roughly (8 bytes a number)."""
        if self.frames is not None:
            return int(self.frames.size) * 8
        assert self.seek_points is not None
        points = self.seek_points
        return int(points.points.size) * 8 + sum(map(len, points.windows))


def read_layout(path: Path, meta: IndexMeta) -> CompressedLayout:
    """The frames or seek points of the compressed shard that the index ``path`` describes."""
    try:
        with contextlib.closing(connect_readonly(path)) as conn:
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
    return CompressedLayout(meta.compression, frames=np.array(rows, np.int64).reshape(-1, 4))


def decompressing_source(
    path: Path, meta: IndexMeta, raw: ByteSource, *, local_path: str | None = None
) -> ByteSource:
    """``raw`` itself for a plain shard; for a compressed one, a source of its
    uncompressed bytes, which the index at ``path`` maps onto ``raw``."""
    if not meta.compression:
        return raw
    layout = read_layout(path, meta)
    if layout.seek_points is not None:
        return GzipSeekSource(raw, layout.seek_points, local_path=local_path)
    assert layout.frames is not None
    return FramedSource(raw, layout.codec, layout.frames)
