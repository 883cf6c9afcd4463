"""A batch's samples decoded in a few threads: ``IndexedTarDataset(decode_threads=...)``.

Pillow releases the GIL while it decodes and resizes, so threads let one DataLoader
worker keep more than one core busy. The pool is per process and made on first use:
it is dropped when the dataset is pickled (``spawn`` workers) and made anew in a
forked child, whose inherited pool has no threads behind it.

``"auto"`` gives each process the cores it may run on (``os.sched_getaffinity``)
divided among the DataLoader's workers, at least one: with as many workers as cores
(the common case on small machines) that is one thread, i.e. no pool at all, so it
never adds threads to cores that are already busy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Literal, TypeVar

from ..source.base import fork_generation

__all__ = ["DecodeThreads", "BatchPool", "resolve_threads"]

DecodeThreads = int | Literal["auto"]
"""``decode_threads=``: a number of threads per process (0 or 1: none), or ``"auto"``."""

T = TypeVar("T")


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _loader_workers() -> int:
    """How many DataLoader workers share this machine; 1 outside a worker."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return 1
    info = get_worker_info()
    return 1 if info is None else max(1, info.num_workers)


def resolve_threads(setting: DecodeThreads) -> int:
    """The threads ``setting`` means in this process (1: decode in the calling thread)."""
    if setting == "auto":
        return max(1, _cpus() // _loader_workers())
    return max(1, setting)


def check_threads(setting: object) -> DecodeThreads:
    """``decode_threads=`` checked: a non-negative int or ``"auto"``."""
    if setting == "auto" or (type(setting) is int and setting >= 0):
        return setting
    raise ValueError(f"decode_threads= must be a non-negative int or 'auto'; got {setting!r}")


class BatchPool:
    """Run ``fn`` over a batch in this process's decode threads, results in order."""

    def __init__(self, setting: DecodeThreads):
        self.setting = check_threads(setting)
        self._executor: ThreadPoolExecutor | None = None
        self._threads = 0  # resolved on first use, in the process that uses it
        self._generation = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"setting": self.setting}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["setting"])  # type: ignore[misc]

    def threads(self) -> int:
        """The threads this process decodes a batch in (1: no pool)."""
        if self._generation != fork_generation():
            # A forked child: the parent's executor has no threads here; never shut it
            # down (that would wait on threads that do not exist), just let it go.
            self._executor = None
            self._threads = resolve_threads(self.setting)
            self._generation = fork_generation()
        return self._threads

    def map(self, fn: Callable[..., T], args: Sequence[tuple[Any, ...]]) -> list[T]:
        """``[fn(*a) for a in args]``, in contiguous chunks over the threads; the calling
        thread runs the first. The first failing item, in order, raises."""
        threads = min(self.threads(), len(args))
        if threads <= 1:
            return [fn(*a) for a in args]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, "indextar-decode")
        step = -(-len(args) // threads)
        chunks = [args[at : at + step] for at in range(0, len(args), step)]
        futures: list[Future[list[T]]] = [
            self._executor.submit(_run_chunk, fn, chunk) for chunk in chunks[1:]
        ]
        try:
            results = _run_chunk(fn, chunks[0])
        except BaseException:
            wait(futures)  # no thread still decoding this batch when the error surfaces
            raise
        for future in futures:
            results.extend(future.result())
        return results

    def close(self) -> None:
        """Stop this process's threads (a new pool is made on the next batch)."""
        if self._executor is not None and self._generation == fork_generation():
            self._executor.shutdown(wait=True)
        self._executor = None


def _run_chunk(fn: Callable[..., T], chunk: Sequence[tuple[Any, ...]]) -> list[T]:
    return [fn(*a) for a in chunk]
