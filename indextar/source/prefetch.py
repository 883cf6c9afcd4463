"""Spans fetched ahead of their reads, in a memory budget.

A :class:`Prefetcher` is told which spans will be read, in the order they will be
needed (:meth:`~Prefetcher.want`), and fetches them in the background, in chunks of a
few spans through a :data:`SpanFetch` (by default
:func:`~indextar.read.remote_options.fetch_spans`: retries, ETag conditions, frames of
compressed shards), several chunks at once. What it holds plus what it has in flight
never exceeds ``budget`` bytes. A read then :meth:`~Prefetcher.take_many` s its span: held,
it is handed over; in flight, the read waits for it; not yet started, it is dropped
from the queue and the reader fetches it itself, so no span is fetched twice. A fetch
that fails is forgotten: the reader's own fetch retries it and raises what is wrong.

Each span wanted carries the number of the batch it is for; :meth:`~Prefetcher.forget_before`
drops what earlier batches wanted and did not take (a prediction that did not come
true), so that the budget never fills with spans nobody will read.

Spans whose source can be read on an event loop (``start(source, offset, length)``
gives a coroutine function, :meth:`~indextar.source.remote.RangeSource.range_coroutine`)
are fetched there instead, one request each, ``in_flight`` of them at once across
batches (fewer while the store answers "slow down": :mod:`.throttle`): no thread per
chunk, no chunk waiting on its slowest span. The threads serve the others (a
compressed shard's frames, a blocking filesystem).

The fetching threads are daemons and are started lazily; a forked child must make its
own :class:`Prefetcher` (its parent's threads and loop do not exist there).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .base import ByteSource, SpanBytes
from .retry import status_of
from .throttle import InFlightLimit

__all__ = [
    "DEFAULT_CHUNK",
    "DEFAULT_IN_FLIGHT",
    "PrefetchStats",
    "Prefetcher",
    "SpanFetch",
    "SpanStart",
]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

SpanFetch = Callable[[Sequence[ByteSource], Sequence[int], Sequence[int]], list[SpanBytes]]
"""``fetch(sources, offsets, lengths)``: span ``i`` of ``sources[i]`` for every ``i``,
all requests in flight together; raises if any cannot be read. The seam where a faster
client plugs in."""

SpanStart = Callable[[ByteSource, int, int], Callable[[], Awaitable[SpanBytes]] | None]
"""``start(source, offset, length)``: a function whose coroutine fetches the span on
the prefetcher's event loop (one attempt), or None where ``fetch`` must fetch it."""

DEFAULT_IN_FLIGHT = 128
"""Spans a prefetcher keeps in flight: enough for 6,400 samples/s at 20 ms a request."""
DEFAULT_CHUNK = 16
"""Spans per call of its ``fetch`` (so ``DEFAULT_IN_FLIGHT // DEFAULT_CHUNK`` threads)."""

_QUEUED, _FLIGHT, _HELD = 0, 1, 2


@dataclass(slots=True, eq=False)
class _Entry:
    source: ByteSource
    offset: int
    length: int
    dues: list[int] = field(default_factory=list)  # the batches that will take it
    state: int = _QUEUED
    data: SpanBytes | None = None
    start: Callable[[], Awaitable[SpanBytes]] | None = None  # fetched on the loop, if any
    waited: bool = False  # a reader waits for it (the loop wakes readers for these only)


@dataclass(frozen=True, slots=True)
class PrefetchStats:
    """What a prefetcher did, in bytes and spans, since it was made.

    Attributes
    ----------
    budget
        Bytes it may hold and have in flight together.
    held_bytes, in_flight_bytes
        Now.
    peak_bytes
        The most it held and had in flight at once (never above ``budget``).
    fetched
        Spans it fetched.
    taken
        Spans reads took from it (``waited`` of them were still in flight).
    missed
        Spans reads asked for that it did not have: not predicted, not yet started,
        or failed.
    wasted
        Spans it fetched that no read took.
    throttled
        Requests on its event loop the store answered 503 or 429 (slow down).
    in_flight_limit
        Requests it keeps in flight on its event loop now: its ``in_flight``, cut
        by throttled answers and grown back by successful ones
        (:class:`~indextar.source.throttle.InFlightLimit`).
    """

    budget: int
    held_bytes: int
    in_flight_bytes: int
    peak_bytes: int
    fetched: int
    taken: int
    waited: int
    missed: int
    wasted: int
    throttled: int
    in_flight_limit: int


class Prefetcher(Generic[K]):
    """Fetches wanted spans in the background, at most ``budget`` bytes at a time.

    Parameters
    ----------
    fetch
        How a chunk of spans is fetched.
    budget
        Bytes held and in flight together, at most. A span longer than this is never
        fetched ahead.
    in_flight
        Spans in flight at once: ``in_flight // chunk`` threads each fetch ``chunk``.
    chunk
        Spans per call of ``fetch``.
    start, loop
        Spans ``start`` can fetch go out on ``loop()``'s event loop, ``in_flight`` at once
        (besides the threads'); without them every span goes through ``fetch``.
    """

    def __init__(
        self,
        fetch: SpanFetch,
        *,
        budget: int,
        in_flight: int = DEFAULT_IN_FLIGHT,
        chunk: int = DEFAULT_CHUNK,
        start: SpanStart | None = None,
        loop: Callable[[], asyncio.AbstractEventLoop] | None = None,
    ):
        if budget < 0 or in_flight < 1 or chunk < 1:
            raise ValueError(f"need budget >= 0, in_flight >= 1, chunk >= 1; got {budget}, "
                             f"{in_flight}, {chunk}")  # fmt: skip
        self.budget = budget
        self._fetch = fetch
        self._chunk = min(chunk, in_flight)
        self._threads = max(1, in_flight // self._chunk)
        self._entries: dict[K, _Entry] = {}
        # batch number -> how many dues of entries name it, at least: forget_before
        # looks through the entries only when one names a batch before its own
        self._due_counts: dict[int, int] = {}
        self._queue: deque[tuple[K, _Entry]] = deque()
        # The loop's: its own queue, requests in flight, tasks, and a wake-up pending.
        self._start = start if loop is not None else None
        self._loop_of = loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit = InFlightLimit(in_flight)  # the store's rate: AIMD on throttling
        self._aqueue: deque[tuple[K, _Entry]] = deque()
        self._aflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._wake_pending = False
        self._lock = threading.Lock()
        # Two waits on one lock: fetching threads wait for work, readers for a span.
        self._work = threading.Condition(self._lock)
        self._done = threading.Condition(self._lock)
        self._started: list[threading.Thread] = []
        self._closed = False
        self._held = self._flight = self._peak = 0
        self._counts = {"fetched": 0, "taken": 0, "waited": 0, "missed": 0, "wasted": 0}

    def want(self, spans: Iterable[tuple[K, ByteSource, int, int]], due: int) -> None:
        """Fetch each ``(key, source, offset, length)`` span, which batch ``due`` will
        take as ``key``; a span wanted twice is fetched once and taken twice."""
        spans = [span for span in spans if span[3] <= self.budget]
        starts: list[Any] = [None] * len(spans)
        if self._start is not None:  # outside the lock: a source's first use may check it
            starts = [self._start(source, offset, length) for _, source, offset, length in spans]
            if self._loop is None and any(starts):
                self._loop = self._loop_of()  # type: ignore[misc]
        with self._lock:
            for (key, source, offset, length), start in zip(spans, starts):
                entry = self._entries.get(key)
                if entry is None:
                    entry = self._entries[key] = _Entry(source, offset, length, start=start)
                    (self._queue if start is None else self._aqueue).append((key, entry))
                entry.dues.append(due)
            self._due_counts[due] = self._due_counts.get(due, 0) + len(spans)
            if self._queue:
                self._start_threads()
                self._work.notify(-(-len(self._queue) // self._chunk))
            self._wake()

    def take_many(self, keys: Iterable[K]) -> list[SpanBytes | None]:
        """The span wanted as each key, once fetched (waiting for those in flight);
        ``None`` for those the caller must fetch. One hold of the lock for a batch's."""
        with self._lock:
            return [self._take(key) for key in keys]

    def _take(self, key: K) -> SpanBytes | None:
        entry = self._entries.get(key)
        if entry is not None and entry.state == _FLIGHT:
            self._counts["waited"] += 1
            entry.waited = True
            while entry.state == _FLIGHT and self._entries.get(key) is entry:
                self._done.wait()
        if entry is None or entry.state != _HELD or self._entries.get(key) is not entry:
            if entry is not None and self._entries.get(key) is entry:
                del self._entries[key]  # queued: the caller fetches it instead
            self._counts["missed"] += 1
            return None
        self._counts["taken"] += 1
        data = entry.data
        if entry.dues:
            first = min(entry.dues)
            entry.dues.remove(first)
            left = self._due_counts.get(first, 0) - 1
            if left > 0:
                self._due_counts[first] = left
            else:
                self._due_counts.pop(first, None)
        if not entry.dues:
            self._drop(key, entry)
        return data

    def forget_before(self, due: int) -> None:
        """Stop holding (or fetching) spans only batches before ``due`` wanted."""
        with self._lock:
            if all(d >= due for d in self._due_counts):
                return  # every span wanted before was taken: nothing to forget
            self._due_counts = {}
            for key, entry in list(self._entries.items()):
                entry.dues = [d for d in entry.dues if d >= due]
                for d in entry.dues:
                    self._due_counts[d] = self._due_counts.get(d, 0) + 1
                if not entry.dues and entry.state != _FLIGHT:
                    if entry.state == _HELD:
                        self._counts["wasted"] += 1
                    self._drop(key, entry)
            # Taken or forgotten while queued: out of the queues too (they stay short).
            self._queue, self._aqueue = self._queued(self._queue), self._queued(self._aqueue)

    def clear(self) -> None:
        """Forget everything wanted (a new pass over the data)."""
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry.state == _HELD:
                    self._counts["wasted"] += 1
                if entry.state != _FLIGHT:
                    self._drop(key, entry)
                else:
                    entry.dues = []
            self._due_counts = {}
            self._queue.clear()
            self._aqueue.clear()

    def stats(self) -> PrefetchStats:
        """Its figures now."""
        with self._lock:
            return PrefetchStats(
                self.budget, self._held, self._flight, self._peak, **self._counts,
                throttled=self._limit.throttled, in_flight_limit=self._limit.limit,
            )  # fmt: skip

    def close(self) -> None:
        """Stop the threads (after the chunks in flight) and drop what is held."""
        self.clear()
        with self._lock:
            self._closed = True
            self._work.notify_all()

    # -- internals (under the lock) -----------------------------------------------------

    def _drop(self, key: K, entry: _Entry) -> None:
        if self._entries.get(key) is entry:
            del self._entries[key]
        if entry.state == _HELD:
            self._held -= entry.length
            entry.data = None
            if self._started:
                self._work.notify()  # room for another chunk
            self._wake()  # and for more requests on the loop

    def _queued(self, queue: deque[tuple[K, _Entry]]) -> deque[tuple[K, _Entry]]:
        return deque(
            (key, entry)
            for key, entry in queue
            if entry.state == _QUEUED and self._entries.get(key) is entry
        )

    def _landed(self, key: K, entry: _Entry, data: SpanBytes | None) -> None:
        """A fetch of ``entry`` ended with ``data`` (None: it failed)."""
        self._flight -= entry.length
        if data is None or self._entries.get(key) is not entry or not entry.dues:
            self._counts["wasted"] += data is not None
            entry.state = _QUEUED  # failed or forgotten: never handed out
            if self._entries.get(key) is entry:
                del self._entries[key]
            return
        entry.state, entry.data = _HELD, data
        self._held += entry.length
        self._counts["fetched"] += 1

    # -- the event loop's requests ------------------------------------------------------

    def _wake(self) -> None:
        """Have the loop start what it can of its queue (from any thread, at most one
        wake-up pending)."""
        if self._aqueue and not self._wake_pending and not self._closed and self._loop:
            self._wake_pending = True
            self._loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        with self._lock:
            self._wake_pending = False
            self._fill()

    def _fill(self) -> None:
        """On the loop, under the lock: a task for each queued span that fits, up to
        ``in_flight`` requests (fewer while the store throttles)."""
        assert self._loop is not None
        queue = self._aqueue
        limit = self._limit.limit
        while queue and self._aflight < limit and not self._closed:
            key, entry = queue[0]
            if entry.state != _QUEUED or self._entries.get(key) is not entry:
                queue.popleft()  # taken or forgotten while queued
                continue
            if self._held + self._flight + entry.length > self.budget:
                break  # a take or a forget wakes the loop again
            queue.popleft()
            entry.state = _FLIGHT
            self._flight += entry.length
            self._aflight += 1
            task = self._loop.create_task(self._fetch_one(key, entry))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._peak = max(self._peak, self._held + self._flight)

    async def _fetch_one(self, key: K, entry: _Entry) -> None:
        start, entry.start = entry.start, None
        data: SpanBytes | None = None
        status: int | None = None
        assert self._loop is not None
        sent = self._loop.time()
        try:
            assert start is not None
            data = await start()
            if len(data) != entry.length:
                data = None  # the reader's own fetch says what is wrong
        except Exception as e:  # the reader's own fetch raises it, or succeeds
            status = status_of(e)
            log.debug("read-ahead of %s failed: %s: %s", key, type(e).__name__, e)
        with self._lock:
            self._aflight -= 1
            self._limit.answered(sent, self._loop.time(), ok=data is not None, status=status)
            self._landed(key, entry, data)
            self._fill()
            if entry.waited:  # a wake-up costs the reader's thread a switch: only its span's
                self._done.notify_all()

    def _start_threads(self) -> None:
        while len(self._started) < self._threads:
            thread = threading.Thread(
                target=self._run, name=f"indextar-prefetch-{len(self._started)}", daemon=True
            )
            self._started.append(thread)
            thread.start()

    def _next_chunk(self) -> list[tuple[K, _Entry]]:
        """The next queued spans that fit in the budget, in the order wanted."""
        chunk: list[tuple[K, _Entry]] = []
        # Spread a short queue over the threads: more requests in flight, not fewer calls.
        size = max(1, min(self._chunk, -(-len(self._queue) // self._threads)))
        while self._queue and len(chunk) < size:
            key, entry = self._queue[0]
            if entry.state != _QUEUED or self._entries.get(key) is not entry:
                self._queue.popleft()  # taken or forgotten while queued
                continue
            if self._held + self._flight + entry.length > self.budget:
                break
            self._queue.popleft()
            entry.state = _FLIGHT
            self._flight += entry.length
            chunk.append((key, entry))
        self._peak = max(self._peak, self._held + self._flight)
        return chunk

    def _run(self) -> None:
        while True:
            with self._lock:
                chunk = self._next_chunk()
                while not chunk and not self._closed:
                    self._work.wait()
                    chunk = self._next_chunk()
                if self._closed:
                    return
            entries = [entry for _, entry in chunk]
            try:
                got: list[SpanBytes | None] = list(
                    self._fetch(
                        [e.source for e in entries],
                        [e.offset for e in entries],
                        [e.length for e in entries],
                    )
                )
            except Exception as e:  # the reader's own fetch raises it, or succeeds
                log.debug("read-ahead of %d spans failed: %s: %s", len(chunk), type(e).__name__, e)
                got = [None] * len(chunk)
            with self._lock:
                for (key, entry), data in zip(chunk, got):
                    self._landed(key, entry, data)
                self._done.notify_all()
                self._wake()  # the budget they held is the loop's too
