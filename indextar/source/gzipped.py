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

import bisect
import io
import itertools
import struct
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import native
from ..errors import ShardFormatError, TruncatedShardError
from . import base
from .base import ByteSource, outside_error
from .codecs import indexed_gzip
from .spancache import SPAN_CACHE, SpanCache

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
_tokens = itertools.count()  # one per source object: its spans' key in the cache


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
        compressed: Any = None,
    ) -> SeekPoints:
        """The points ``_gunzip.c`` placed while it decompressed the whole file into
        ``data``: ``(compressed_offset, bits, uncompressed_offset, has_window)`` rows, each
        window the 32 KiB of ``data`` before its point. The point zran adds at the end of
        the file is added too, so that the index is the one zran would export.

        Given the ``compressed`` file too, each window keeps only the bytes that
        decompression from its point can reference, the rest zero (``_gunzip.c``'s
        ``sparse_windows``): zlib reads exactly as with the whole window, and a window
        takes about 2 KB in the index instead of 20 KB (1 MiB spacing, the bench's
        JPEG tar).
        """
        if rows:
            rows = [*rows, (compressed_size, 0, len(data), 1)]
        points = np.array([row[:3] for row in rows], np.int64).reshape(-1, 3)
        gunzip = native.gunzip() if compressed is not None else None
        if gunzip is not None:
            wanted = [row[:3] for row in rows if row[3]]
            # in halves on two threads (zlib runs without the GIL): 0.2 ms a point
            halves = [wanted[: len(wanted) // 2], wanted[len(wanted) // 2 :]]
            with ThreadPoolExecutor(2) as pool:
                made = pool.map(
                    lambda part: gunzip.sparse_windows(compressed, data, part, 1), halves
                )
                kept = iter([window for part in made for window in part])
            windows = tuple(next(kept) if has_window else b"" for *_, has_window in rows)
        else:
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

    A read decompresses from the seek point before it (zlib, primed with the point's bit
    offset and window by ``_gunzip.c``; where that is not built, zran) up to the read's
    end, from one read of the compressed bytes in between. What it decompressed is kept
    in the process's :data:`~indextar.source.spancache.SPAN_CACHE` under that point, so a
    later read that ends before it is a copy. A read that goes on from where the last
    one ended (block order), and the second read in a span, decompress the span to its
    end; :meth:`read_many` (a batch) decompresses each span once for all of the batch's
    reads in it.

    Parameters
    ----------
    raw
        The compressed file (local or remote).
    points
        Its seek points, from its index.
    local_path
        The file's path when it is local: zran (the fallback) then reads it itself.
    cache
        Where decompressed spans are kept (default: the process's ``SPAN_CACHE``).
    """

    def __init__(
        self,
        raw: ByteSource,
        points: SeekPoints,
        *,
        local_path: str | None = None,
        cache: SpanCache | None = None,
    ):
        self.url = raw.url
        self.raw = raw
        self.points = points
        self.local_path = local_path
        self.cache = SPAN_CACHE if cache is None else cache
        self._setup()

    def _setup(self) -> None:
        rows = self.points.points
        self._starts: list[int] = rows[:, 2].tolist()
        self._token = next(_tokens)
        self._gunzip = native.gunzip()
        self._file: Any = None
        self._generation = -1
        self._lock = threading.Lock()
        # The last span decompressed, served first: reads in order need no cache.
        self._last_at = -1
        self._last = b""
        self._last_end = -1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_starts", "_token", "_gunzip", "_file", "_lock", "_last", "_last_at"):
            del state[name]
        state["cache"] = None if self.cache is SPAN_CACHE else self.cache
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.cache is None:
            self.cache = SPAN_CACHE
        self._setup()

    @property
    def size(self) -> int:
        return self.points.uncompressed_size

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.points.uncompressed_size:
            raise outside_error(self.url, offset, length, self.points.uncompressed_size)
        with self._lock:
            data = self._kept(offset, length)
            if data is None:
                data = self._read_on(offset, length) if offset == self._last_end else None
            if data is None:
                point = bisect.bisect_right(self._starts, offset) - 1
                data = self._decompress(point, offset + length, offset == self._last_end)
                at = offset - self._starts[point]
                data = data[at : at + length]
            self._last_end = offset + length
        return data

    def _read_on(self, offset: int, length: int) -> bytes | None:
        """A read in order that starts in the last span decompressed and ends after it:
        its head from there, the rest from the seek point where that span ends (else
        ``None``)."""
        at = offset - self._last_at
        end_of_last = self._last_at + len(self._last)
        if self._last_at < 0 or not 0 <= at < len(self._last):
            return None
        point = bisect.bisect_left(self._starts, end_of_last)
        if point == len(self._starts) or self._starts[point] != end_of_last:
            return None
        head = self._last[at:]
        return head + self._decompress(point, offset + length, True)[: length - len(head)]

    def read_many(self, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """Several ranges: those not kept are grouped by the seek point before them, and
        each group's span decompressed once, to the furthest end it needs."""
        size = self.points.uncompressed_size
        out: list[bytes] = [b""] * len(offsets)
        wanted: dict[int, list[int]] = {}
        starts = self._starts
        with self._lock:
            for n, (offset, length) in enumerate(zip(offsets, lengths)):
                if offset < 0 or length < 0 or offset + length > size:
                    raise outside_error(self.url, offset, length, size)
                data = self._kept(offset, length)
                if data is None:
                    wanted.setdefault(bisect.bisect_right(starts, offset) - 1, []).append(n)
                else:
                    out[n] = data
            for point, group in sorted(wanted.items()):
                end = max(offsets[n] + lengths[n] for n in group)
                span = self._decompress(point, end, len(group) > 1)
                for n in group:
                    at = offsets[n] - starts[point]
                    out[n] = span[at : at + lengths[n]]
            if len(offsets):
                self._last_end = offsets[-1] + lengths[-1]
        return out

    def _kept(self, offset: int, length: int) -> bytes | None:
        """``[offset, offset + length)`` from the last span decompressed or the cache;
        ``None`` where neither holds it."""
        at = offset - self._last_at
        if self._last_at >= 0 and at >= 0 and at + length <= len(self._last):
            return self._last[at : at + length]
        if not self.cache.budget:
            return None
        point = bisect.bisect_right(self._starts, offset) - 1
        kept = self.cache.get((self._token, point))
        at = offset - self._starts[point]
        if kept is None or at + length > len(kept):
            return None
        self._last, self._last_at = kept, self._starts[point]
        return kept[at : at + length]

    def _decompress(self, point: int, end: int, whole: bool) -> bytes:
        """The bytes from seek point ``point`` to at least ``end``: to the end of its
        span where ``whole`` or where the cache already holds a part of it (a second
        read in the span), kept in the cache and as the last span."""
        starts = self._starts
        start = starts[point]
        if whole or (self._token, point) in self.cache:
            after = bisect.bisect_left(starts, end, point + 1)  # the span that holds end
            end = starts[after] if after < len(starts) else self.points.uncompressed_size
        if self._gunzip is not None:
            data = self._inflate(point, end)
        else:
            data = self._zran(point, end)
        if len(data) != end - start:
            raise TruncatedShardError(
                f"the gzip stream gave {len(data)} of {end - start} bytes from the seek point "
                f"at uncompressed offset {start}",
                shard=self.url,
                offset=start + len(data),
            )
        self._last, self._last_at = data, start
        if self.cache.budget:
            self.cache.put((self._token, point), data)
        return data

    def _inflate(self, point: int, end: int) -> bytes:
        """zlib from seek point ``point`` to ``end``, reading the compressed bytes up to
        the first point at or after ``end`` (all its output comes before them)."""
        rows = self.points.points
        c_offset, bits, u_offset = rows[point].tolist()
        after = bisect.bisect_left(self._starts, end, point + 1)
        c_end = int(rows[after, 0]) + 1 if after < len(rows) else self.raw.size
        first = c_offset - 1 if bits else c_offset
        c_end = min(c_end, self.raw.size)
        if c_end <= first:
            raise TruncatedShardError(
                f"the gzip file has {self.raw.size} bytes: it ends before the seek point at "
                f"compressed offset {c_offset} (uncompressed {u_offset})",
                shard=self.url,
                offset=c_offset,
            )
        compressed = self.raw.read(first, c_end - first)
        blob = self.points.windows[point]
        window = zlib.decompress(blob) if blob else b""
        gunzip = self._gunzip
        assert gunzip is not None
        try:
            data: bytes = gunzip.inflate_from(compressed, bits, window, end - u_offset)
        except ValueError as e:
            at, _, message = str(e).partition(": ")
            where = first + int(at) if at.isdigit() else c_offset
            raise ShardFormatError(
                f"corrupt gzip data at compressed byte offset {where}, decompressing from the "
                f"seek point at compressed offset {c_offset} (uncompressed {u_offset}) "
                f"({message or e})",
                shard=self.url,
                offset=where,
            ) from e
        if len(data) < end - u_offset and self.raw.size >= self.points.compressed_size:
            # not cut short (that is the TruncatedShardError of _decompress): corrupt
            raise ShardFormatError(
                f"corrupt gzip data: compressed bytes [{first}, {c_end}) gave {len(data)} "
                f"bytes from the seek point at uncompressed offset {u_offset}, where the index "
                f"has {end - u_offset}",
                shard=self.url,
                offset=first,
            )
        return data

    def _zran(self, point: int, end: int) -> bytes:
        """zran (``indexed_gzip``) from seek point ``point`` to ``end``."""
        f = self._file
        if f is None or self._generation != base._fork_generation:
            f = self._open()
        start = self._starts[point]
        try:
            f.seek(start)
            data: bytes = f.read(end - start)
        except Exception as e:  # zran's ZranError and its IOErrors
            raise ShardFormatError(
                f"cannot decompress {end - start} bytes from uncompressed offset {start} ({e})",
                shard=self.url,
                offset=start,
            ) from e
        return data

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

    def close(self) -> None:
        f, self._file = self._file, None
        if f is not None and self._generation == base._fork_generation:
            f.close()
        self._last, self._last_at = b"", -1
        self.cache.drop(self._token)
        self.raw.close()
