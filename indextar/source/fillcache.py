"""A remote shard put into the shard cache by the ranged reads that read it.

With ``ShardCache(fill="ranges")`` a shard not yet cached is not downloaded whole
before its first sample: it is read by ranged requests, as ``remote="ranges"`` reads
it (batches in flight, the read-ahead), and each range fetched is also written into
the cache entry's ``.part`` file, at its offset. An i.i.d. epoch reads every sample
once, so by its end the part holds every sample's span; what is left (tar padding,
the end-of-archive blocks: well under 1% of a shard of 100 KB samples) is fetched
then, and the part becomes the cached shard. The first epoch thus fetches each byte
about once and starts at the first range's round trip, not after a shard's download.

Correctness is the whole-shard download's:

* Every range is conditional on the ETag the index recorded and its answer checked
  (range, length, ETag) before it is written: a changed object is refused (412) and
  never written. The entry's name hashes the URL, size and ETag.
* The part becomes ``<digest>-<name>`` by ``os.replace`` only once every byte is
  written and ``fsync``'ed: no half-written file ever has the cached shard's name.
* Which ranges a part holds is a log next to it, ``<part>.ranges``: a header (the
  boot's id and the part's inode) and a record per range, appended after its bytes
  are written. Processes filling one shard (DataLoader workers, ranks) share the part
  and the log; a log of another boot, or of another part, is not trusted and the part
  starts afresh. Each filler holds a shared ``flock`` on the shard's ``.lock`` so that
  no cache eviction removes a part in use; writes hold a shared ``flock`` on the part
  and the promotion an exclusive one, so that nothing is written to the shard once it
  has its name (a later write would change its mtime under its readers).

Ranges a part holds are read from it (:meth:`FillingSource.held`), and once the shard
is cached whole, every read is a local ``pread``.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any

from .base import ByteSource, SpanBytes, fork_generation
from .cache import CachedSource, ShardCache
from .conditional import RemoteStat, check_version
from .download import pwrite_all
from .remote import RangeSource, fetch_ranges

__all__ = ["FillingSource", "cache_source"]

log = logging.getLogger(__name__)

_OPENING = threading.Lock()
_RECORD = struct.Struct("<QQ")  # offset, length of a range written into the part
_FINISH_SHARE = 128  # finish a part once at most 1/128 of it is missing...
_FINISH_FLOOR = 64 << 10  # ...or at most 64 KiB


def cache_source(url: str, cache: ShardCache, expected: RemoteStat) -> ByteSource:
    """The source of a remote shard read through ``cache``: the cached copy where the
    shard is cached whole, or where the cache fills whole shards; else a
    :class:`FillingSource`."""
    if cache.fill == "ranges" and not cache.path_for(url, expected).exists():
        return FillingSource(url, cache=cache, expected=expected)
    return CachedSource(url, cache=cache, expected=expected)


def _boot_id() -> bytes:
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return f.read().strip()
    except OSError:  # no boot id: a part left by a dead filler is never trusted
        return os.urandom(8).hex().encode()


class _Fill:
    """One process's share in filling one cache entry."""

    def __init__(self, source: FillingSource):
        self.url = source.url
        self.cache = source.cache
        self.expected: RemoteStat = source.expected  # type: ignore[assignment]
        self.size = self.expected.size
        self.path = self.cache.path_for(self.url, self.expected)
        self.part = Path(f"{self.path}.part")
        self.covered: list[list[int]] = []  # merged [start, end) ranges, sorted
        self.held_bytes = 0
        self.log_read = 0  # how far the log has been read
        self.local: int | None = None  # the cached shard's locked descriptor, once whole
        self.lock_fd = self.part_fd = self.log_fd = -1
        self.finishing = False  # a thread of this process is finishing the part
        self.lock = threading.RLock()  # the prefetcher's threads share this fill
        self._open()

    def _open(self) -> None:
        self.local = self.cache.open_cached(self.url, self.expected)
        if self.local is not None:
            return
        self.cache.directory.mkdir(parents=True, exist_ok=True)
        # shared: other fillers fill along; a whole-shard download (exclusive) waits
        self.lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.lock_fd, fcntl.LOCK_SH)
        self.local = self.cache.open_cached(self.url, self.expected)
        if self.local is not None:
            self._release_fill()
            return
        self.cache.reserve_fill(self.part, self.size, self.url, _boot_id())
        self.part_fd = os.open(self.part, os.O_RDWR | os.O_CLOEXEC)
        self.log_fd = os.open(f"{self.part}.ranges", os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        self.log_read = len(os.pread(self.log_fd, 256, 0).partition(b"\n")[0]) + 1
        self._read_log()

    def _release_fill(self) -> None:
        for fd in (self.log_fd, self.part_fd, self.lock_fd):
            if fd >= 0:
                os.close(fd)
        self.lock_fd = self.part_fd = self.log_fd = -1

    # -- what the part holds --------------------------------------------------------

    def _add(self, start: int, end: int) -> None:
        """Merge ``[start, end)`` into ``covered`` and count the bytes it adds."""
        spans = self.covered
        at = bisect.bisect_left(spans, [start, start])
        if at and spans[at - 1][1] >= start:
            at -= 1
        new_start, new_end, removed = start, end, 0
        last = at
        while last < len(spans) and spans[last][0] <= end:
            new_start, new_end = min(new_start, spans[last][0]), max(new_end, spans[last][1])
            removed += spans[last][1] - spans[last][0]
            last += 1
        spans[at:last] = [[new_start, new_end]]
        self.held_bytes += (new_end - new_start) - removed

    def _read_log(self) -> None:
        """Take the ranges other processes wrote since the last look."""
        while True:
            data = os.pread(self.log_fd, 1 << 16, self.log_read)
            whole = len(data) - len(data) % _RECORD.size
            if not whole:
                return
            for offset, length in _RECORD.iter_unpack(data[:whole]):
                self._add(offset, offset + length)
            self.log_read += whole

    def _holds(self, start: int, end: int) -> bool:
        at = bisect.bisect_right(self.covered, [start, float("inf")]) - 1
        return at >= 0 and self.covered[at][0] <= start and self.covered[at][1] >= end

    def gaps(self) -> list[tuple[int, int]]:
        """``(offset, length)`` of each range the part does not hold."""
        gaps, reached = [], 0
        for start, end in self.covered:
            if start > reached:
                gaps.append((reached, start - reached))
            reached = max(reached, end)
        if reached < self.size:
            gaps.append((reached, self.size - reached))
        return gaps

    # -- reads and writes -----------------------------------------------------------

    def held(self, offset: int, length: int) -> bytes | None:
        with self.lock:  # no other thread closes the descriptor under the pread
            if self.local is not None:
                fd = self.local
            elif self.part_fd >= 0:
                self._read_log()
                if not self._holds(offset, offset + length):
                    return None
                fd = self.part_fd
            else:
                return None
            data = os.pread(fd, length, offset)
        return data if len(data) == length else None

    def keep(self, offset: int, data: SpanBytes) -> bool:
        """Write ``data`` into the part; whether the part is now nearly whole (and no
        thread of this process is finishing it)."""
        with self.lock:  # the flock is the descriptor's: one thread at a time takes it
            if self.local is not None or self.part_fd < 0 or not data:
                return False
            fcntl.flock(self.part_fd, fcntl.LOCK_SH)
            try:
                if not self._still_a_part():
                    return False
                pwrite_all(self.part_fd, data, offset)
                os.write(self.log_fd, _RECORD.pack(offset, len(data)))
            finally:
                fcntl.flock(self.part_fd, fcntl.LOCK_UN)
            self._read_log()  # this range, and those other processes wrote meanwhile
            missing = self.size - self.held_bytes
            if self.finishing or (missing * _FINISH_SHARE > self.size and missing > _FINISH_FLOOR):
                return False
            self.finishing = True
            return True

    def _still_a_part(self) -> bool:
        """Whether the part file is still the part (not renamed to the cached shard)."""
        try:
            return os.stat(self.part).st_ino == os.fstat(self.part_fd).st_ino
        except FileNotFoundError:
            return False

    def lock_finish(self) -> bool:
        """Whether this process may finish the part (no other one is finishing it)."""
        with self.lock:
            if self.log_fd < 0:
                return False
            try:
                fcntl.flock(self.log_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

    def unlock_finish(self) -> None:
        with self.lock:
            self.finishing = False
            if self.log_fd >= 0:
                fcntl.flock(self.log_fd, fcntl.LOCK_UN)

    def promote(self) -> None:
        """The part, whole, becomes the cached shard (by another filler, perhaps)."""
        with self.lock:
            self._promote()

    def _promote(self) -> None:
        # Exclusive, so that no filler writes from here on; without waiting, for once
        # the part is the cached shard its readers hold shared locks on it for good.
        while self._still_a_part():
            try:
                fcntl.flock(self.part_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.001)
        else:
            self._release_fill()
            self.local = self.cache.open_cached(self.url, self.expected)
            return
        try:
            self._read_log()
            if self._still_a_part() and not self.gaps():
                os.fsync(self.part_fd)
                os.replace(self.part, self.path)
                Path(f"{self.part}.ranges").unlink(missing_ok=True)
                log.info("%s is cached whole, filled by its ranged reads", self.url)
        finally:
            fcntl.flock(self.part_fd, fcntl.LOCK_UN)
        if not self._still_a_part():
            self._release_fill()
            self.local = self.cache.open_cached(self.url, self.expected)

    def close(self) -> None:
        with self.lock:
            self._release_fill()
            if self.local is not None:
                os.close(self.local)
                self.local = None


class FillingSource(RangeSource):
    """A remote shard read by ranged requests, each range also written into the
    :class:`~indextar.source.cache.ShardCache` (see the module).

    A :class:`~indextar.source.remote.RangeSource` to every reader (batches, the
    read-ahead), whose :meth:`held` serves what the cache entry holds already.
    """

    __slots__ = ("cache", "_fill", "_fill_generation")

    def __init__(self, url: str, *, cache: ShardCache, expected: RemoteStat):
        super().__init__(
            url, expected=expected, storage_options=cache.storage_options, retry=cache.retry
        )
        self.cache = cache
        self._fill: _Fill | None = None
        self._fill_generation = -1

    def _current(self) -> _Fill:
        fill = self._fill
        if fill is not None and self._fill_generation == fork_generation():
            return fill
        with _OPENING:  # one fill per source and process, whichever thread comes first
            if self._fill is None or self._fill_generation != fork_generation():
                self._fill = _Fill(self)  # a forked child's own descriptors and locks
                self._fill_generation = fork_generation()
            return self._fill

    def held(self, offset: int, length: int) -> bytes | None:
        return self._current().held(offset, length)

    def keep(self, offset: int, data: SpanBytes) -> None:
        fill = self._current()
        try:
            nearly_whole = fill.keep(offset, data)
        except OSError as e:  # a full disk, say: the read goes on, the filling stops here
            log.warning(
                "cannot fill the shard cache with %s (%s); reading it by ranges", self.url, e
            )
            fill.close()
            return
        if nearly_whole:
            self._finish(fill)

    def fetch_length(self, offset: int, length: int) -> int:
        """To the next 512-byte block: a sample's span ends at its last member's data,
        and the padding after it would otherwise be left for the end, one tiny request
        per sample. A read that is not inside the object is asked as it is (refused)."""
        size: int = self.expected.size  # type: ignore[union-attr]
        end = offset + length
        if offset < 0 or length <= 0 or end >= size:
            return length
        return min(-(-end // 512) * 512, size) - offset

    def check_unchanged(self) -> None:
        """Refuse an object that is no longer the version this source serves bytes of
        (those the cache holds are never read again from it): one metadata request."""
        fresh = RangeSource(self.url, storage_options=self.storage_options, retry=self.retry)
        check_version(self.url, self.expected, fresh.stat())  # type: ignore[arg-type]

    def _finish(self, fill: _Fill) -> None:
        """Fetch what the part lacks and make it the cached shard: one process does,
        the others go on reading (a finisher that fails leaves it to the next)."""
        if not fill.lock_finish():
            fill.unlock_finish()  # another process finishes it
            return
        try:
            gaps = fill.gaps()
            if gaps:
                fetch_ranges([self] * len(gaps), [o for o, _ in gaps], [n for _, n in gaps])
            fill.promote()
        finally:
            fill.unlock_finish()

    def decompressed_copy(self, codec: str, size: int) -> ByteSource | None:
        """A shard that no read can start inside is downloaded and kept decompressed,
        as the whole-shard cache keeps it."""
        cached = CachedSource(self.url, cache=self.cache, expected=self.expected)  # type: ignore[arg-type]
        return cached.decompressed_copy(codec, size)

    def close(self) -> None:
        if self._fill is not None and self._fill_generation == fork_generation():
            self._fill.close()
        self._fill = None
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "cache": self.cache, "expected": self.expected}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"FillingSource({self.url!r}, {self.cache!r})"
