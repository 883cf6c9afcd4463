"""A bounded local cache of whole remote shards, shared by processes.

Layout of the cache folder, one entry per shard version::

    <digest>-<name>          a complete shard, read by any number of processes
    <digest>-<name>.part     a download in progress, created at its full (sparse) size
    <digest>-<name>.lock     held while one process downloads the shard
    .cache.lock              held while space is reserved or shards are evicted

``<digest>`` hashes the URL, size and ETag the index recorded, so a replaced object
never matches an old entry. A compressed shard is kept as it is (read through its
frames or seek points, as a local one is), except one that no read can start inside (a
``.tar.zst`` of one zstd frame): that one is decompressed as it downloads and kept as
its plain tar, ``<digest>-<name>.tar``, whose size is what counts against the limit.

Every process that reads a shard holds a shared ``flock`` on it; eviction takes an
exclusive one without waiting and skips shards it cannot get, so a shard in use is
never evicted. A download's ``.part`` counts at its full size from the start, so the
folder never holds more than ``limit`` bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ..errors import CacheFullError, IndextarError, TruncatedShardError
from ..tar.compress import split_compression_suffix
from .base import ByteSource
from .conditional import RemoteStat
from .download import download, download_decompressed
from .local import LocalFileSource
from .remote import DEFAULT_RETRY, RangeSource, RetryPolicy

__all__ = ["ShardCache", "CachedSource", "parse_size"]

log = logging.getLogger(__name__)

_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?)B?\s*$", re.I)


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string such as ``"50GB"``, ``"512MiB"``, ``"2e9"``.

    >>> parse_size("1.5GB"), parse_size("1KiB")
    (1500000000, 1024)
    """
    if isinstance(size, int):
        return size
    match = _SIZE.match(size)
    if match is None:
        try:
            return int(float(size))
        except ValueError:
            raise ValueError(f"cannot read {size!r} as a size such as '50GB' or '512MiB'") from None
    number, unit, binary = match.groups()
    scale = 1024 ** "KMGT".index(unit.upper()) * 1024 if binary and unit else _UNITS[unit.upper()]
    return int(float(number) * scale)


class ShardCache:
    """Whole shards downloaded into ``directory``, at most ``limit`` bytes, LRU-evicted.

    Parameters
    ----------
    directory
        The cache folder; processes that share it share the shards.
    limit
        Most bytes the folder holds (``"50GB"``, ``"512MiB"`` or an int).
    storage_options, retry
        For the downloads, as :class:`~indextar.source.remote.RangeSource`.
    fill
        ``"shards"``: a shard is downloaded whole at its first read. ``"ranges"``: it is
        read by ranged requests, which also fill its entry, cached whole once they hold
        all of it (:mod:`~indextar.source.fillcache`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        limit: int | str,
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        fill: Literal["shards", "ranges"] = "shards",
    ):
        if fill not in ("shards", "ranges"):
            raise ValueError(f"fill= must be 'shards' or 'ranges', got {fill!r}")
        self.fill = fill
        self.directory = Path(directory)
        self.limit = parse_size(limit)
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        if self.limit <= 0:
            raise ValueError(f"a shard cache needs a positive limit, got {limit!r}")

    def path_for(self, url: str, expected: RemoteStat, *, codec: str | None = None) -> Path:
        """Where the version ``expected`` of ``url`` is cached (with ``codec``: its plain
        tar, decompressed from that codec)."""
        version = f"{url}\0{expected.size}\0{expected.etag}" + (f"\0{codec}" if codec else "")
        digest = hashlib.blake2b(version.encode(), digest_size=8).hexdigest()
        name = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rpartition("/")[2])[-80:]
        if codec is not None:
            name = split_compression_suffix(name)[0].removesuffix(".tar") + ".tar"
        return self.directory / f"{digest}-{name}"

    def usage(self) -> int:
        """Bytes the cache holds, counting downloads in progress at their full size."""
        return sum(size for _, size, _ in self._entries())

    def open(
        self, url: str, expected: RemoteStat, *, codec: str | None = None, plain_size: int = 0
    ) -> int:
        """A read-only descriptor of the cached shard, downloading it first if needed.

        The descriptor carries a shared lock that keeps the shard from being evicted
        until it is closed. With ``codec``, the shard is a ``codec`` stream that the
        cache keeps decompressed: the descriptor is of its plain tar, ``plain_size``
        bytes (what its index recorded).

        Raises
        ------
        CacheFullError
            If the shard does not fit even after evicting every shard not in use.
        RemoteReadError, StaleIndexError
            If the download fails or the object no longer matches ``expected``.
        ShardFormatError
            If the ``codec`` stream is cut short, corrupt, or decompresses to other than
            ``plain_size`` bytes.
        """
        path = self.path_for(url, expected, codec=codec)
        self.directory.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock

        while True:
            with FileLock(f"{path}.lock"):
                if not path.exists():
                    self._download(url, expected, path, codec, plain_size)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            if _lock_shared(fd):
                return fd

    def open_cached(self, url: str, expected: RemoteStat) -> int | None:
        """:meth:`open`'s descriptor where the shard is cached whole; None, and nothing
        fetched, where it is not."""
        path = self.path_for(url, expected)
        while True:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            if _lock_shared(fd):
                return fd

    def _download(
        self, url: str, expected: RemoteStat, path: Path, codec: str | None, plain_size: int
    ) -> None:
        part = Path(f"{path}.part")
        size = expected.size if codec is None else plain_size
        self._reserve(part, size, url)
        log.info(
            "downloading %s (%d bytes%s) into the shard cache %s",
            url, expected.size, f", {plain_size} decompressed" if codec else "", self.directory,
        )  # fmt: skip
        started = time.perf_counter()
        source = RangeSource(
            url, expected=expected, storage_options=self.storage_options, retry=self.retry
        )
        try:
            with open(part, "r+b") as f:
                fd = f.fileno()
                if codec is None:
                    download(fd, source, expected.size)
                else:
                    download_decompressed(fd, source, codec, plain_size)
                os.fsync(fd)
                if os.fstat(fd).st_size != size:
                    raise TruncatedShardError(
                        f"downloaded {os.fstat(fd).st_size} bytes; its index says {size}",
                        shard=url,
                    )
            os.replace(part, path)
        except BaseException as e:
            part.unlink(missing_ok=True)
            if isinstance(e, OSError) and not isinstance(e, IndextarError):
                raise self._disk_error(e, url, size) from e
            raise
        finally:
            source.close()
        log.info("downloaded %s in %.2fs", url, time.perf_counter() - started)

    def _reserve(self, part: Path, size: int, url: str) -> None:
        """Create ``part`` at ``size`` bytes (sparse) once that fits, evicting LRU shards."""
        from filelock import FileLock

        with FileLock(self.directory / ".cache.lock"):
            self._reserve_locked(part, size, url)

    def reserve_fill(self, part: Path, size: int, url: str, header: bytes) -> None:
        """Keep ``part`` if its fill log (``<part>.ranges``) begins with ``header``: a
        fill by ranged reads still going, or one whose filler was killed in this boot
        (its bytes are in the page cache). Else reserve it afresh, as a download's, and
        begin its log with ``header``. Under the cache's lock, so that one filler
        starts it."""
        from filelock import FileLock

        log = Path(f"{part}.ranges")
        with FileLock(self.directory / ".cache.lock"):
            with contextlib.suppress(OSError):
                kept = header + f" {part.stat().st_ino}\n".encode()
                with open(log, "rb") as f:
                    if f.read(len(kept)) == kept:
                        return
            self._reserve_locked(part, size, url)
            with open(log, "wb") as f:
                f.write(header + f" {part.stat().st_ino}\n".encode())

    def _reserve_locked(self, part: Path, size: int, url: str) -> None:
        if size > self.limit:
            raise CacheFullError(
                f"shard {url!r} has {size} bytes, more than the whole shard cache "
                f"({self.limit} bytes in {str(self.directory)!r}); "
                "raise cache_limit= or read it with remote='ranges'"
            )
        # This shard's own .part, if there is one, is a killed download's (its lock is
        # ours now): it is replaced below, and so are the others whose lock is free.
        entries = [
            entry
            for entry in self._entries()
            if entry[0] != part and not (entry[2] and self._remove_dead_download(entry[0]))
        ]
        used = sum(entry_size for _, entry_size, _ in entries)
        # Oldest first; downloads in progress are not candidates.
        for entry, entry_size, _ in sorted(
            (e for e in entries if not e[2]), key=lambda e: e[0].stat().st_atime_ns
        ):
            if used + size <= self.limit:
                break
            if self._evict(entry):
                used -= entry_size
        if used + size > self.limit:
            raise CacheFullError(
                f"shard {url!r} ({size} bytes) does not fit into the shard cache "
                f"{str(self.directory)!r}: {used} of {self.limit} bytes are in shards that are "
                "open or downloading; raise cache_limit= or open fewer shards at once"
            )
        Path(f"{part}.ranges").unlink(missing_ok=True)  # a fill's log, of another part
        try:
            with open(part, "wb") as f:
                f.truncate(size)
        except OSError as e:
            part.unlink(missing_ok=True)
            raise self._disk_error(e, url, size) from e

    def _disk_error(self, error: OSError, url: str, size: int) -> CacheFullError:
        """The error for a disk that is full (or refuses the file) under the cache folder."""
        return CacheFullError(
            f"cannot store shard {url!r} ({size} bytes) in the shard cache "
            f"{str(self.directory)!r}: {error.strerror or error}; free space there, or choose "
            "another folder with cache_dir= or read the shard with remote='ranges'"
        )

    def _entries(self) -> list[tuple[Path, int, bool]]:
        """``(path, size, is_download)`` of every cached shard and download."""
        entries = []
        for entry in self.directory.iterdir() if self.directory.exists() else ():
            if entry.name.startswith(".") or entry.name.endswith((".lock", ".ranges")):
                continue
            try:
                entries.append((entry, entry.stat().st_size, entry.name.endswith(".part")))
            except FileNotFoundError:
                continue
        return entries

    def _remove_dead_download(self, part: Path) -> bool:
        """Delete ``part`` if no process holds its download's lock (its downloader was
        killed: it would otherwise count against the limit for ever); whether it was."""
        try:
            fd = os.open(f"{part.with_suffix('')}.lock", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # no downloader ever took it
            fd = -1
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # its download is running
            os.close(fd)
            return False
        try:
            part.unlink(missing_ok=True)
            Path(f"{part}.ranges").unlink(missing_ok=True)
            log.info("removed %s, left by a download that did not finish", part.name)
        finally:
            if fd >= 0:
                os.close(fd)
        return True

    def _evict(self, path: Path) -> bool:
        """Delete ``path`` unless a process has it open; whether it was deleted."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            path.unlink(missing_ok=True)
            log.info("evicted %s from the shard cache", path.name)
        finally:
            os.close(fd)
        return True

    def __repr__(self) -> str:
        return f"ShardCache({str(self.directory)!r}, limit={self.limit}, fill={self.fill!r})"


def _lock_shared(fd: int) -> bool:
    """Take a shared lock on a cached shard's descriptor and mark it used; False (and
    ``fd`` closed) where it was evicted between its open and the lock."""
    fcntl.flock(fd, fcntl.LOCK_SH)
    st = os.fstat(fd)
    if st.st_nlink > 0:
        # Least recently used goes first: the access time says when, and the
        # modification time stays the download's, which every LocalFileSource of
        # this copy (another worker's, a child's) checks its reads against.
        os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))
        return True
    os.close(fd)
    return False


class CachedSource(LocalFileSource):
    """A remote shard read from the local :class:`ShardCache`, downloaded on first read.

    A :class:`~indextar.source.local.LocalFileSource` of the cached file, so a warm cache
    reads as local shards do, by the same paths; ``url`` stays the remote URL, which
    errors name. Mapping the file first takes a descriptor with a shared lock (and
    downloads the shard if needed), which keeps it from being evicted until
    :meth:`close`.
    """

    __slots__ = ("cache", "expected", "codec", "plain_size")

    def __init__(
        self,
        url: str,
        *,
        cache: ShardCache,
        expected: RemoteStat,
        codec: str | None = None,
        plain_size: int = 0,
    ):
        super().__init__(url)
        self.cache = cache
        self.expected = expected
        self.codec = codec
        self.plain_size = plain_size

    def _open_descriptor(self) -> int:
        # The cache's locked descriptor: the map is made of it, and closing it (close(),
        # or a forked child's copy, which leaves the parent's lock) lets it be evicted.
        return self.cache.open(
            self.url, self.expected, codec=self.codec, plain_size=self.plain_size
        )

    @property
    def size(self) -> int:
        return self.expected.size if self.codec is None else self.plain_size

    def decompressed_copy(self, codec: str, size: int) -> ByteSource:
        """The shard's plain tar, which the cache decompresses as it downloads it."""
        return CachedSource(
            self.url, cache=self.cache, expected=self.expected, codec=codec, plain_size=size
        )

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "cache": self.cache,
            "expected": self.expected,
            "codec": self.codec,
            "plain_size": self.plain_size,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"CachedSource({self.url!r}, {self.cache!r})"
