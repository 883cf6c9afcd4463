"""How a dataset reads a batch of samples from remote shards by ranged requests.

:class:`RemoteBatches` is the part of
:class:`~indextar.read.dataset.IndexedTarDataset` that fetches a batch's remote spans:
those fetched ahead (:mod:`indextar.read.readahead`) are taken, the others fetched
together, all requests in flight at once; every span then goes through
``OpenShard.read(local, span)``, the same checks as any read. It also plans which
spans of a hint's batches to fetch ahead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ..index.opener import OpenOptions
from ..source.base import SpanBytes
from ..source.local import LocalFileSource
from .pool import BatchPool
from .protocols import SampleBuild, Unbuilt
from .readahead import PlannedSpan, ReadAhead, fetchable_ahead
from .remote_options import fetch_spans
from .sample import SampleBuilder
from .shard import Lease, LRUCache, OpenShard

__all__ = ["RemoteBatches"]


class RemoteBatches:
    """Remote batch reads of a dataset that has these attributes and ``_lease``."""

    shards: tuple[str, ...]
    max_open_shards: int
    _ahead: ReadAhead
    _options: OpenOptions
    _ranged: frozenset[int]
    _pool: BatchPool
    _builder: SampleBuilder
    shard_starts: npt.NDArray[np.int64]
    _len: int
    _open: LRUCache[int, OpenShard]

    def _lease(self, shard_no: int) -> Lease[OpenShard]:
        raise NotImplementedError

    def read_into(
        self,
        out: list[Any],
        ats: list[int],
        shard_no: int,
        locals_: list[int],
        positions: list[int],
        extra: dict[str, Any] | None,
        build: SampleBuild | None,
    ) -> None:
        raise NotImplementedError

    def read_unbuilt(self, positions: npt.NDArray[np.int64]) -> list[Unbuilt]:
        """Each sample at ``positions`` (in range) as ``(fields, members)``, not decoded:
        one grouped read per local shard, or every remote span in flight at once. For
        views that merge members before building them (a joined view)."""
        shard_nos = self.shard_starts.searchsorted(positions, side="right") - 1
        shard_list = shard_nos.tolist()
        local_list = (positions - self.shard_starts[shard_nos]).tolist()
        position_list = positions.tolist()
        if self._ranged and not self._ranged.isdisjoint(shard_list):
            spans = self._fetch_spans(shard_list, local_list)
            return self._split(shard_list, local_list, position_list, spans)
        groups: dict[int, list[int]] = {}
        for at, shard_no in enumerate(shard_list):
            groups.setdefault(shard_no, []).append(at)
        out: list[Any] = [None] * len(position_list)
        for shard_no, group in groups.items():
            self.read_into(out, group, shard_no, local_list, position_list, None, None)
        return out

    def _read_remote_batch(
        self,
        shard_nos: list[int],
        locals_: list[int],
        positions: list[int],
        extra: dict[str, Any] | None,
    ) -> list[Any]:
        read = self._split(shard_nos, locals_, positions, self._fetch_spans(shard_nos, locals_))
        if extra:
            for fields, _ in read:
                fields.update(extra)
        return self._pool.map(self._builder.build, read)

    def _fetch_spans(self, shard_nos: list[int], locals_: list[int]) -> list[SpanBytes | None]:
        """The remote samples' bytes, fetched ahead or all requests in flight at once;
        ``None`` for local ones."""
        spans: list[SpanBytes | None] = [None] * len(shard_nos)
        wanted: dict[int, tuple[list[int], list[int]]] = {}  # shard_no: (ats, locals) to fetch
        ranged = [at for at, n in enumerate(shard_nos) if n in self._ranged]
        taken = self._ahead.take_many([(shard_nos[at], locals_[at]) for at in ranged])
        for at, span in zip(ranged, taken):
            spans[at] = span
            if span is None:
                group = wanted.setdefault(shard_nos[at], ([], []))
                group[0].append(at)
                group[1].append(locals_[at])
        if not wanted:
            return spans
        leases: dict[int, Lease[OpenShard]] = {}  # one a shard, for the fetch
        ats, sources, offsets, lengths, keys = [], [], [], [], []  # grouped by shard
        try:
            for n, (shard_ats, shard_locals) in wanted.items():
                leases[n] = self._lease(n)
                shard = leases[n].value
                if isinstance(shard.source, LocalFileSource):
                    continue  # the cache holds it whole (cache_fill="ranges"): it reads itself
                starts, shard_lengths = shard.spans(shard_locals)
                ats += shard_ats
                sources += [shard.source] * len(shard_ats)
                offsets += starts
                lengths += shard_lengths
                keys += shard.keys(shard_locals)
            if not ats:
                return spans
            fetched = fetch_spans(  # compressed shards: their frames, or from their seek points
                sources, offsets, lengths, max_in_flight=self._options.source.max_in_flight,
                keys=keys,
            )  # fmt: skip
        finally:
            for lease in leases.values():
                self._open.release(lease)
        for at, data in zip(ats, fetched):
            spans[at] = data
        return spans

    def _plan_ahead(self, indices: npt.NDArray[np.int64]) -> Iterator[PlannedSpan]:
        """The remote spans of ``indices`` to fetch ahead, shard by shard: in shards
        already open, or while fewer than ``max_open_shards`` are (a guess never evicts
        a shard)."""
        positions = indices[(indices >= 0) & (indices < self._len)]
        shard_nos = self.shard_starts.searchsorted(positions, side="right") - 1
        locals_ = positions - self.shard_starts[shard_nos]
        order = np.argsort(shard_nos, kind="stable")  # grouped by shard, in order within
        groups = np.split(order, np.flatnonzero(np.diff(shard_nos[order])) + 1)
        groups = [group for group in groups if group.size]  # none, for an empty hint
        groups.sort(key=lambda group: int(group[0]))  # in the order of their first samples
        for group in groups:
            n = int(shard_nos[group[0]])
            if n not in self._ranged or (
                n not in self._open and len(self._open) >= self.max_open_shards
            ):
                continue
            try:
                lease = self._lease(n)
            except Exception:  # the batch that reads it raises it, if it comes
                continue
            # Released at once: a remote source closed by an eviction only forgets its
            # checks, and reopens for the threads that fetch ahead.
            self._open.release(lease)
            shard = lease.value
            if not fetchable_ahead(shard.source):
                continue
            wanted = locals_[group]
            for local, start, length in zip(wanted.tolist(), *shard.spans(wanted)):
                yield ((n, local), shard.source, start, length)

    def _split(
        self,
        shard_nos: list[int],
        locals_: list[int],
        positions: list[int],
        spans: list[SpanBytes | None],
    ) -> list[Unbuilt]:
        """Each sample's fields and undecoded members, from its span already fetched
        (``None``: read now); one lease a shard."""
        read: list[Unbuilt] = []
        leases: dict[int, Lease[OpenShard]] = {}
        try:
            for n, local, position, span in zip(shard_nos, locals_, positions, spans):
                lease = leases.get(n)
                if lease is None:
                    lease = leases[n] = self._lease(n)
                key, members = lease.value.read(local, span)
                fields = {"__key__": key, "__shard__": lease.value.shard, "__index__": position}
                read.append((fields, members))
        finally:
            for lease in leases.values():
                self._open.release(lease)
        return read
