"""Remote shards through fsspec: ranged reads with retries, staleness checks, streams.

Any fsspec protocol works (``http(s)://``, ``s3://``, ``gs://``, ...). fsspec and the
protocol's package are imported on first use; a missing one raises an ImportError
that says what to install. Credentials and endpoints come from where fsspec and the
protocol's package look for them (environment, ``~/.config/fsspec``, ``~/.aws``), or
from ``storage_options``; indextar never logs them.

Transient failures (connection resets, 5xx, timeouts, truncated bodies) are retried
with bounded exponential backoff; a read that still fails raises
:class:`~indextar.errors.RemoteReadError` naming the URL and the byte range.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import PipeRefusedError, RemoteReadError, ShardNotFoundError, StaleIndexError
from .local import ByteSource, fork_generation

__all__ = [
    "ALLOW_PIPE_ENV",
    "RetryPolicy",
    "RemoteStat",
    "RangeSource",
    "RemoteStream",
    "fetch_ranges",
    "filesystem",
    "check_pipe_allowed",
]

log = logging.getLogger(__name__)

ALLOW_PIPE_ENV = "INDEXTAR_ALLOW_PIPE"
"""Set to ``1`` to allow ``pipe:`` shards everywhere, as ``allow_pipe=True`` does."""

# protocol -> the package fsspec needs for it, for the ImportError's install hint.
_PROTOCOL_PACKAGES = {
    "http": "aiohttp",
    "https": "aiohttp",
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "hf": "huggingface_hub",
}

T = TypeVar("T")


_USED_CLASSES: set[type] = set()
_INHERITED: list[Any] = []


def _keep_inherited_filesystems() -> None:
    # A forked child (a DataLoader worker) must never close its parent's async
    # filesystems: their sockets are registered in the parent's epoll instance, which
    # the child shares, so closing them here unregisters them there and the parent
    # then waits forever for its next response. fsspec drops its cached instances in
    # a child (and finalizers would close them); keeping a reference prevents that.
    for cls in _USED_CLASSES:
        _INHERITED.extend(getattr(cls, "_cache", {}).values())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_keep_inherited_filesystems)


def check_pipe_allowed(url: str, allow_pipe: bool) -> None:
    """Refuse a ``pipe:CMD`` shard unless the caller or the environment allows it."""
    if url.startswith("pipe:") and not (allow_pipe or os.environ.get(ALLOW_PIPE_ENV) == "1"):
        raise PipeRefusedError(
            f"refusing the shard {url[:60]!r}: a pipe: shard runs a shell command; pass "
            f"allow_pipe=True or set the environment variable {ALLOW_PIPE_ENV}=1 if you trust it"
        )


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path within it.

    Raises
    ------
    ImportError
        If fsspec or the protocol's package is not installed, saying what to install.
    """
    protocol = url.partition("://")[0]
    try:
        import fsspec.core
    except ImportError as e:
        raise ImportError(
            f"reading {protocol}:// shards needs fsspec: pip install 'indextar[remote]'"
        ) from e
    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError as e:
        package = _PROTOCOL_PACKAGES.get(protocol, f"the fsspec backend for {protocol}://")
        raise ImportError(
            f"reading {protocol}:// shards needs {package}: pip install {package} "
            f"(or 'indextar[remote]' for http and s3) ({e})"
        ) from e
    _USED_CLASSES.add(type(fs))
    return fs, path


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry a transient failure.

    Attempt ``n`` (from 1) waits ``min(max_delay, initial_delay * 2**(n-1))`` times a
    random factor in ``[0.5, 1]`` before the next try.
    """

    attempts: int = 5
    initial_delay: float = 0.1
    max_delay: float = 2.0

    def delay(self, attempt: int) -> float:
        backoff: float = min(self.max_delay, self.initial_delay * 2.0 ** (attempt - 1))
        return backoff * random.uniform(0.5, 1.0)


def is_transient(error: BaseException) -> bool:
    """Whether retrying might help: not for missing objects, refusals or bad arguments."""
    if isinstance(
        error, (FileNotFoundError, PermissionError, IsADirectoryError, ValueError, TypeError)
    ):
        return False
    status = getattr(error, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    return isinstance(error, (OSError, TimeoutError)) or type(error).__module__.startswith(
        ("aiohttp", "botocore", "aiobotocore")
    )


def with_retries(
    call: Callable[[], T], policy: RetryPolicy, *, url: str, offset: int | None, length: int | None
) -> T:
    """``call()``, retried on transient errors; then :class:`RemoteReadError`."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return call()
        except Exception as e:
            if isinstance(e, (StaleIndexError, RemoteReadError)):
                raise
            if not is_transient(e) or attempt == policy.attempts:
                if isinstance(e, FileNotFoundError):
                    raise ShardNotFoundError(f"remote shard {url!r} does not exist ({e})") from e
                raise RemoteReadError(
                    f"{type(e).__name__}: {e}",
                    url=url,
                    offset=offset,
                    length=length,
                    attempts=attempt,
                ) from e
            wait = policy.delay(attempt)
            log.warning(
                "reading %s bytes %s+%s failed (%s: %s); retry %d/%d in %.2fs",
                url,
                offset,
                length,
                type(e).__name__,
                e,
                attempt,
                policy.attempts - 1,
                wait,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class RemoteStat:
    """What identifies a version of a remote object: its size and, if served, its ETag."""

    size: int
    etag: str = ""

    @classmethod
    def from_info(cls, info: Mapping[str, Any], url: str) -> RemoteStat:
        size = info.get("size")
        if size is None:
            raise RemoteReadError("the server reports no size (no Content-Length)", url=url)
        etag = info.get("ETag") or info.get("etag") or ""
        return cls(int(size), str(etag).strip('"'))


DEFAULT_RETRY = RetryPolicy()


# -- conditional ranged GETs -------------------------------------------------------
#
# Every ranged read of an indexed shard carries the object version its index recorded,
# so that an object replaced mid-epoch is refused by the server (412) or, where the
# server ignores the precondition, by the ETag it answers with: never read as bytes.


def _stale(url: str, etag: str, what: str) -> StaleIndexError:
    return StaleIndexError(
        f"remote shard {url!r} changed since it was indexed (ETag {etag!r}): {what}; "
        "no sample is read through its old index; rebuild it "
        "(build_index(url, index_dir=..., force=True))"
    )


def _answered_etag(url: str, etag: str, answered: str | None) -> None:
    """Refuse a response whose ETag is another version's."""
    got = (answered or "").removeprefix("W/").strip('"')
    if got and got != etag:
        raise _stale(url, etag, f"the server answered a ranged read with ETag {got!r}")


def _precondition_failed(error: BaseException) -> bool:
    """Whether ``error`` (or its cause) is an HTTP 412 answer."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "status", None) == 412:  # aiohttp
            return True
        response = getattr(seen, "response", None)  # botocore ClientError
        if isinstance(response, Mapping):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _http_range(fs: Any, path: str, start: int, end: int, etag: str, url: str) -> bytes:
    kwargs = dict(fs.kwargs)
    headers = {**(kwargs.pop("headers", None) or {}), "Range": f"bytes={start}-{end - 1}"}
    if not etag.startswith("W/"):  # If-Match compares strongly: a weak tag never matches
        headers["If-Match"] = f'"{etag}"'
    session = await fs.set_session()
    async with session.get(fs.encode_url(path), headers=headers, **kwargs) as response:
        if response.status == 412:
            raise _stale(url, etag, "the server answered 412 Precondition Failed")
        fs._raise_not_found_for_status(response, path)
        _answered_etag(url, etag, response.headers.get("ETag"))
        data: bytes = await response.read()
        return data


async def _s3_range(fs: Any, path: str, start: int, end: int, etag: str, url: str) -> bytes:
    bucket, key, version = fs.split_path(path)
    request = {"Bucket": bucket, "Key": key, "Range": f"bytes={start}-{end - 1}"}
    request["IfMatch"] = f'"{etag}"'
    if version:
        request["VersionId"] = version
    try:
        response = await fs._call_s3("get_object", **request)
    except Exception as e:
        if _precondition_failed(e):
            raise _stale(url, etag, "the server answered 412 Precondition Failed") from e
        raise
    try:
        _answered_etag(url, etag, response.get("ETag"))
        data: bytes = await response["Body"].read()
        return data
    finally:
        response["Body"].close()


# protocol -> a ranged GET that carries If-Match and checks the answered ETag
_CONDITIONAL_GETS = {
    "http": _http_range,
    "https": _http_range,
    "s3": _s3_range,
    "s3a": _s3_range,
}


async def _get_range(fs: Any, path: str, start: int, end: int, etag: str, url: str) -> bytes:
    """Bytes ``start .. end`` of ``path``: conditional on ``etag`` where the protocol
    allows it (HTTP, S3), plain elsewhere (the span check still guards those)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    conditional = _CONDITIONAL_GETS.get(protocol)
    if conditional is None or not etag:
        data: bytes = await fs._cat_file(path, start=start, end=end)
        return data
    return await conditional(fs, path, start, end, etag, url)


def _get_ranges(
    fs: Any, requests: Sequence[tuple[str, int, int, str, str]], max_in_flight: int
) -> list[Any]:
    """``_get_range`` of each ``(path, start, end, etag, url)``, at most
    ``max_in_flight`` at once on the filesystem's event loop; exceptions are returned."""
    import fsspec.asyn

    async def gather() -> list[Any]:
        limit = asyncio.Semaphore(max_in_flight)

        async def one(path: str, start: int, end: int, etag: str, url: str) -> Any:
            async with limit:
                try:
                    return await _get_range(fs, path, start, end, etag, url)
                except Exception as e:
                    return e

        return await asyncio.gather(*(one(*request) for request in requests))

    return fsspec.asyn.sync(fs.loop, gather)  # type: ignore[no-any-return]


class RangeSource(ByteSource):
    """A remote shard read by ranged requests; batches go out concurrently.

    Parameters
    ----------
    url
        The shard's URL.
    expected
        The size and ETag its index recorded. The first read in each process compares
        them with the object's, and every ranged read carries the ETag (HTTP
        ``If-Match``, S3 ``IfMatch``) and checks the one answered: a replaced object
        raises :class:`~indextar.errors.StaleIndexError`, even mid-epoch, and is never
        read with an old index. Without ``expected``, reads are conditional on the ETag
        this process saw first.
    storage_options
        Passed to fsspec for this protocol (endpoint, anonymous access, ...).
    retry
        Backoff for transient failures.
    max_in_flight
        Requests a :meth:`read_many` keeps in flight at once.
    """

    __slots__ = (
        "url",
        "expected",
        "storage_options",
        "retry",
        "max_in_flight",
        "_fs",
        "_path",
        "_generation",
        "_stat",
    )

    def __init__(
        self,
        url: str,
        *,
        expected: RemoteStat | None = None,
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        max_in_flight: int = 64,
    ):
        self.url = url
        self.expected = expected
        self.storage_options = dict(storage_options or {})
        self.retry = retry
        self.max_in_flight = max_in_flight
        self._generation = -1  # the fork_generation() it was opened in
        self._fs: Any = None
        self._path = ""
        self._stat: RemoteStat | None = None

    def _filesystem(self) -> tuple[Any, str]:
        if self._generation != fork_generation():  # first use, or a forked child
            self._fs, self._path = filesystem(self.url, self.storage_options)
            self._stat = None
            self._generation = fork_generation()
            try:
                self._check_fresh()
            except BaseException:
                self._generation = -1  # check again on the next read
                raise
        return self._fs, self._path

    def stat(self) -> RemoteStat:
        """The object's current size and ETag (one metadata request per process)."""
        fs, path = self._filesystem()
        if self._stat is None:
            info = with_retries(
                lambda: fs.info(path), self.retry, url=self.url, offset=None, length=None
            )
            self._stat = RemoteStat.from_info(info, self.url)
        return self._stat

    def _check_fresh(self) -> None:
        if self.expected is None:
            return
        now = self.stat()
        problems = []
        if now.size != self.expected.size:
            problems.append(f"its size changed from {self.expected.size} to {now.size} bytes")
        if self.expected.etag and now.etag and now.etag != self.expected.etag:
            problems.append(f"its ETag changed from {self.expected.etag!r} to {now.etag!r}")
        if problems:
            raise StaleIndexError(
                f"remote shard {self.url!r} was replaced after it was indexed: "
                f"{'; '.join(problems)}; "
                "rebuild its index (build_index(url, index_dir=..., force=True))"
            )

    @property
    def size(self) -> int:
        return self.expected.size if self.expected is not None else self.stat().size

    def _checked(self, data: bytes, offset: int, length: int) -> bytes:
        if len(data) != length:
            raise RemoteReadError(
                f"got {len(data)} bytes, not {length} (the object is shorter than its index "
                "says, or the server ignores Range)",
                url=self.url,
                offset=offset,
                length=length,
            )
        return data

    @property
    def etag(self) -> str:
        """The ETag every read is conditional on: the index's, else the one this process
        saw first (a stream is then one version from its first chunk to its last)."""
        if self.expected is not None:
            return self.expected.etag
        return self._stat.etag if self._stat is not None else ""

    def read(self, offset: int, length: int) -> bytes:
        fs, path = self._filesystem()

        def call() -> bytes:
            if getattr(fs, "async_impl", False):
                (got,) = _get_ranges(fs, [(path, offset, offset + length, self.etag, self.url)], 1)
                if isinstance(got, BaseException):
                    raise got
            else:
                got = fs.cat_file(path, start=offset, end=offset + length)
            return self._checked(got, offset, length)

        return with_retries(call, self.retry, url=self.url, offset=offset, length=length)

    def read_many(self, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """All ranges, up to ``max_in_flight`` requests at once; failed ones are retried."""
        if len(offsets) <= 1:
            return [self.read(offset, length) for offset, length in zip(offsets, lengths)]
        return fetch_ranges(
            [self] * len(offsets), offsets, lengths, max_in_flight=self.max_in_flight
        )

    def close(self) -> None:
        self._generation = -1
        self._fs = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "expected": self.expected,
            "storage_options": self.storage_options,
            "retry": self.retry,
            "max_in_flight": self.max_in_flight,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"RangeSource({self.url!r})"


def fetch_ranges(
    sources: Sequence[RangeSource],
    offsets: Sequence[int],
    lengths: Sequence[int],
    *,
    max_in_flight: int = 64,
) -> list[bytes]:
    """Range ``i`` of ``sources[i]`` for every ``i``, concurrently, even across shards.

    Requests to one filesystem go out together (fsspec's ``cat_ranges`` on one event
    loop), at most ``max_in_flight`` at once; failed ones are retried with the first
    source's policy, and the short reads are errors.
    """
    results: list[bytes | None] = [None] * len(sources)
    pending = list(range(len(sources)))
    retry = sources[0].retry if sources else DEFAULT_RETRY
    for attempt in range(1, retry.attempts + 1):
        outcomes = _fetch(sources, offsets, lengths, pending, max_in_flight)
        failed: list[tuple[int, BaseException]] = []
        for i, outcome in zip(pending, outcomes):
            if isinstance(outcome, BaseException):
                failed.append((i, outcome))
            elif len(outcome) != lengths[i]:
                short = RemoteReadError(
                    f"got {len(outcome)} bytes",
                    url=sources[i].url,
                    offset=offsets[i],
                    length=lengths[i],
                )
                failed.append((i, short))
            else:
                results[i] = outcome
        if not failed:
            break
        for _, error in failed:
            if isinstance(error, StaleIndexError):
                raise error
        i, error = failed[0]
        url = sources[i].url
        if not all(is_transient(e) for _, e in failed) or attempt == retry.attempts:
            if isinstance(error, FileNotFoundError):
                raise ShardNotFoundError(
                    f"remote shard {url!r} does not exist ({error})"
                ) from error
            raise RemoteReadError(
                f"{type(error).__name__}: {error} ({len(failed)} of {len(pending)} ranges failed)",
                url=url,
                offset=offsets[i],
                length=lengths[i],
                attempts=attempt,
            ) from error
        wait = retry.delay(attempt)
        log.warning(
            "%d of %d ranges failed (first: %s bytes %d+%d, %s: %s); retry %d/%d in %.2fs",
            len(failed), len(pending), url, offsets[i], lengths[i], type(error).__name__, error,
            attempt, retry.attempts - 1, wait,
        )  # fmt: skip
        time.sleep(wait)
        pending = [i for i, _ in failed]
    return [r for r in results if r is not None]


def _fetch(
    sources: Sequence[RangeSource],
    offsets: Sequence[int],
    lengths: Sequence[int],
    pending: list[int],
    max_in_flight: int,
) -> list[Any]:
    """One attempt at the ``pending`` ranges; exceptions are returned, not raised."""
    outcomes: dict[int, Any] = {}
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i in pending:
        try:
            fs, _ = sources[i]._filesystem()
        except Exception as e:
            outcomes[i] = e
            continue
        groups.setdefault(id(fs), (fs, []))[1].append(i)
    for fs, members in groups.values():
        paths = [sources[i]._path for i in members]
        starts = [offsets[i] for i in members]
        ends = [offsets[i] + lengths[i] for i in members]
        if getattr(fs, "async_impl", False):
            # One event loop, max_in_flight concurrent requests, exceptions returned.
            requests = [
                (path, start, end, sources[i].etag, sources[i].url)
                for i, path, start, end in zip(members, paths, starts, ends)
            ]
            got = _get_ranges(fs, requests, max_in_flight)
        else:
            with concurrent.futures.ThreadPoolExecutor(min(max_in_flight, len(members))) as pool:
                futures = [
                    pool.submit(fs.cat_file, p, start=s, end=e)
                    for p, s, e in zip(paths, starts, ends)
                ]
                got = [f.exception() or f.result() for f in futures]
        outcomes.update(zip(members, got))
    return [outcomes[i] for i in pending]


class RemoteStream(io.RawIOBase):
    """A remote object read front to back in ranged chunks, the next ones prefetched.

    Each chunk is one retried ranged read, so a connection cut mid-object costs one
    chunk, not the whole stream. Wrap it in :class:`io.BufferedReader` for small reads.
    """

    def __init__(self, source: RangeSource, *, chunk_size: int = 8 << 20, prefetch: int = 2):
        super().__init__()
        self.source = source
        self.chunk_size = chunk_size
        self.prefetch = prefetch
        self._buffer = memoryview(b"")
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._ahead: list[concurrent.futures.Future[bytes]] = []
        self._next = 0

    def readable(self) -> bool:
        return True

    def _schedule(self) -> None:
        size = self.source.size
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.prefetch, thread_name_prefix="indextar-stream"
            )
        while len(self._ahead) < self.prefetch and self._next < size:
            length = min(self.chunk_size, size - self._next)
            self._ahead.append(self._pool.submit(self.source.read, self._next, length))
            self._next += length

    def readinto(self, buffer: Any) -> int:
        if not self._buffer:
            self._schedule()
            if not self._ahead:
                return 0
            self._buffer = memoryview(self._ahead.pop(0).result())
            self._schedule()
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

    def close(self) -> None:
        if self._pool is not None:
            for future in self._ahead:
                future.cancel()
            self._pool.shutdown(wait=True)
            self._pool = None
        self._ahead.clear()
        super().close()
