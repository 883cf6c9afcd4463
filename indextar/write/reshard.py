"""Re-shard: copy samples' byte spans from indexed shards into new shards.

Nothing is decoded or re-encoded: each sample's span ``[start_offset, end_offset)``
is a valid tar stream of its members and is copied as is, one ``pread`` per sample
(measured against a read-only mmap: no slower, and no mapping to manage). Members keep
their headers, names and order; only their offsets change, and the output's
index is computed from the new offsets while the shards are written.

With ``shuffle=True`` samples are written in one global random order, seeded, so
that readers that only shuffle within a buffer see well-mixed shards.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from ..errors import WriterError
from ..index.members import MemberTable, load_members
from ..index.opener import shard_source, usable_index
from ..index.shard import PathLike, ShardIndex
from ..source.base import ByteSource
from .sample import TarSample
from .shardwriter import ShardWriter

__all__ = ["ReshardResult", "reshard", "span_sample"]

log = logging.getLogger(__name__)

_PROGRESS_EVERY = 1024


@dataclass(frozen=True, slots=True)
class ReshardResult:
    """What :func:`reshard` wrote."""

    shards: list[str]
    samples: int
    bytes: int
    seconds: float


def span_sample(table: MemberTable, sample: int, fd: int | ByteSource) -> TarSample:
    """Sample ``sample`` of ``table`` as a :class:`TarSample`, read from the shard open as
    ``fd`` (or from the byte source of a compressed shard's uncompressed bytes).

    One read of the sample's span when its members are contiguous (the normal
    case); one read per member when other entries (a directory, a skipped name)
    lie between them, so that only the members are copied.
    """
    members = table.members_of(sample)
    lo, hi = members.start, members.stop
    headers = table.header_offsets[lo:hi].tolist()
    datas = table.data_offsets[lo:hi].tolist()
    sizes = table.sizes[lo:hi].tolist()
    ends = [d + -(-s // 512) * 512 for d, s in zip(datas, sizes)]
    pread = _pread(fd)
    start, end = int(table.start_offset[sample]), int(table.end_offset[sample])
    if all(e == h for e, h in zip(ends, headers[1:])) and ends[-1] == end and headers[0] == start:
        parts: tuple[bytes, ...] = (pread(end - start, start),)
        rel_headers = [h - start for h in headers]
        rel_datas = [d - start for d in datas]
        nbytes = end - start
    else:
        parts = tuple(pread(e - h, h) for h, e in zip(headers, ends))
        rel_headers, rel_datas, nbytes = [], [], 0
        for h, d, e in zip(headers, datas, ends):
            rel_headers.append(nbytes)
            rel_datas.append(nbytes + d - h)
            nbytes += e - h
    return TarSample(
        key=table.keys[sample],
        parts=parts,
        names=tuple(table.names[lo:hi]),
        header_offsets=tuple(rel_headers),
        data_offsets=tuple(rel_datas),
        sizes=tuple(sizes),
        nbytes=nbytes,
    )


def _pread(fd: int | ByteSource) -> Callable[[int, int], bytes]:
    """``pread(length, offset)`` on a descriptor, or on a byte source."""
    if isinstance(fd, int):
        return functools.partial(os.pread, fd)
    return lambda length, offset: fd.read(offset, length)


def _open_source(index: ShardIndex, stack: ExitStack) -> int | ByteSource:
    """A plain local shard's descriptor; else a source of the uncompressed bytes."""
    if not index.meta.compression and not index.location.remote:
        return stack.enter_context(open(index.shard, "rb", buffering=0)).fileno()
    source = shard_source(index)
    stack.callback(source.close)
    return source


def reshard(
    shards: Sequence[PathLike],
    pattern: str,
    *,
    maxcount: int = 100_000,
    maxsize: float = 3e9,
    shuffle: bool = False,
    seed: int = 0,
    start_shard: int = 0,
    index_dir: PathLike | None = None,
    manifest: PathLike | None = None,
    progress: Callable[[int, int], None] | None = None,
    compress: str | None = None,
) -> ReshardResult:
    """Copy every sample of ``shards`` into new indexed shards named by ``pattern``.

    Parameters
    ----------
    shards
        Source shards, in order: local paths, whose indexes are built first if missing,
        or URLs, whose indexes must exist (read by ranged requests). They may be
        compressed (a ``.tar.gz`` or a per-sample or multi-frame ``.tar.zst``).
    pattern, maxcount, maxsize, start_shard, manifest, compress
        As for :class:`~indextar.ShardWriter`.
    shuffle, seed
        Write samples in a seeded global random order instead of source order.
    index_dir
        Where the source shards' indexes live (outputs are indexed next to themselves).
    progress
        Called now and then with ``(samples, bytes)`` written since the last call.

    Raises
    ------
    WriterError
        If two source samples with the same key would land in one output shard.
    """
    began = time.perf_counter()
    indexes = [usable_index(shard, index_dir=index_dir) for shard in shards]
    tables = [load_members(index) for index in indexes]
    counts = np.asarray([len(t) for t in tables], dtype=np.int64)
    source_of = np.repeat(np.arange(len(tables)), counts)
    sample_of = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(source_of))
        source_of, sample_of = source_of[order], sample_of[order]
    total_bytes = 0
    pending_samples = pending_bytes = 0
    with ExitStack() as stack:
        writer = stack.enter_context(
            ShardWriter(
                pattern,
                maxcount=maxcount,
                maxsize=maxsize,
                start_shard=start_shard,
                manifest=manifest,
                encoder=False,
                compress=compress,
            )
        )
        files = [_open_source(index, stack) for index in indexes]
        for source, sample in zip(source_of.tolist(), sample_of.tolist()):
            table = tables[source]
            try:
                nbytes = writer.append(span_sample(table, sample, files[source]))
            except WriterError as e:
                raise WriterError(
                    f"{e} (copying sample {sample} of {table.shard!r}; keys must be unique "
                    "within an output shard)"
                ) from e
            total_bytes += nbytes
            pending_samples += 1
            pending_bytes += nbytes
            if progress is not None and pending_samples >= _PROGRESS_EVERY:
                progress(pending_samples, pending_bytes)
                pending_samples = pending_bytes = 0
    if progress is not None and pending_samples:
        progress(pending_samples, pending_bytes)
    return ReshardResult(
        shards=writer.shards,
        samples=len(source_of),
        bytes=total_bytes,
        seconds=time.perf_counter() - began,
    )
