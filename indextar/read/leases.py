"""The open shards of a process, shared by its threads: a least-recently-used map
whose entries are leased to the reads that use them.

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

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["LRUCache", "Lease"]

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
