"""A single-stream ``.tar.gz`` read at uncompressed offsets, from seek points.

A gzip stream can only be decompressed from its start, unless the decompressor is
given a *seek point*: a position in the compressed stream (a byte and a bit), the
uncompressed offset it corresponds to, and the 32 KiB of uncompressed data before it
(deflate's window). The index stores one about every ``spacing`` uncompressed bytes
(128 KiB by default; :mod:`~indextar.source.seekpoints`), so a read decompresses at
most that much before its first byte. :class:`GzipSeekSource` reads with
``_gunzip.c``'s ``inflate_from`` (zlib primed with the point's bits and window), or
zran as the fallback, and keeps what it decompressed in
:mod:`~indextar.source.spancache`.
"""

from __future__ import annotations

import bisect
import io
import itertools
import threading
import zlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import IndexFormatError, ShardFormatError, StaleIndexError, TruncatedShardError
from . import base
from .base import ByteSource, Span, corrupt_layout_error, outside_error
from .codecs import indexed_gzip
from .extensions import gunzip
from .seekpoints import ZRAN_BUFFER, SeekPoints
from .spancache import SPAN_CACHE, SpanCache

__all__ = ["GzipSeekSource"]

_tokens = itertools.count()  # one per source object: its spans' key in the cache
_UNRESOLVED = object()  # _gunzip.c not looked up yet: at the first decompression


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
        Where decompressed spans are kept (default, and after pickling: the process's
        ``SPAN_CACHE``).
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
        self._starts: list[int] = points.points[:, 2].tolist()
        self._token = next(_tokens)
        self._gunzip: Any = _UNRESOLVED
        self._file: Any = None
        self._generation = -1
        self._lock = threading.Lock()
        self._lock_generation = base._fork_generation
        # The last span decompressed, served first: reads in order need no cache.
        self._last_at = -1
        self._last = b""
        self._last_end = -1

    def __getstate__(self) -> dict[str, Any]:
        # What the receiving process opens again, and its own SPAN_CACHE (the default).
        return {"raw": self.raw, "points": self.points, "local_path": self.local_path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def _guard(self) -> threading.Lock:
        """The source's lock; a new one in a forked child, where one that another
        thread held at the fork would stay held. The child also drops the parent's last
        span, as its ``SPAN_CACHE`` starts empty: its first read goes to ``raw``, which
        refuses a file replaced since the parent opened it."""
        if self._lock_generation != base._fork_generation:
            self._lock, self._lock_generation = threading.Lock(), base._fork_generation
            self._last, self._last_at = b"", -1
        return self._lock

    def _extension(self) -> ModuleType | None:
        """``_gunzip.c``, or ``None`` for zran (not built, or ``INDEXTAR_PURE_PYTHON``),
        looked up at the first decompression rather than at open: opening a shard then
        crosses no module but its sources' (``tests/test_shard_path.py``)."""
        if self._gunzip is _UNRESOLVED:
            self._gunzip = gunzip()
        return self._gunzip  # type: ignore[no-any-return]

    @property
    def size(self) -> int:
        return self.points.uncompressed_size

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.points.uncompressed_size:
            raise outside_error(self.url, offset, length, self.points.uncompressed_size)
        with self._guard():
            self.raw.check_unchanged()  # what is kept is of the file as it was
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

    def read_members(
        self,
        offset: int,
        length: int,
        member_rows: npt.NDArray[np.int64],
        first: int,
        count: int,
        ext_names: tuple[str, ...],
        key: bytes | None = None,
        *,
        check_names: bool = True,
    ) -> list[tuple[str, bytes]]:
        try:
            return super().read_members(
                offset, length, member_rows, first, count, ext_names, key,
                check_names=check_names,
            )  # fmt: skip
        except StaleIndexError as e:
            where = f"the sample at uncompressed byte offset {offset}"
            raise corrupt_layout_error(self.raw, self.url, "seek points", where) from e

    def read_members_many(
        self,
        spans: Sequence[Span],
        member_rows: npt.NDArray[np.int64],
        ext_names: tuple[str, ...],
        *,
        check_names: bool = True,
    ) -> list[list[tuple[str, bytes]]]:
        try:
            return super().read_members_many(spans, member_rows, ext_names, check_names=check_names)
        except StaleIndexError as e:
            where = f"one of {len(spans)} samples read together"
            raise corrupt_layout_error(self.raw, self.url, "seek points", where) from e

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
        with self._guard():
            self.raw.check_unchanged()
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
        if self._extension() is not None:
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
        try:
            window = zlib.decompress(blob) if blob else b""
        except zlib.error as e:
            raise IndexFormatError(
                f"the index of {self.url!r} is corrupt: the window of its seek point at "
                f"compressed offset {c_offset} does not decompress ({e}); rebuild the index "
                "with build_index(shard, force=True)"
            ) from e
        gunzip = self._extension()
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
                self.local_path,
                drop_handles=False,
                buffer_size=ZRAN_BUFFER,
                readbuf_size=ZRAN_BUFFER,
            )
        else:
            f = module.IndexedGzipFile(
                fileobj=_RawFile(self.raw), buffer_size=ZRAN_BUFFER, readbuf_size=ZRAN_BUFFER
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
