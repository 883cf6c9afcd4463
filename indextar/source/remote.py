"""Remote shards through fsspec: ranged reads with retries, one shard or many at once.

Any fsspec protocol works (``http(s)://``, ``s3://``, ``gs://``, ...), through
:func:`~indextar.source.filesystems.filesystem`. Credentials and endpoints come from
where fsspec and the protocol's package look for them (environment,
``~/.config/fsspec``, ``~/.aws``), or from ``storage_options``; indextar never logs
them. Every read is conditional on the version the shard's index recorded
(:mod:`~indextar.source.conditional`); :class:`~indextar.source.stream.RemoteStream`
reads an object front to back.

Transient failures (connection resets, 5xx, timeouts, truncated bodies) are retried
with bounded exponential backoff, by one loop for single requests
(:func:`with_retries`) and batches (:func:`fetch_ranges`); a read that still fails
raises :class:`~indextar.errors.RemoteReadError` naming the URL and the byte range.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import PipeRefusedError, RemoteReadError, ShardNotFoundError, StaleIndexError
from .base import ByteSource, fork_generation
from .conditional import RemoteStat, check_version, get_ranges
from .filesystems import filesystem

__all__ = [
    "ALLOW_PIPE_ENV",
    "DEFAULT_RETRY",
    "RetryPolicy",
    "RangeSource",
    "fetch_ranges",
    "check_pipe_allowed",
    "with_retries",
]

log = logging.getLogger(__name__)

ALLOW_PIPE_ENV = "INDEXTAR_ALLOW_PIPE"
"""Set to ``1`` to allow ``pipe:`` shards everywhere, as ``allow_pipe=True`` does."""

T = TypeVar("T")


def check_pipe_allowed(url: str, allow_pipe: bool) -> None:
    """Refuse a ``pipe:CMD`` shard unless the caller or the environment allows it."""
    if url.startswith("pipe:") and not (allow_pipe or os.environ.get(ALLOW_PIPE_ENV) == "1"):
        raise PipeRefusedError(
            f"refusing the shard {url[:60]!r}: a pipe: shard runs a shell command; pass "
            f"allow_pipe=True or set the environment variable {ALLOW_PIPE_ENV}=1 if you trust it"
        )


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


@dataclass(frozen=True, slots=True)
class _Failed:
    """An attempt that failed: its errors, the first one's request, and a note such as
    how many of the attempt's requests failed."""

    errors: list[BaseException]
    url: str
    offset: int | None
    length: int | None
    note: str = ""


def _retrying(attempt: Callable[[], T | _Failed], policy: RetryPolicy) -> T:
    """``attempt()`` until it returns a result, with backoff while its failures are all
    transient; a changed object (:class:`StaleIndexError`) is never retried. Then
    :class:`ShardNotFoundError` or :class:`RemoteReadError` for the first failure."""
    for number in range(1, policy.attempts + 1):
        outcome = attempt()
        if not isinstance(outcome, _Failed):
            return outcome
        for error in outcome.errors:
            if isinstance(error, StaleIndexError):
                raise error
        error, url = outcome.errors[0], outcome.url
        if not all(map(is_transient, outcome.errors)) or number == policy.attempts:
            if isinstance(error, FileNotFoundError):
                missing = f"remote shard {url!r} does not exist ({error})"
                raise ShardNotFoundError(missing) from error
            raise RemoteReadError(
                f"{type(error).__name__}: {error}{outcome.note}",
                url=url,
                offset=outcome.offset,
                length=outcome.length,
                attempts=number,
            ) from error
        wait = policy.delay(number)
        log.warning(
            "reading %s bytes %s+%s failed (%s: %s)%s; retry %d/%d in %.2fs",
            url, outcome.offset, outcome.length, type(error).__name__, error, outcome.note,
            number, policy.attempts - 1, wait,
        )  # fmt: skip
        time.sleep(wait)
    raise AssertionError("unreachable")


def with_retries(
    call: Callable[[], T], policy: RetryPolicy, *, url: str, offset: int | None, length: int | None
) -> T:
    """``call()``, retried on transient errors; then :class:`RemoteReadError`."""

    def attempt() -> T | _Failed:
        try:
            return call()
        except (StaleIndexError, RemoteReadError):
            raise  # final already: a changed object, a short read, a nested read's verdict
        except Exception as e:
            return _Failed([e], url, offset, length)

    return _retrying(attempt, policy)


DEFAULT_RETRY = RetryPolicy()


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
        if self.expected is not None:
            check_version(self.url, self.expected, self.stat())

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
                (got,) = get_ranges(fs, [(path, offset, offset + length, self.etag, self.url)], 1)
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

    def attempt() -> list[bytes] | _Failed:
        nonlocal pending
        failed: list[tuple[int, BaseException]] = []
        for i, outcome in zip(pending, _fetch(sources, offsets, lengths, pending, max_in_flight)):
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
            return [r for r in results if r is not None]
        asked, pending = len(pending), [i for i, _ in failed]
        first = failed[0][0]
        return _Failed(
            [error for _, error in failed], sources[first].url, offsets[first], lengths[first],
            f" ({len(failed)} of {asked} ranges failed)",
        )  # fmt: skip

    return _retrying(attempt, sources[0].retry if sources else DEFAULT_RETRY)


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
            got = get_ranges(fs, requests, max_in_flight)
        else:
            with concurrent.futures.ThreadPoolExecutor(min(max_in_flight, len(members))) as pool:
                futures = [
                    pool.submit(fs.cat_file, p, start=s, end=e)
                    for p, s, e in zip(paths, starts, ends)
                ]
                got = [f.exception() or f.result() for f in futures]
        outcomes.update(zip(members, got))
    return [outcomes[i] for i in pending]
