"""A dataset's read-ahead of remote samples, one per process.

A batch from :class:`~indextar.order.readahead.ReadAheadBatches` carries the indices of
the next batches. :meth:`ReadAhead.announce` hands this process's share of them to a
:class:`~indextar.source.prefetch.Prefetcher`, which keeps their spans in flight while
batches are built; a batch then :meth:`~ReadAhead.take_many` s its remote samples' spans
from it and fetches the others itself. The bytes a read takes go through the same
checks as a direct fetch's (``OpenShard.read(local, span)``: the span's own headers).

Which batches are this process's: a DataLoader with ``W`` workers sends batch ``n`` to
worker ``n mod W``, so a worker that gets batch ``n`` announces ``n + W, n + 2W, ...``.
A wrong guess costs budget, never a wrong sample: what is asked and not held is
fetched directly, and what is held and not asked is dropped when a later batch comes.

Nothing here is state to checkpoint or to pickle: a process (a spawned worker, a
forked one, the main process after a pickle) starts with an empty read-ahead and makes
its prefetcher and threads on the first hinted batch. A DataLoader worker then has its
C heap keep what it frees (:func:`~indextar.source.heap.keep_freed_heap`): a batch's
spans and samples, freed, would otherwise go back to the kernel and be faulted in again
at the next one; and leaves the objects it has then out of its garbage collector's
walks (:func:`~indextar.source.heap.freeze_startup_objects`). The training process's
heap is the user's, and is left as it is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..order.readahead import Hint
from ..source import prefetch
from ..source.base import ByteSource, SpanBytes, fork_generation
from ..source.frames import FramedSource
from ..source.fsspec_internals import default_loop
from ..source.heap import freeze_startup_objects, keep_freed_heap
from ..source.prefetch import Prefetcher, PrefetchStats, SpanFetch
from ..source.remote import RangeSource

__all__ = [
    "DEFAULT_PREFETCH_BYTES",
    "PlannedSpan",
    "ReadAhead",
    "SampleKey",
    "fetchable_ahead",
    "start_on_loop",
]

DEFAULT_PREFETCH_BYTES = 256 << 20
"""Read-ahead budget per process: bytes held and in flight together."""

SampleKey = tuple[int, int]
"""``(shard number, sample number within the shard)``."""

PlannedSpan = tuple[SampleKey, ByteSource, int, int]
"""A span to fetch ahead: ``(key, source, offset, length)``."""


def fetchable_ahead(source: ByteSource) -> bool:
    """Whether a background thread may fetch spans of ``source``: ranged reads of an
    object, plain or in frames (not a ``.tar.gz`` read from seek points, one stream)."""
    raw = source.raw if isinstance(source, FramedSource) else source
    return isinstance(raw, RangeSource)


def start_on_loop(
    source: ByteSource, offset: int, length: int
) -> Callable[[], Awaitable[SpanBytes]] | None:
    """How the prefetcher fetches a plain remote shard's span on fsspec's event loop
    (:meth:`RangeSource.range_coroutine`); None for others (its threads fetch those)."""
    return source.range_coroutine(offset, length) if isinstance(source, RangeSource) else None


def _in_worker() -> bool:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return False
    return get_worker_info() is not None


def _workers() -> int:
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 1
    info = get_worker_info()
    return 1 if info is None else max(1, info.num_workers)


class ReadAhead:
    """One dataset's read-ahead in this process.

    Parameters
    ----------
    budget
        Bytes held and in flight together (``0``: no read-ahead).
    fetch
        How chunks of spans are fetched.
    in_flight
        Spans in flight at once (default :data:`~indextar.source.prefetch.DEFAULT_IN_FLIGHT`).
    """

    def __init__(self, budget: int, fetch: SpanFetch, *, in_flight: int | None = None) -> None:
        self.budget = budget
        self.fetch = fetch
        self.in_flight = in_flight
        self._prefetcher: Prefetcher[SampleKey] | None = None
        self._generation = -1
        self._token: int | None = None
        self._announced = -1  # the last batch number handed to the prefetcher

    def __getstate__(self) -> dict[str, Any]:
        return {"budget": self.budget, "fetch": self.fetch, "in_flight": self.in_flight}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def _current(self) -> Prefetcher[SampleKey] | None:
        """This process's prefetcher (a forked child's parent's has no threads here)."""
        if self._generation != fork_generation():
            self._prefetcher, self._generation, self._token = None, fork_generation(), None
        return self._prefetcher

    def announce(
        self, hint: Hint, plan: Callable[[npt.NDArray[np.int64]], Iterable[PlannedSpan]]
    ) -> None:
        """Hand the prefetcher the spans of this process's batches in ``hint``;
        ``plan(indices)`` gives the ``(key, source, offset, length)`` of those of
        ``indices`` to fetch ahead."""
        if self.budget <= 0:
            return
        prefetcher = self._current()
        if prefetcher is None:
            if _in_worker():  # a worker's heap is indextar's; the training process's is not
                keep_freed_heap()  # its spans and samples, freed each batch, are not given back
                freeze_startup_objects()  # and its collector never walks what it inherited
            prefetcher = self._prefetcher = Prefetcher(
                self.fetch,
                budget=self.budget,
                in_flight=self.in_flight or prefetch.DEFAULT_IN_FLIGHT,
                chunk=prefetch.DEFAULT_CHUNK,
                start=start_on_loop,
                loop=default_loop,
            )
        if hint.token != self._token:  # a new pass: what was wanted before is not
            prefetcher.clear()
            self._token, self._announced = hint.token, hint.number
        prefetcher.forget_before(hint.number)
        workers = _workers()
        for number, indices in hint.batches():
            if number <= self._announced or (number - hint.number) % workers:
                continue
            prefetcher.want(list(plan(indices)), number)  # shards opened unlocked
            self._announced = number

    def take_many(self, keys: list[SampleKey]) -> list[SpanBytes | None]:
        """Each sample's span if it was fetched ahead (waiting if in flight), else
        ``None``: a batch's, under one hold of the prefetcher's lock."""
        prefetcher = self._current()
        return [None] * len(keys) if prefetcher is None else prefetcher.take_many(keys)

    def stats(self) -> PrefetchStats | None:
        """This process's read-ahead figures; ``None`` before its first hinted batch."""
        prefetcher = self._current()
        return None if prefetcher is None else prefetcher.stats()

    def close(self) -> None:
        """Stop this process's fetching threads and drop what they hold."""
        prefetcher = self._current()
        if prefetcher is not None:
            prefetcher.close()
        self._prefetcher, self._token = None, None
