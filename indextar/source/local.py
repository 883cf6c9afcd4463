"""Local shards: memory-mapped, read by slices and by ``_mapread``'s guarded copy.

:class:`LocalFileSource` maps a shard on its first read, in the process that reads, and
refuses a file changed since (:class:`FileVersion` is what an index recorded of it).
The mapped sources are tracked so that a forked child drops its parent's maps at once
and a process near its descriptor limit unmaps the longest-mapped ones; the dataset's
:class:`~indextar.read.shard.LRUCache` of open shards bounds them too.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import operator
import os
import resource
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import IndextarError, ShardNotFoundError, StaleIndexError, TruncatedShardError
from ..tar.spancheck import FILE_CHANGED, stale_error
from . import base
from .base import ByteSource, Span
from .extensions import mapread

# The guarded copy out of maps; chosen once, at import (INDEXTAR_PURE_PYTHON=1: none).
_MAPREAD = mapread()
_MAX_C_MEMBERS = _MAPREAD.MAX_MEMBERS if _MAPREAD is not None else 0  # larger: sliced

__all__ = [
    "FileVersion",
    "LocalFileSource",
    "mapped_file",
    "open_source",
]


@dataclass(frozen=True, slots=True)
class FileVersion:
    """What a local shard's index recorded of it: its size and modification time."""

    size: int
    mtime_ns: int


class LocalFileSource(ByteSource):
    """A local file, memory-mapped on first read: a range is one slice, no system call.

    The mapping is made in the process that reads and replaced after a fork. The source
    keeps a descriptor of the mapped file, and every read first checks its ``fstat`` (about
    0.8 us; once per batch in :meth:`read_members_many`):

    * a shard **changed in place** since it was mapped (another size or mtime) is
      refused: :class:`TruncatedShardError` if it shrank, which also keeps a read from
      touching pages past the new end (a ``SIGBUS``), else :class:`StaleIndexError`
      naming what changed;
    * a shard **replaced by rename** keeps serving its old mapping, whose bytes are
      still the ones its index describes; a process that maps it again (a forked
      DataLoader worker, or after the map was dropped for descriptors) finds the new
      file and refuses it;
    * with ``version``, the file must still be the one the index recorded when it is
      first mapped.

    A sample's members (:meth:`read_members`, what the dataset reads) are copied by
    ``_mapread``, which also checks that the span still begins with the sample's own
    tar headers (:mod:`indextar.tar.spancheck`) and catches the ``SIGBUS`` of a truncation
    landing between the ``fstat`` and the copy.
    """

    __slots__ = ("url", "version", "_map", "_fd", "_generation", "_size", "_identity")

    def __init__(self, path: str | os.PathLike[str], *, version: FileVersion | None = None):
        self.url = os.fspath(path)
        self.version = version
        self._map: mmap.mmap | None = None
        self._fd = -1
        self._generation = -1
        self._size = -1
        self._identity: tuple[int, int, int, int] | None = None  # dev, ino, size, mtime_ns

    def _open_descriptor(self) -> int:
        """A read-only descriptor of the file to map (a subclass may keep the bytes
        elsewhere than ``url``)."""
        return os.open(self.url, os.O_RDONLY | os.O_CLOEXEC)

    def _open(self) -> None:
        # The descriptor outside the lock: a cached source may download its shard first.
        try:
            fd = self._open_descriptor()
        except FileNotFoundError:
            raise ShardNotFoundError(f"shard {self.url!r} does not exist") from None
        with _opening:  # threads that find it unmapped at once map it once
            if self._generation == base._fork_generation:
                os.close(fd)  # another thread mapped it meanwhile
                return
            self._map_file(fd)

    def _map_file(self, fd: int) -> None:
        self._unmap()  # inherited through fork: closing the child's copies leaves the parent's
        _make_room_for_a_map(self)
        try:
            st = os.fstat(fd)
            identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if self._identity is not None and identity != self._identity:
                # Mapped again (after a fork, or to free descriptors): the bytes
                # must be those the caller's index describes.
                raise StaleIndexError(
                    f"shard {self.url!r} was replaced or rewritten since it was first "
                    "opened; open the dataset again to use the new file"
                )
            if self.version is not None and (st.st_size, st.st_mtime_ns) != (
                self.version.size,
                self.version.mtime_ns,
            ):
                raise _changed(self.url, self.version.size, self.version.mtime_ns, st, "indexed")
            self._identity = identity
            self._size = st.st_size
            if self._size:
                self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                _mapped[self] = next(_map_counter)
                if _MAPREAD is not None:
                    _MAPREAD.install()  # in case another SIGBUS handler replaced ours
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._generation = base._fork_generation

    @property
    def size(self) -> int:
        if self._generation != base._fork_generation:
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
        key: bytes | None = None,
        *,
        check_names: bool = True,
    ) -> list[tuple[str, bytes]]:
        """The members copied straight out of the map by ``_mapread``, which also makes
        the ``fstat`` and header checks: no copy of the whole span."""
        if self._generation != base._fork_generation:
            self._open()
        if self._map is None or _MAPREAD is None or count > _MAX_C_MEMBERS:
            return super().read_members(
                offset, length, member_rows, first, count, ext_names, key,
                check_names=check_names,
            )  # fmt: skip
        if offset < 0 or offset + length > self._size:
            self._checked_map(offset, length)  # raises, naming the range
        _, ino, size, mtime_ns = self._identity  # type: ignore[misc]
        checked = key if check_names or key is None else b""  # checked_key, inlined: a read
        got = _MAPREAD.members(  # of one sample pays for each call
            self._map, offset, member_rows, first, count, ext_names, checked, self._fd, ino,
            size, mtime_ns,
        )  # fmt: skip
        if type(got) is list:
            return got
        raise self._copy_error(got, offset, length, member_rows, first, key)

    def read_members_many(
        self,
        spans: Sequence[Span],
        member_rows: npt.NDArray[np.int64],
        ext_names: tuple[str, ...],
        *,
        check_names: bool = True,
    ) -> list[list[tuple[str, bytes]]]:
        """:meth:`read_members` for several samples, with one ``fstat`` for all."""
        if not spans or _MAPREAD is None:
            return super().read_members_many(spans, member_rows, ext_names, check_names=check_names)
        start = min(span[0] for span in spans)
        end = max(span[0] + span[1] for span in spans)
        try:
            mapped = self._checked_map(start, end - start)
        except TruncatedShardError:
            mapped = None  # the range-by-range path says which sample it was
        if mapped is None or max(span[3] for span in spans) > _MAX_C_MEMBERS:
            return super().read_members_many(spans, member_rows, ext_names, check_names=check_names)
        members = _MAPREAD.members
        result: list[list[tuple[str, bytes]]] = []
        for offset, length, first, count, key in spans:
            checked = key if check_names or key is None else b""  # checked_key, inlined
            got = members(mapped, offset, member_rows, first, count, ext_names, checked)
            if type(got) is not list:
                raise self._copy_error(got, offset, length, member_rows, first, key)
            result.append(got)
        return result

    def _copy_error(
        self,
        code: int | None,
        offset: int,
        length: int,
        member_rows: npt.NDArray[np.int64],
        first: int,
        key: bytes | None,
    ) -> IndextarError:
        """The error for a ``_mapread`` copy that did not return members."""
        if code is None:
            return TruncatedShardError(
                f"bytes {offset}..{offset + length} could not be read: the shard was "
                f"truncated while open (indexed at {self._size} bytes)",
                shard=self.url,
                offset=offset,
            )
        if code == FILE_CHANGED:
            return self._changed_error()
        assert self._map is not None and key is not None
        headers = self._map[offset : offset + int(member_rows[first, 0])]
        return stale_error(code, shard=self.url, offset=offset, key=key, headers=headers)

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

    def check_unchanged(self) -> None:
        """The ``fstat`` check of every read (mapping the file first, as a read would)."""
        self._checked_map(0, 0)

    def _checked_map(self, offset: int, length: int) -> mmap.mmap | None:
        """The mapping, once the file is unchanged since it was mapped and bytes
        ``offset .. offset + length`` are in it."""
        if self._generation != base._fork_generation:
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
        st = os.fstat(self._fd)
        if st.st_mtime_ns != self._identity[3] or st.st_size != self._size:  # type: ignore[index]
            raise self._changed_error(st)
        return self._map

    def _changed_error(self, st: os.stat_result | None = None) -> IndextarError:
        """What changed in the mapped file since it was mapped, as an error."""
        _, _, size, mtime_ns = self._identity  # type: ignore[misc]
        return _changed(self.url, size, mtime_ns, st or os.fstat(self._fd), "opened")

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        with _opening:
            self._unmap()
            _mapped.pop(self, None)
            self._generation = -1

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, TypeError):  # TypeError: at interpreter exit, os may be gone
            pass

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "version": self.version}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], version=state["version"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"LocalFileSource({self.url!r})"


def _changed(url: str, size: int, mtime_ns: int, st: os.stat_result, since: str) -> IndextarError:
    """The error for a shard whose ``fstat`` no longer shows ``size`` and ``mtime_ns``."""
    if st.st_size < size:
        return TruncatedShardError(
            f"the shard now has {st.st_size} bytes: it was truncated while open "
            f"(indexed at {size} bytes)",
            shard=url,
            offset=st.st_size,
        )
    changes = []
    if st.st_size != size:
        changes.append(f"its size changed from {size} to {st.st_size} bytes")
    if st.st_mtime_ns != mtime_ns:
        changes.append(f"its mtime changed from {mtime_ns} to {st.st_mtime_ns} ns")
    return StaleIndexError(
        f"shard {url!r} was changed in place since it was {since}: {'; '.join(changes)}; "
        "no sample is read through its old index (replace shards by renaming a new file "
        "over them, then rebuild the index with build_index(shard, force=True))"
    )


# Sources with a live mapping, and when each was mapped: a forked child unmaps its copies
# at once, so that nothing opened by the parent lives on in DataLoader workers.
_mapped: weakref.WeakKeyDictionary[LocalFileSource, int] = weakref.WeakKeyDictionary()
_map_counter = itertools.count()
# Held while a source maps or unmaps its file (not while it opens it, which may
# download it): an unmap between another thread's map and its descriptor's store would
# leave a source that reads as an empty file. Not held by reads. Reentrant: a map may
# first unmap others (_make_room_for_a_map).
_opening = threading.RLock()


def _make_room_for_a_map(opening: LocalFileSource) -> None:
    """Unmap the longest-mapped sources while maps hold half the process's fd limit.

    Each map keeps two file descriptors; under ``ulimit -n 64`` a dataset's 32 open
    shards would leave none for index files. An unmapped source maps again on its
    next read.
    """
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    # Each mapped source holds two descriptors: its own and the map's duplicate.
    if soft == resource.RLIM_INFINITY or len(_mapped) < soft // 4:
        return
    for source, _ in sorted(_mapped.items(), key=lambda item: item[1]):
        if len(_mapped) < max(1, soft // 4):
            break
        if source is not opening:
            source.close()


def _unmap_inherited() -> None:
    global _opening
    _opening = threading.RLock()  # a parent's thread may have held it at the fork
    for source in list(_mapped):
        source.close()


os.register_at_fork(after_in_child=_unmap_inherited)


def open_source(path: str | os.PathLike[str], version: FileVersion | None = None) -> ByteSource:
    """The byte source of a local shard (opened lazily), checked against ``version`` if
    given. A shard of either kind is opened by
    :meth:`~indextar.source.location.ShardLocation.open_raw`."""
    return LocalFileSource(path, version=version)


@contextlib.contextmanager
def mapped_file(path: str | os.PathLike[str]) -> Iterator[tuple[mmap.mmap | bytes, int, int]]:
    """A read-only map of the local file ``path`` (``b""`` if it is empty, which ``mmap``
    refuses), its descriptor and its size, for one pass over a whole file (an index
    build); :class:`LocalFileSource` is what random reads use."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            yield b"", f.fileno(), 0
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mm, f.fileno(), size
        finally:
            # An error's traceback may still hold views of the map: it is unmapped when
            # that exception is collected.
            with contextlib.suppress(BufferError):
                mm.close()
