"""One opened shard: its sample table in flat numpy arrays and its byte source.

A sample's members are contiguous in the tar, so a sample is one read of its span
``[start_offset, end_offset)``, split into members by offsets relative to the span,
after a check that the span still begins with the sample's own headers
(:mod:`indextar.tar.spancheck`) and, where the index records checksums, that the span
hashes to its sample's (:mod:`indextar.index.checksums`). Keys are one ``bytes`` blob
of raw names plus offsets, not a list of ``str``: a DataLoader worker that reads them
copies no per-sample Python objects.

The open shards of a process are shared by its threads (:class:`LRUCache`): a
least-recently-used map whose entries are leased to the reads that use them.

Several threads read one dataset at once (Grain's reading threads, Ray, a
``ThreadPoolExecutor``). Each read takes a :class:`Lease` of its shard and releases it
when its bytes are copied out. An entry pushed out of the map while leased is closed by
its last reader's release, never under a reader: closing it there would unmap the
bytes being read, or free its descriptor for another shard's open. Open shards are
therefore at most ``capacity`` plus those evicted but still being read (at most one
per reading thread).

Taking and giving back a lease of an entry in the map takes no lock: each is a few
operations the GIL makes atomic (a dict look-up, a list append or pop), ordered so
that an eviction never misses a reader: a reader appends itself to the entry's holders
and then checks that the entry was not evicted; the evictor marks the entry evicted
and then checks for holders (the last of which closes it). A lock guards inserts,
evictions and the one close of an evicted entry: no I/O and no close under it. A
forked child replaces the locks of the caches it inherits, and forgets the leases of
its parent's threads.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import IndexFormatError, RemoteReadError, StaleIndexError
from ..index.checksums import hasher, mismatch_error
from ..index.opener import OpenedEntry
from ..source.base import ByteSource, Span, SpanBytes, checked_key, split_members

log = logging.getLogger(__name__)

__all__ = ["OpenShard", "LRUCache", "Lease"]


@dataclass(frozen=True, slots=True)
class OpenShard:
    """A shard ready for random access, in one process.

    Attributes
    ----------
    shard
        The shard's path or URL.
    source
        Where its bytes are read from.
    samples, members, key_blob, ext_names
        The shard's :class:`~indextar.index.arrays.ShardArrays`, unpacked: a read then looks
        up one attribute, not two.
    check_names
        Whether a read checks that the span's headers name the sample's key, or (where
        the index found a global PAX header naming members, ``IndexMeta.span_names``)
        only their checksums.
    remote
        Whether the shard is a remote object, whose span that fails its checksum is
        read once more (its location says so).
    checksums, checksum
        Each sample's checksum and their algorithm, where the index records them: a
        read then hashes the sample's span before splitting it, and refuses a span that
        does not match (:class:`~indextar.ChecksumMismatchError`). ``None`` and ``""``
        where it records none.
    """

    shard: str
    source: ByteSource
    samples: npt.NDArray[np.int64]
    members: npt.NDArray[np.int64]
    key_blob: bytes
    ext_names: tuple[str, ...]
    check_names: bool = True
    remote: bool = False
    checksums: npt.NDArray[np.uint64] | None = None
    checksum: str = ""

    @classmethod
    def load(cls, opened: OpenedEntry) -> OpenShard:
        """The shard :func:`~indextar.index.opener.open_entry` opened, its arrays read
        from its index."""
        index, arrays, source = opened.index, opened.arrays, opened.source
        if index.meta.checksum and arrays.checksums is None:
            raise IndexFormatError(
                f"index {str(index.path)!r} says it records {index.meta.checksum} checksums "
                "but has none; rebuild it with build_index(shard, force=True, checksums=True)"
            )
        if index.meta.checksum:
            hasher(index.meta.checksum)  # its package is there, or an error says which
        return cls(
            shard=index.shard,
            source=source,
            samples=arrays.samples,
            members=arrays.members,
            key_blob=arrays.key_blob,
            ext_names=arrays.ext_names,
            check_names=index.meta.span_names,
            remote=index.location.remote,
            checksums=arrays.checksums if index.meta.checksum else None,
            checksum=index.meta.checksum,
        )

    def __len__(self) -> int:
        return len(self.samples)

    def span(self, local: int) -> tuple[int, int]:
        """``(offset, length)`` of sample ``local``'s bytes in the shard."""
        start, end = self.samples[local, :2].tolist()
        return start, end - start

    def spans(self, local: list[int] | npt.NDArray[np.int64]) -> tuple[list[int], list[int]]:
        """The offsets and lengths of samples ``local``'s bytes (one numpy look-up)."""
        starts, ends = self.samples[local, 0], self.samples[local, 1]
        return starts.tolist(), (ends - starts).tolist()

    def read(
        self, local: int, span: SpanBytes | None = None
    ) -> tuple[str, list[tuple[str, bytes]]]:
        """Sample ``local``'s key and ``(extension, data)`` members, in one read.

        ``span``, if given, is the sample's bytes already fetched (remote batches); if
        its headers are not the sample's, the source reads it again (a remote source
        retries a wrong answer and refuses a changed object).
        """
        if self.checksums is not None:
            try:
                return self._read_checked(local, span)
            except RemoteReadError as e:
                raise e.for_sample(self.key(local)) from e
        start, end, first, count, key_start, key_end = self.samples[local].tolist()
        names = self.ext_names
        key = self.key_blob[key_start:key_end]
        try:
            if span is not None:  # a failed check reads it again: the source tells a
                # changed shard from a wrong answer
                try:
                    members = split_members(
                        span, self.members, first, count, names,
                        checked_key(key, self.check_names), shard=self.shard, offset=start,
                    )  # fmt: skip
                    return key.decode("utf-8", "surrogateescape"), members
                except StaleIndexError:
                    pass
            members = self.source.read_members(
                start, end - start, self.members, first, count, names, key,
                check_names=self.check_names,
            )  # fmt: skip
        except RemoteReadError as e:
            raise e.for_sample(key.decode("utf-8", "surrogateescape")) from e
        return key.decode("utf-8", "surrogateescape"), members

    def key(self, local: int) -> str:
        """Sample ``local``'s key."""
        key_start, key_end = self.samples[local, 4:6].tolist()
        return self.key_blob[key_start:key_end].decode("utf-8", "surrogateescape")

    def keys(self, local: list[int]) -> list[str]:
        """Samples ``local``'s keys (one numpy look-up)."""
        blob = self.key_blob
        bounds = self.samples[local, 4:6].tolist()
        return [blob[start:end].decode("utf-8", "surrogateescape") for start, end in bounds]

    def read_many(self, local: list[int]) -> list[tuple[str, list[tuple[str, bytes]]]]:
        """What :meth:`read` returns for each of the samples ``local``, with one
        ``read_many`` of their spans (local files: one size check for all)."""
        if self.checksums is not None:
            return self._read_many_checked(local)
        key_blob = self.key_blob
        rows = self.samples[local].tolist()
        spans: list[Span] = [(s, e - s, f, c, key_blob[ks:ke]) for s, e, f, c, ks, ke in rows]
        read = self.source.read_members_many(
            spans, self.members, self.ext_names, check_names=self.check_names
        )
        return [
            (span[4].decode("utf-8", "surrogateescape"), members)  # type: ignore[union-attr]
            for span, members in zip(spans, read)
        ]

    def _read_many_checked(self, local: list[int]) -> list[tuple[str, list[tuple[str, bytes]]]]:
        """:meth:`read_many` of a shard whose index records checksums: one ``read_many``
        of the spans, each then checked as :meth:`_read_checked` does."""
        spans = self.source.read_many(*self.spans(local))
        return [self._read_checked(n, span) for n, span in zip(local, spans)]

    def _read_checked(
        self, local: int, span: SpanBytes | None
    ) -> tuple[str, list[tuple[str, bytes]]]:
        """:meth:`read` of a shard whose index records checksums: the span is read
        whole, hashed, then split."""
        start, end, first, count, key_start, key_end = self.samples[local].tolist()
        key = self.key_blob[key_start:key_end]
        if span is None:
            span = self.source.read(start, end - start)
        span = self._verified(local, start, span, key)
        members = split_members(
            span, self.members, first, count, self.ext_names, checked_key(key, self.check_names),
            shard=self.shard, offset=start, name=key,
        )  # fmt: skip
        return key.decode("utf-8", "surrogateescape"), members

    def _verified(self, local: int, start: int, span: SpanBytes, key: bytes) -> SpanBytes:
        """``span`` if it hashes to sample ``local``'s checksum. A remote shard's span
        that does not is read once more (a server may answer another range, or a
        transfer be damaged past TCP's checksum); a local one is refused at once."""
        hash_ = hasher(self.checksum)
        expected = int(self.checksums[local])  # type: ignore[index]
        got = hash_(span)
        if got != expected and self.remote:
            log.warning(
                "%s: sample %r at byte offset %d does not match its %s checksum; reading "
                "it again", self.shard, key.decode("utf-8", "surrogateescape"), start,
                self.checksum,
            )  # fmt: skip
            span = self.source.read(start, len(span))
            got = hash_(span)
        if got == expected:
            return span
        raise mismatch_error(
            shard=self.shard,
            key=key.decode("utf-8", "surrogateescape"),
            offset=start,
            length=len(span),
            algorithm=self.checksum,
            expected=expected,
            got=got,
        )

    def close(self) -> None:
        """Close the byte source."""
        self.source.close()


# -- the open shards of a process, leased to the reads that use them ----------

K = TypeVar("K")
V = TypeVar("V")


class Lease(Generic[V]):
    """One cached value and the reads that hold it; whether it was evicted, and closed."""

    __slots__ = ("value", "holders", "evicted", "closed")

    def __init__(self, value: V) -> None:
        self.value = value
        self.holders: list[None] = []  # one item per read holding it: append/pop are atomic
        self.evicted = False
        self.closed = False

    @property
    def readers(self) -> int:
        """How many reads hold it."""
        return len(self.holders)


class LRUCache(Generic[K, V]):
    """A least-recently-used map of at most ``capacity`` entries, safe for threads.

    Values are leased: :meth:`acquire` (or :meth:`insert`) takes a lease, and
    :meth:`release` gives it back. ``on_evict(value)`` runs for every entry pushed out
    or cleared, once its last lease is released (the dataset closes shards there, so
    the number of open files stays bounded), outside the lock.
    """

    __slots__ = ("capacity", "_entries", "_on_evict", "_lock", "__weakref__")

    def __init__(self, capacity: int, on_evict: Callable[[V], None] | None = None):
        if capacity < 1:
            raise ValueError(f"an LRU cache needs a capacity of at least 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, Lease[V]] = OrderedDict()
        self._on_evict = on_evict
        self._lock = threading.Lock()
        _caches.add(self)

    def acquire(self, key: K) -> Lease[V] | None:
        """A lease of ``key``'s entry, marked most recently used; ``None`` if absent
        (or evicted as it was taken). No lock: see the module's docstring."""
        lease = self._entries.get(key)
        if lease is None:
            return None
        lease.holders.append(None)  # first hold it, then check: an evictor checks the other way
        if lease.evicted:
            self.release(lease)
            return None
        try:
            self._entries.move_to_end(key)
        except KeyError:  # evicted meanwhile: the lease still holds it open
            pass
        return lease

    def insert(self, key: K, value: V) -> Lease[V]:
        """A lease of ``value``, added as ``key``'s entry (evicting the least recently
        used if full); of the entry another thread added meanwhile, if any (``value``
        is then evicted at once)."""
        with self._lock:
            lease = self._entries.get(key)
            if lease is None:
                lease = self._entries[key] = Lease(value)
                evicted = self._evict_down_to(self.capacity)
            else:
                self._entries.move_to_end(key)
                evicted = [value]
            lease.holders.append(None)
        self._evicted(evicted)
        return lease

    def release(self, lease: Lease[V]) -> None:
        """Give back a lease; the last one of an evicted entry evicts its value."""
        lease.holders.pop()
        if not lease.evicted or lease.holders:
            return
        with self._lock:  # the evictor and the last readers race to close it: once
            if lease.closed or lease.holders:
                return
            lease.closed = True
        self._evicted([lease.value])

    def clear(self) -> None:
        """Evict every entry (those leased, when their last lease is released)."""
        with self._lock:
            evicted = self._evict_down_to(0)
        self._evicted(evicted)

    def _evict_down_to(self, size: int) -> list[V]:
        """Under the lock: drop the oldest entries down to ``size``; the values of
        those no read holds, to evict."""
        unleased = []
        while len(self._entries) > size:
            _, lease = self._entries.popitem(last=False)
            lease.evicted = True  # first mark it, then look for holders: see acquire
            if not lease.holders:
                lease.closed = True
                unleased.append(lease.value)
        return unleased

    def _evicted(self, values: list[V]) -> None:
        if self._on_evict is not None:
            for value in values:
                self._on_evict(value)

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # a parent's thread may have held it at the fork
        for lease in self._entries.values():
            lease.holders = []  # the parent's readers are not in this process

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        with self._lock:
            return iter(list(self._entries))


_caches: weakref.WeakSet[LRUCache[Any, Any]] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for cache in list(_caches):
        cache._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
