"""The seek points of a single-stream gzip file: their stored form, and zran's.

A gzip stream can only be decompressed from its start, unless the decompressor is
given a *seek point*: a position in the compressed stream (a byte and a bit), the
uncompressed offset it corresponds to, and the 32 KiB of uncompressed data before it
(deflate's window). :class:`SeekPoints` holds them in the points and windows
``indexed_gzip`` (zlib's ``zran``) exports (:meth:`SeekPoints.zran_index`). An index
build places them with ``_gunzip.c`` as it decompresses and checks the file, by zran's
rule, and keeps only the window bytes a read can use
(:meth:`SeekPoints.from_decompressed`); where that is not built, zran places them
(:func:`build_seek_points`). :mod:`~indextar.source.gzipped` reads from them.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import extensions
from .codecs import indexed_gzip

__all__ = ["SeekPoints", "build_seek_points", "WINDOW", "MIN_SPACING", "ZRAN_BUFFER"]

WINDOW = 32768
MIN_SPACING = 2 * WINDOW  # zran needs points further apart than a window
_ZRAN_ID = b"GZIDX"
_ZRAN_HEADER = struct.Struct("<5sBBQQIII")
_ZRAN_POINT = struct.Struct("<QQBB")
# What zran reads ahead: its defaults (16 MiB of buffer) would decompress 16 MiB per
# seek; 64 KiB keeps a sample-sized read at about one spacing of work (measured: 0.9 ms
# a 20 KB read at 1 MiB spacing, against 6.4 ms with the defaults).
ZRAN_BUFFER = 64 * 1024


@dataclass(frozen=True, slots=True)
class SeekPoints:
    """The seek points of one gzip file.

    ``points`` has one row per point: ``(compressed_offset, bits, uncompressed_offset)``;
    ``windows[i]`` is point ``i``'s 32 KiB window, zlib-compressed (``b""`` where the
    point needs none: the start of a gzip member).
    """

    compressed_size: int
    uncompressed_size: int
    spacing: int
    points: npt.NDArray[np.int64]
    windows: tuple[bytes, ...]

    def zran_index(self) -> bytes:
        """The points in ``indexed_gzip``'s index file format (version 1)."""
        out = io.BytesIO()
        out.write(
            _ZRAN_HEADER.pack(
                _ZRAN_ID, 1, 0, self.compressed_size, self.uncompressed_size,
                self.spacing, WINDOW, len(self.points),
            )
        )  # fmt: skip
        for (c_offset, bits, u_offset), window in zip(self.points.tolist(), self.windows):
            out.write(_ZRAN_POINT.pack(c_offset, u_offset, bits, 1 if window else 0))
        for window in self.windows:
            if window:
                out.write(zlib.decompress(window))
        return out.getvalue()

    def windows_agree(self, fresh: SeekPoints) -> bool:
        """Whether these windows hold what ``fresh``'s (just computed, sparse) ones do:
        the same, or, for an index written before windows were sparse, whole windows
        that agree with them at every byte they keep."""
        if len(self.windows) != len(fresh.windows):
            return False
        for mine, theirs in zip(self.windows, fresh.windows):
            if mine == theirs:
                continue
            if not mine or not theirs:
                return False
            whole = np.frombuffer(zlib.decompress(mine), np.uint8)
            kept = np.frombuffer(zlib.decompress(theirs), np.uint8)
            if len(whole) != WINDOW or not np.array_equal(whole[kept != 0], kept[kept != 0]):
                return False
        return True

    @classmethod
    def from_zran_index(cls, blob: bytes) -> SeekPoints:
        """Read ``indexed_gzip``'s exported index (version 1): its points and windows."""
        ident, _version, _, c_size, u_size, spacing, window, count = _ZRAN_HEADER.unpack_from(blob)
        if ident != _ZRAN_ID or window != WINDOW:
            raise ValueError(f"not a zran index of {WINDOW}-byte windows ({ident!r}, {window})")
        pos = _ZRAN_HEADER.size
        rows, has_window = [], []
        for _ in range(count):
            c_offset, u_offset, bits, flag = _ZRAN_POINT.unpack_from(blob, pos)
            pos += _ZRAN_POINT.size
            rows.append((c_offset, bits, u_offset))
            has_window.append(flag)
        windows = []
        for flag in has_window:
            if flag:
                windows.append(zlib.compress(blob[pos : pos + WINDOW], 1))
                pos += WINDOW
            else:
                windows.append(b"")
        points = np.array(rows, np.int64).reshape(-1, 3)
        return cls(c_size, u_size, spacing, points, tuple(windows))

    @classmethod
    def from_decompressed(
        cls,
        rows: list[tuple[int, int, int, int]],
        data: bytearray,
        *,
        compressed_size: int,
        spacing: int,
        made: list[bytes],
        compressed: Any,
    ) -> SeekPoints:
        """The points ``_gunzip.c`` placed while it decompressed the whole file into
        ``data``: ``(compressed_offset, bits, uncompressed_offset, has_window)`` rows. The
        point zran adds at the end of the file is added too, so that the points are the
        ones zran would export.

        ``made`` are the windows ``_gunzip.c`` made as it went (one per row with
        ``has_window``): sparse, keeping only the bytes that decompression from the point
        can reference, the rest zero, so that zlib reads exactly as with the whole window
        and a window takes about 2 KB in the index instead of 20 KB (the bench's JPEG
        tar). The end point's is made here from the ``compressed`` file.
        """
        if not rows:
            return cls(compressed_size, len(data), spacing, np.zeros((0, 3), np.int64), ())
        gunzip = extensions.gunzip()
        assert gunzip is not None  # it placed the rows
        rows = [*rows, (compressed_size, 0, len(data), 1)]
        points = np.array([row[:3] for row in rows], np.int64)
        kept = iter([*made, *gunzip.sparse_windows(compressed, data, [rows[-1][:3]], 1)])
        windows = tuple(next(kept) if row[3] else b"" for row in rows)
        return cls(compressed_size, len(data), spacing, points, windows)


def build_seek_points(path: str, *, spacing: int) -> SeekPoints:
    """Seek points every ``spacing`` uncompressed bytes (at least :data:`MIN_SPACING`)
    of the local gzip file ``path``.

    zran does not notice a truncated file: the caller checks the stream
    (:mod:`indextar.index.decompress` decompresses it with :mod:`zlib`). Where
    ``_gunzip.c`` is built, the build does both in one pass instead
    (:meth:`SeekPoints.from_decompressed`).
    """
    module = indexed_gzip()
    with module.IndexedGzipFile(
        path, spacing=max(spacing, MIN_SPACING), buffer_size=ZRAN_BUFFER, readbuf_size=ZRAN_BUFFER
    ) as f:
        f.build_full_index()
        exported = io.BytesIO()
        f.export_index(fileobj=exported)
    return SeekPoints.from_zran_index(exported.getvalue())
