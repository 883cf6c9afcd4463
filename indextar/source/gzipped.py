"""A single-stream ``.tar.gz`` read at uncompressed offsets, from seek points.

A gzip stream can only be decompressed from its start, unless the decompressor is
given a *seek point*: a position in the compressed stream (a byte and a bit), the
uncompressed offset it corresponds to, and the 32 KiB of uncompressed data before it
(deflate's window). The index stores one about every ``spacing`` uncompressed bytes
(1 MiB by default), so a read decompresses at most that much before its first byte.

:class:`SeekPoints` is the stored form; ``indexed_gzip`` (zlib's ``zran``) does the
decompression, with the points imported in its own index format, which
:meth:`SeekPoints.zran_index` writes. An index build places the points with
``_gunzip.c`` as it decompresses and checks the file, by zran's rule, or where that is
not built, with zran itself (:func:`build_seek_points`).
"""

from __future__ import annotations

import io
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ShardFormatError, TruncatedShardError
from . import base
from .base import ByteSource, outside_error
from .codecs import indexed_gzip

__all__ = ["SeekPoints", "GzipSeekSource", "build_seek_points"]

WINDOW = 32768
MIN_SPACING = 2 * WINDOW  # zran needs points further apart than a window
_ZRAN_ID = b"GZIDX"
_ZRAN_HEADER = struct.Struct("<5sBBQQIII")
_ZRAN_POINT = struct.Struct("<QQBB")
# What zran reads ahead: its defaults (16 MiB of buffer) would decompress 16 MiB per
# seek; 64 KiB keeps a sample-sized read at about one spacing of work (measured: 0.9 ms
# a 20 KB read at 1 MiB spacing, against 6.4 ms with the defaults).
_BUFFER = 64 * 1024
READ_AHEAD = 1 << 20


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
    ) -> SeekPoints:
        """The points ``_gunzip.c`` placed while it decompressed the whole file into
        ``data``: ``(compressed_offset, bits, uncompressed_offset, has_window)`` rows, each
        window the 32 KiB of ``data`` before its point. The point zran adds at the end of
        the file is added too, so that the index is the one zran would export."""
        if rows:
            rows = [*rows, (compressed_size, 0, len(data), 1)]
        points = np.array([row[:3] for row in rows], np.int64).reshape(-1, 3)
        windows = tuple(
            zlib.compress(_window(data, offset), 1) if has_window else b""
            for _, _, offset, has_window in rows
        )
        return cls(compressed_size, len(data), spacing, points, windows)


def _window(data: bytearray, offset: int) -> bytes:
    """The :data:`WINDOW` bytes of ``data`` before ``offset``, zero-filled before its
    start as zran's are (only the end-of-file point of a file under 32 KiB has any)."""
    if offset >= WINDOW:
        return bytes(data[offset - WINDOW : offset])
    return bytes(WINDOW - offset) + bytes(data[:offset])


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
        path, spacing=max(spacing, MIN_SPACING), buffer_size=_BUFFER, readbuf_size=_BUFFER
    ) as f:
        f.build_full_index()
        exported = io.BytesIO()
        f.export_index(fileobj=exported)
    return SeekPoints.from_zran_index(exported.getvalue())


class _RawFile(io.RawIOBase):
    """A read-only, seekable file over a :class:`ByteSource`, for zran (remote shards)."""

    def __init__(self, source: ByteSource):
        self._source = source
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        size = self._source.size
        self._pos = {0: offset, 1: self._pos + offset, 2: size + offset}[whence]
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        length = min(len(buffer), max(0, self._source.size - self._pos))
        if length:
            buffer[:length] = self._source.read(self._pos, length)
        self._pos += length
        return length


class GzipSeekSource(ByteSource):
    """The uncompressed bytes of a single-stream gzip shard, read from seek points.

    Parameters
    ----------
    raw
        The compressed file (local or remote).
    points
        Its seek points, from its index.
    local_path
        The file's path when it is local: zran then reads it itself, not through
        ``raw``.
    """

    def __init__(self, raw: ByteSource, points: SeekPoints, *, local_path: str | None = None):
        self.url = raw.url
        self.raw = raw
        self.points = points
        self.local_path = local_path
        self._file: Any = None
        self._generation = -1
        self._lock = threading.Lock()
        # Reads in order (sample after sample) are served from one read-ahead block.
        self._ahead = b""
        self._ahead_at = -1
        self._last_end = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_file=None, _generation=-1, _lock=None, _ahead=b"", _ahead_at=-1)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return self.points.uncompressed_size

    def _open(self) -> Any:
        module = indexed_gzip()
        if self.local_path is not None:
            f = module.IndexedGzipFile(
                self.local_path, drop_handles=False, buffer_size=_BUFFER, readbuf_size=_BUFFER
            )
        else:
            f = module.IndexedGzipFile(
                fileobj=_RawFile(self.raw), buffer_size=_BUFFER, readbuf_size=_BUFFER
            )
        try:
            f.import_index(fileobj=io.BytesIO(self.points.zran_index()))
        except Exception as e:
            f.close()
            raise ShardFormatError(
                f"the index's seek points do not fit the gzip file ({e}); rebuild the index "
                "with build_index(shard, force=True)",
                shard=self.url,
            ) from e
        self._file, self._generation = f, base._fork_generation
        return f

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.points.uncompressed_size:
            raise outside_error(self.url, offset, length, self.points.uncompressed_size)
        with self._lock:
            at = offset - self._ahead_at
            if self._ahead_at >= 0 and at >= 0 and at + length <= len(self._ahead):
                self._last_end = offset + length
                return self._ahead[at : at + length]
            f = self._file
            if f is None or self._generation != base._fork_generation:
                f = self._open()
            # A read that starts where the last one ended (the next sample) reads ahead:
            # zran's small reads each cost a restart, a block of them one.
            in_order = offset == self._last_end
            want = max(length, READ_AHEAD) if in_order else length
            want = min(want, self.points.uncompressed_size - offset)
            try:
                self._move_to(f, offset)
                data: bytes = f.read(want)
            except Exception as e:  # zran's ZranError and its IOErrors
                raise ShardFormatError(
                    f"cannot decompress {length} bytes at uncompressed offset {offset} ({e})",
                    shard=self.url,
                    offset=offset,
                ) from e
            if in_order:
                self._ahead, self._ahead_at = data, offset
                data = data[:length]
            self._last_end = offset + length
        if len(data) != length:
            raise TruncatedShardError(
                f"the gzip stream gave {len(data)} of {length} bytes at uncompressed offset "
                f"{offset}",
                shard=self.url,
                offset=offset,
            )
        return data

    def _move_to(self, f: Any, offset: int) -> None:
        """Seek ``f`` to ``offset``: by reading on where the stream already is between the
        seek point before ``offset`` and ``offset`` (a shard read in order decompresses
        each byte once), else from that seek point (zran's seek)."""
        here = f.tell()
        if here <= offset:
            starts = self.points.points[:, 2]
            before = int(starts[int(starts.searchsorted(offset, "right")) - 1])
            if here >= before:
                while here < offset:  # in pieces: at most one spacing, held briefly
                    skipped = len(f.read(min(offset - here, 1 << 20)))
                    if not skipped:
                        break
                    here += skipped
                return
        f.seek(offset)

    def close(self) -> None:
        f, self._file = self._file, None
        if f is not None and self._generation == base._fork_generation:
            f.close()
        self.raw.close()
