"""Batches that carry the next batches' indices, for a dataset's read-ahead.

A DataLoader hands ``dataset.__getitems__`` exactly the list its ``batch_sampler``
yields, pickled to the worker as it is. :class:`ReadAheadBatches` yields
:class:`HintedBatch` lists: the batch's indices, plus a :class:`Hint` naming the next
``depth`` batches. A dataset that reads remote shards starts fetching those while the
batch is built (``IndexedTarDataset(prefetch_bytes=...)``); any other dataset sees a
plain list.

The hint is a prediction, never state: the batches themselves come from the sampler
exactly as ``BatchSampler(sampler, batch_size, drop_last)`` would give them, and the
sampler's ``consumed`` counts only what was handed out. :class:`ResumableSampler` and
:class:`BucketBatchSampler` orders are pure functions of seed, epoch and position, so
the future is read from a shallow copy of the sampler; any other sampler is read
``depth`` batches ahead of what is handed out.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .buckets import BucketBatchSampler
from .sampler import ResumableSampler

__all__ = ["DEFAULT_DEPTH_SAMPLES", "Hint", "HintedBatch", "ReadAheadBatches"]

DEFAULT_DEPTH_SAMPLES = 1024
"""Samples the hint covers by default (``depth`` is this over the batch size)."""


@dataclass(frozen=True, slots=True)
class Hint:
    """What is known of the batches after one batch.

    Attributes
    ----------
    token
        Names one pass over the batches; a new pass has a new token.
    number
        The batch's number in its pass (0 for the first).
    ahead
        The indices of batches ``number + 1, number + 2, ...``, concatenated.
    sizes
        Their batch sizes, in order.
    """

    token: int
    number: int
    ahead: npt.NDArray[np.int64]
    sizes: tuple[int, ...]

    def batches(self) -> Iterator[tuple[int, npt.NDArray[np.int64]]]:
        """``(batch number, indices)`` of each batch ahead."""
        start = 0
        for step, size in enumerate(self.sizes, self.number + 1):
            yield step, self.ahead[start : start + size]
            start += size


class HintedBatch(list):  # type: ignore[type-arg]
    """A batch's indices (a ``list`` of ``int``), with the :class:`Hint` of the next ones."""

    __slots__ = ("hint",)

    def __init__(self, indices: Iterable[int], hint: Hint | None = None) -> None:
        super().__init__(indices)
        self.hint = hint

    def __reduce__(self) -> tuple[Any, ...]:
        return (HintedBatch, (list(self), self.hint))


class ReadAheadBatches:
    """A DataLoader ``batch_sampler`` whose batches tell the dataset what comes next.

    Parameters
    ----------
    sampler
        A sampler of indices (``ResumableSampler``, or any iterable of ``int``), or,
        with ``batch_size=None``, a sampler of batches (``BucketBatchSampler``).
    batch_size
        Indices per batch; ``None`` when ``sampler`` yields batches.
    drop_last
        Drop a last batch shorter than ``batch_size``.
    depth
        Batches each hint names. Default: enough for :data:`DEFAULT_DEPTH_SAMPLES`
        samples. The dataset's ``prefetch_bytes`` bounds what is fetched of them.

    Examples
    --------
    >>> batches = ReadAheadBatches(range(5), 2, depth=1)
    >>> [(list(b), b.hint.ahead.tolist()) for b in batches]
    [([0, 1], [2, 3]), ([2, 3], [4]), ([4], [])]
    """

    def __init__(
        self,
        sampler: Iterable[Any],
        batch_size: int | None,
        *,
        drop_last: bool = False,
        depth: int | None = None,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 or None, got {batch_size}")
        if depth is not None and depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = bool(drop_last)
        per_batch = batch_size or getattr(sampler, "batch_size", None) or 1
        self.depth = depth if depth is not None else -(-DEFAULT_DEPTH_SAMPLES // per_batch)

    def __len__(self) -> int:
        count = len(self.sampler)  # type: ignore[arg-type]
        if self.batch_size is None:
            return count
        return count // self.batch_size if self.drop_last else -(-count // self.batch_size)

    def _batches(self, sampler: Iterable[Any]) -> Iterator[list[int]]:
        if self.batch_size is None:
            return (list(batch) for batch in sampler)
        return _batched(iter(sampler), self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[HintedBatch]:
        token = int.from_bytes(os.urandom(8), "little")
        pure = isinstance(self.sampler, (ResumableSampler, BucketBatchSampler))
        # Taken at the first next(), as the sampler's own pass begins: both start together.
        ahead = self._batches(copy.copy(self.sampler)) if pure else None
        handed = self._batches(self.sampler)
        window: deque[list[int]] = deque()
        if ahead is None:  # read ahead of what is handed out, in one iterator
            ahead, handed = handed, _popping(window)
        for number in itertools.count():
            while len(window) < self.depth + 1:
                batch = next(ahead, None)
                if batch is None:
                    break
                window.append(batch)
            indices = next(handed, None)
            if indices is None:
                return
            if pure:
                predicted = window.popleft() if window else None
                if predicted != indices:  # never happens to a pure order; hint no more
                    window.clear()
                    ahead = iter(())
            future = list(window)[: self.depth]
            flat = np.fromiter(itertools.chain.from_iterable(future), np.int64)
            hint = Hint(token, number, flat, tuple(map(len, future)))
            yield HintedBatch(indices, hint)

    def __repr__(self) -> str:
        return (
            f"ReadAheadBatches({self.sampler!r}, batch_size={self.batch_size}, "
            f"drop_last={self.drop_last}, depth={self.depth})"
        )


def _batched(indices: Iterator[int], size: int, drop_last: bool) -> Iterator[list[int]]:
    while True:
        batch = list(itertools.islice(indices, size))
        if not batch or (drop_last and len(batch) < size):
            return
        yield batch


def _popping(window: deque[list[int]]) -> Iterator[list[int]]:
    while window:
        yield window.popleft()
