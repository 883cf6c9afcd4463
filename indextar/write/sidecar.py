"""``write_sidecar``: new members for an existing dataset, in shards of their own.

A function of each sample (an embedding, a caption, a score) is written as a sidecar
shard set keyed like the source, for :meth:`IndexedTarDataset.join
<indextar.IndexedTarDataset.join>` to read beside it: nothing of the source is
rewritten. Sidecar shard ``n`` holds source shard ``n``'s samples, in order, so the
output depends only on the source and the function: shards are written by parallel
worker processes, one source shard each, by :class:`~indextar.TarWriter` (a
deterministic tar, indexed as it is written, renamed into place when whole). A run
that is killed resumes: a sidecar shard whose index opens and is fresh is kept, any
other is written again.

The dataset is used through what every :class:`~indextar.IndexedTarDataset` has
(``shards``, ``shard_starts``, ``shard_index(n).keys()``, ``__getitems__``), so that
``write/`` does not import ``read/``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..errors import IndextarError, WriterError
from ..index.shard import open_index
from .tarwriter import TarWriter

__all__ = ["write_sidecar", "SidecarShard"]

log = logging.getLogger(__name__)

SampleFunction = Callable[[Any], Mapping[str, Any] | None]
BatchFunction = Callable[[list[Any]], Sequence[Mapping[str, Any] | None]]


class _Source(Protocol):
    """What ``write_sidecar`` reads of the source dataset."""

    @property
    def shards(self) -> tuple[str, ...]: ...

    @property
    def shard_starts(self) -> npt.NDArray[np.int64]: ...

    def shard_index(self, shard_no: int) -> Any: ...

    def __getitems__(self, indices: Sequence[int]) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class SidecarShard:
    """One sidecar shard: its path, its source shard and the samples it holds."""

    path: str
    source: str
    samples: int
    resumed: bool
    """Whether it was there, whole and indexed, from an earlier run (not written again)."""


@dataclass(frozen=True, slots=True)
class _Job:
    shard_no: int
    path: str
    batch_size: int
    batched: bool
    compress: str | None
    checksums: bool | str


def _finished(path: str) -> int | None:
    """The sample count of a whole, indexed sidecar shard at ``path``; else ``None``."""
    if not os.path.exists(path):
        return None
    try:
        return len(open_index(path))
    except (IndextarError, OSError) as e:
        log.info("sidecar shard %s is written again: %s", path, e)
        return None


def _write_one(source: _Source, fn: Any, job: _Job) -> SidecarShard:
    """Sidecar shard ``job.path`` of source shard ``job.shard_no``."""
    name = source.shards[job.shard_no]
    done = _finished(job.path)
    if done is not None:
        return SidecarShard(job.path, name, done, resumed=True)
    keys = source.shard_index(job.shard_no).keys()
    start = int(source.shard_starts[job.shard_no])
    with TarWriter(job.path, compress=job.compress, checksums=job.checksums) as writer:
        for first in range(0, len(keys), job.batch_size):
            wanted = list(range(start + first, start + min(first + job.batch_size, len(keys))))
            samples = source.__getitems__(wanted)
            results = fn(samples) if job.batched else [fn(sample) for sample in samples]
            if len(results) != len(samples):
                raise WriterError(
                    f"the sidecar function gave {len(results)} results for a batch of "
                    f"{len(samples)} samples",
                    shard=name,
                )
            for key, members in zip(keys[first : first + len(samples)], results):
                if members is None:  # no member for this sample: a left join finds none
                    continue
                if "__key__" in members and members["__key__"] != key:
                    raise WriterError(
                        f"the sidecar function gave the key {members['__key__']!r}", key=key
                    )
                writer.write({**members, "__key__": key})
        written = writer.count
    return SidecarShard(job.path, name, written, resumed=False)


_WORKER: tuple[Any, Any] | None = None  # (source, fn), set once per worker process


def _start_worker(source: Any, fn: Any) -> None:
    global _WORKER
    _WORKER = (source, fn)


def _run_in_worker(job: _Job) -> SidecarShard:
    assert _WORKER is not None
    return _write_one(*_WORKER, job)


def write_sidecar(
    dataset: Any,
    fn: SampleFunction | BatchFunction,
    pattern: str,
    *,
    workers: int | None = None,
    batch_size: int = 64,
    batched: bool = False,
    compress: str | None = None,
    checksums: bool | str = False,
) -> list[SidecarShard]:
    """Write ``fn`` of every sample of ``dataset`` as a sidecar shard set keyed like it.

    Parameters
    ----------
    dataset
        An :class:`~indextar.IndexedTarDataset` (its ``decode=``/``keys=`` give ``fn``
        its samples).
    fn
        ``fn(sample)`` gives the sample's new members, ``{extension: value}`` encoded as
        :class:`~indextar.ShardWriter` encodes them (``npy`` arrays, ``json``, ``txt``,
        ...), or ``None`` for none. With ``batched=True``, ``fn(samples)`` gives a list
        of those for a list of up to ``batch_size`` samples (an embedding model's batch).
        It must pickle for ``workers`` other than 0 (a module's function).
    pattern
        The sidecar shards' paths, one ``%`` format for the source shard's number:
        ``"clip-%06d.tar"``. Sidecar shard ``n`` holds source shard ``n``'s samples.
    workers
        Processes writing shards in parallel (default: one per CPU, at most one per
        shard); ``0`` writes them in this process.
    compress, checksums
        As for :class:`~indextar.TarWriter`.

    Returns
    -------
    list[SidecarShard]
        One per non-empty source shard, in order; ``resumed`` for those an earlier
        run had finished.

    Raises
    ------
    WriterError
        If the pattern has no ``%`` format for the shard number, or ``fn`` gives a
        wrong number of results or another key (the shard and key named).
    """
    try:
        paths = [pattern % n for n in range(len(dataset.shards))]
    except (TypeError, ValueError) as e:
        raise WriterError(
            f"sidecar pattern {pattern!r} needs one %-format for the source shard's number, "
            f"such as 'clip-%06d.tar' ({e})"
        ) from None
    if len(set(paths)) != len(paths):
        raise WriterError(f"sidecar pattern {pattern!r} gives the same name to two shards")
    if batch_size < 1:
        raise WriterError(f"batch_size must be at least 1, got {batch_size}")
    sizes = np.diff(np.asarray(dataset.shard_starts, dtype=np.int64)).tolist()
    jobs = [
        _Job(n, paths[n], batch_size, batched, compress, checksums)
        for n, size in enumerate(sizes)
        if size > 0
    ]
    for job in jobs:
        Path(job.path).parent.mkdir(parents=True, exist_ok=True)
    count = min(len(jobs), os.cpu_count() or 1) if workers is None else workers
    if count <= 0 or len(jobs) <= 1:
        written = [_write_one(dataset, fn, job) for job in jobs]
    else:
        with ProcessPoolExecutor(count, initializer=_start_worker, initargs=(dataset, fn)) as pool:
            written = list(pool.map(_run_in_worker, jobs))
    log.info(
        "sidecar %s: %d shards written, %d resumed",
        pattern,
        sum(not s.resumed for s in written),
        sum(s.resumed for s in written),
    )
    return written
