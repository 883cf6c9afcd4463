"""Decompressed spans of ``.tar.gz`` shards, kept in memory up to a byte budget.

A read of a foreign ``.tar.gz`` decompresses from the seek point before it
(:class:`~indextar.source.gzipped.GzipSeekSource`). What it decompressed is kept here,
keyed by the source and the seek point, so that a later read in the same span (the
next sample in block order, a sample read again, a batch's neighbours) is a copy.

There is one cache per process (:data:`SPAN_CACHE`), shared by every open gzip shard,
least recently used out first, at most :attr:`SpanCache.budget` bytes of decompressed
data: 64 MiB unless the environment variable ``INDEXTAR_GZIP_CACHE_BYTES`` says
otherwise when indextar is imported (``0`` turns it off), or
:func:`set_span_cache_budget` changes it. A forked child (a DataLoader worker) starts
with an empty cache of the same budget and its own lock (so does every
:class:`SpanCache`, the global one or one passed as ``cache=``); a spawned one reads the
environment again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict

from . import base

__all__ = ["SpanCache", "SPAN_CACHE", "DEFAULT_BUDGET", "set_span_cache_budget"]

log = logging.getLogger(__name__)

DEFAULT_BUDGET = 64 << 20
_ENV = "INDEXTAR_GZIP_CACHE_BYTES"

Key = tuple[int, int]
"""``(source token, seek point number)``."""


class SpanCache:
    """Decompressed bytes from seek points, least recently used out first, at most
    ``budget`` bytes in all (an entry larger than the budget is not kept)."""

    def __init__(self, budget: int):
        self.budget = max(0, int(budget))
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Key, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._generation = base._fork_generation

    def _guard(self) -> threading.Lock:
        """The cache's lock; in a forked child, a new lock and no entries (a lock another
        thread held at the fork would never be released there; the entries are the
        parent's to keep, its pages shared until written)."""
        if self._generation != base._fork_generation:
            self._lock, self._generation = threading.Lock(), base._fork_generation
            self._entries = OrderedDict()
            self.size = self.hits = self.misses = 0
        return self._lock

    def get(self, key: Key) -> bytes | None:
        """The bytes kept for ``key``, marked most recently used; ``None`` if none."""
        with self._guard():
            data = self._entries.get(key)
            if data is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return data

    def put(self, key: Key, data: bytes) -> None:
        """Keep ``data`` for ``key`` (replacing what was kept), evicting the least
        recently used entries until the total fits the budget."""
        if len(data) > self.budget:
            return
        with self._guard():
            old = self._entries.pop(key, None)
            if old is not None:
                self.size -= len(old)
            self._entries[key] = data
            self.size += len(data)
            self._evict()

    def set_budget(self, budget: int) -> None:
        """Keep at most ``budget`` bytes from now on, evicting at once what no longer fits."""
        with self._guard():
            self.budget = max(0, int(budget))
            self._evict()

    def _evict(self) -> None:
        """Drop the least recently used entries until the total fits the budget (the lock
        is held)."""
        while self.size > self.budget:
            _, evicted = self._entries.popitem(last=False)
            self.size -= len(evicted)

    def drop(self, token: int) -> None:
        """Forget every entry of the source ``token`` (it was closed)."""
        with self._guard():
            for key in [key for key in self._entries if key[0] == token]:
                self.size -= len(self._entries.pop(key))

    def clear(self) -> None:
        """Forget everything."""
        with self._guard():
            self._entries.clear()
            self.size = 0

    def __len__(self) -> int:
        self._guard()
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        self._guard()
        return key in self._entries  # no hit or miss counted


def _budget_from_environment() -> int:
    value = os.environ.get(_ENV, "")
    if not value:
        return DEFAULT_BUDGET
    try:
        return max(0, int(value))
    except ValueError:
        log.warning("%s=%r is not a number of bytes; using %d", _ENV, value, DEFAULT_BUDGET)
        return DEFAULT_BUDGET


SPAN_CACHE = SpanCache(_budget_from_environment())


def set_span_cache_budget(nbytes: int) -> None:
    """Keep at most ``nbytes`` of decompressed ``.tar.gz`` spans in this process (``0``:
    keep none). Evicts at once what no longer fits."""
    SPAN_CACHE.set_budget(nbytes)
