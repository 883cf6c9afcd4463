"""Byte sources: read byte ranges of a shard, locally or remotely.

A :class:`ByteSource` has two primitives, :attr:`~ByteSource.size` and
:meth:`~ByteSource.read`; :meth:`~ByteSource.read_many` and the member reads are built
on them, and a backend may override them to batch requests or to copy less. Local
shards are :class:`LocalFileSource`; remote ones come from
:mod:`indextar.remote` (ranges) and :mod:`indextar.cache` (a local copy).

Sources open what they need lazily and never carry an open file across a fork or a
pickle: they remember the process that opened the file and reopen in any other.
"""

from __future__ import annotations

import abc
import itertools
import mmap
import operator
import os
import resource
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from . import native
from .errors import ShardNotFoundError, StaleIndexError, TruncatedShardError

# The guarded copy out of maps; chosen once, at import (INDEXTAR_PURE_PYTHON=1: none).
_MAPREAD = native.mapread()
_MAX_C_MEMBERS = _MAPREAD.MAX_MEMBERS if _MAPREAD is not None else 0  # larger: sliced

__all__ = [
    "ByteSource",
    "LocalFileSource",
    "LRUCache",
    "fork_generation",
    "open_source",
    "split_members",
]


class ByteSource(abc.ABC):
    """Random access to the bytes of one shard.

    Subclasses implement :attr:`size` and :meth:`read`. A source must be picklable and
    must hold no open resource across ``fork`` or pickle.
    """

    url: str

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Size of the shard in bytes."""

    @abc.abstractmethod
    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``.

        Raises
        ------
        TruncatedShardError
            If the shard ends before ``offset + length``.
        """

    def read_many(self, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """Several ranges at once; backends with request overhead batch them."""
        read = self.read
        return [read(offset, length) for offset, length in zip(offsets, lengths)]

    def read_members(
        self,
        offset: int,
        length: int,
        member_rows: npt.NDArray[np.int64],
        first: int,
        count: int,
        ext_names: tuple[str, ...],
    ) -> list[tuple[str, bytes]]:
        """A sample's ``(extension, data)`` members, from one read of its span.

        ``offset`` and ``length`` are the sample's span; ``member_rows[first : first +
        count]`` its members as ``(span_offset, size, ext_code)`` rows (the index's
        packed ``members`` array). Sources that can copy members straight out of their
        storage (a memory map) override this to skip the span's copy.
        """
        return split_members(self.read(offset, length), member_rows, first, count, ext_names)

    def read_members_many(
        self,
        spans: Sequence[tuple[int, int, int, int]],
        member_rows: npt.NDArray[np.int64],
        ext_names: tuple[str, ...],
    ) -> list[list[tuple[str, bytes]]]:
        """:meth:`read_members` for several samples, ``(offset, length, first, count)``
        each, with one :meth:`read_many` of their spans."""
        datas = self.read_many([span[0] for span in spans], [span[1] for span in spans])
        return [
            split_members(data, member_rows, first, count, ext_names)
            for (_, _, first, count), data in zip(spans, datas)
        ]

    def close(self) -> None:  # noqa: B027 (a hook: sources that hold nothing need not close)
        """Release open resources; the source reopens on the next read."""

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split_members(
    span: bytes,
    member_rows: npt.NDArray[np.int64],
    first: int,
    count: int,
    ext_names: tuple[str, ...],
) -> list[tuple[str, bytes]]:
    """A sample's ``(extension, data)`` members, sliced out of its span's bytes."""
    return [
        (ext_names[code], span[start : start + size])
        for start, size, code in member_rows[first : first + count].tolist()
    ]


class LocalFileSource(ByteSource):
    """A local file, memory-mapped on first read: a range is one slice, no system call.

    The mapping is made in the process that reads and replaced after a fork.

    Each read first asks the file's current size (one ``fstat``, about 0.8 us): a
    shard truncated in place while mapped raises :class:`TruncatedShardError` instead
    of returning the zeros a map shows past the new end within its last page, or
    touching pages past it, which would kill the process with ``SIGBUS``. A sample's
    members (:meth:`read_members`, what the dataset reads) are then copied by
    ``_mapread``, which also catches the ``SIGBUS`` of a truncation landing between
    that check and the copy; elsewhere such a race can still crash. Replace shards
    with a new file (rename) rather than rewriting them in place: a deleted or
    replaced shard keeps its old bytes for as long as it stays mapped.
    """

    __slots__ = ("url", "_map", "_generation", "_size", "_identity")

    def __init__(self, path: str | os.PathLike[str]):
        self.url = os.fspath(path)
        self._map: mmap.mmap | None = None
        self._generation = -1
        self._size = -1
        self._identity: tuple[int, ...] | None = None

    def _open(self) -> None:
        if self._map is not None:
            # Inherited through fork: unmapping the child's copy leaves the parent's.
            self._map.close()
            self._map = None
        _make_room_for_a_map(self)
        try:
            with open(self._file(), "rb") as f:
                st = os.fstat(f.fileno())
                identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                if self._identity is not None and identity != self._identity:
                    # Mapped again (after a fork, or to free descriptors): the bytes
                    # must be those the caller's index describes.
                    raise StaleIndexError(
                        f"shard {self.url!r} was replaced or rewritten since it was first "
                        "opened; open the dataset again to use the new file"
                    )
                self._identity = identity
                self._size = st.st_size
                if self._size:
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    _mapped[self] = next(_map_counter)
                    if _MAPREAD is not None:
                        _MAPREAD.install()  # in case another SIGBUS handler replaced ours
        except FileNotFoundError:
            raise ShardNotFoundError(f"shard {self.url!r} does not exist") from None
        self._generation = _fork_generation

    def _file(self) -> str:
        """The path to map (a subclass may keep the bytes elsewhere than ``url``)."""
        return self.url

    @property
    def size(self) -> int:
        if self._generation != _fork_generation:
            self._open()
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        mapped = self._checked_map(offset, length)
        return b"" if mapped is None else mapped[offset : offset + length]

    def read_members(
        self,
        offset: int,
        length: int,
        member_rows: npt.NDArray[np.int64],
        first: int,
        count: int,
        ext_names: tuple[str, ...],
    ) -> list[tuple[str, bytes]]:
        """The members copied straight out of the map by ``_mapread``, after the checks
        of :meth:`read`: no copy of the whole span, and a truncation that lands between
        the ``fstat`` and the copy is caught there too, not a crash."""
        mapped = self._checked_map(offset, length)
        if mapped is None or _MAPREAD is None or count > _MAX_C_MEMBERS:
            span = b"" if mapped is None else mapped[offset : offset + length]
            return split_members(span, member_rows, first, count, ext_names)
        got: list[tuple[str, bytes]] | None = _MAPREAD.members(
            mapped, offset, member_rows, first, count, ext_names
        )
        if got is None:
            raise TruncatedShardError(
                f"bytes {offset}..{offset + length} could not be read: the shard was "
                f"truncated while open (indexed at {self._size} bytes)",
                shard=self.url,
                offset=offset,
            )
        return got

    def read_members_many(
        self,
        spans: Sequence[tuple[int, int, int, int]],
        member_rows: npt.NDArray[np.int64],
        ext_names: tuple[str, ...],
    ) -> list[list[tuple[str, bytes]]]:
        """:meth:`read_members` for several samples, with one ``fstat`` for all."""
        if not spans or _MAPREAD is None:
            return super().read_members_many(spans, member_rows, ext_names)
        start = min(span[0] for span in spans)
        end = max(span[0] + span[1] for span in spans)
        try:
            mapped = self._checked_map(start, end - start)
        except TruncatedShardError:
            mapped = None  # the range-by-range path says which sample it was
        if mapped is None or max(span[3] for span in spans) > _MAX_C_MEMBERS:
            return super().read_members_many(spans, member_rows, ext_names)
        members = _MAPREAD.members
        result: list[list[tuple[str, bytes]]] = []
        for offset, _, first, count in spans:
            got = members(mapped, offset, member_rows, first, count, ext_names)
            if got is None:
                return super().read_members_many(spans, member_rows, ext_names)
            result.append(got)
        return result

    def read_many(self, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """Several ranges; the checks of :meth:`read` (an ``fstat``) run once for all."""
        if not offsets:
            return []
        start = min(offsets)
        end = max(map(operator.add, offsets, lengths))
        try:
            mapped = self._checked_map(start, end - start)
        except TruncatedShardError:
            return super().read_many(offsets, lengths)  # the error names the range
        if mapped is None:
            return [b""] * len(offsets)
        return [mapped[offset : offset + length] for offset, length in zip(offsets, lengths)]

    def _checked_map(self, offset: int, length: int) -> mmap.mmap | None:
        """The mapping, once bytes ``offset .. offset + length`` are known to be in the file."""
        if self._generation != _fork_generation:
            self._open()
        if offset < 0 or offset + length > self._size:
            raise TruncatedShardError(
                f"wanted bytes {offset}..{offset + length} but the shard has {self._size} "
                "(was it changed after indexing?)",
                shard=self.url,
                offset=offset,
            )
        if self._map is None:
            return None
        if offset + length > self._map.size():  # fstat of the mapped file: did it shrink?
            raise TruncatedShardError(
                f"wanted bytes {offset}..{offset + length} but the shard now has "
                f"{self._map.size()}; it was truncated while open (indexed at {self._size} "
                "bytes)",
                shard=self.url,
                offset=offset,
            )
        return self._map

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        _mapped.pop(self, None)
        self._generation = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"LocalFileSource({self.url!r})"


# Incremented in every forked child: objects that opened something compare it with the
# value they opened under, which is cheaper than os.getpid() (a system call) per read.
_fork_generation = 0
# Sources with a live mapping, and when each was mapped: a forked child unmaps its copies
# at once, so that nothing opened by the parent lives on in DataLoader workers.
_mapped: weakref.WeakKeyDictionary[LocalFileSource, int] = weakref.WeakKeyDictionary()
_map_counter = itertools.count()


def _make_room_for_a_map(opening: LocalFileSource) -> None:
    """Unmap the longest-mapped sources while maps hold half the process's fd limit.

    Each map keeps a file descriptor; under ``ulimit -n 64`` a dataset's 64 open
    shards would leave none for index files. An unmapped source maps again on its
    next read.
    """
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or len(_mapped) < soft // 2:
        return
    for source, _ in sorted(_mapped.items(), key=lambda item: item[1]):
        if len(_mapped) < max(1, soft // 2):
            break
        if source is not opening:
            source.close()


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1
    for source in list(_mapped):
        source.close()


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_generation() -> int:
    """A number that changes in every forked child process (see :func:`os.register_at_fork`)."""
    return _fork_generation


def open_source(path: str | os.PathLike[str]) -> ByteSource:
    """The byte source of a local shard (opened lazily). Remote shards' sources come
    from :class:`~indextar.remote_options.RemoteOptions`, which knows their storage
    options and cache."""
    return LocalFileSource(path)


# -- bounded cache ---------------------------------------------------------------

K = TypeVar("K")
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """A least-recently-used map of at most ``capacity`` entries.

    ``on_evict(value)`` runs for every entry pushed out or cleared: the dataset closes
    evicted shards there, so the number of open files stays bounded.
    """

    __slots__ = ("capacity", "_entries", "_on_evict")

    def __init__(self, capacity: int, on_evict: Callable[[V], None] | None = None):
        if capacity < 1:
            raise ValueError(f"an LRU cache needs a capacity of at least 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._on_evict = on_evict

    def get(self, key: K) -> V | None:
        """The entry for ``key``, marked most recently used; ``None`` if absent."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Add or replace an entry, evicting the least recently used one if full."""
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(evicted)

    def clear(self) -> None:
        """Evict every entry."""
        while self._entries:
            _, evicted = self._entries.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(evicted)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)
