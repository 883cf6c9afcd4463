"""Remote shards through fsspec: ranged reads with retries, one shard or many at once.

Any fsspec protocol works (``http(s)://``, ``s3://``, ``gs://``, ...), through
:func:`~indextar.source.filesystems.filesystem`. Credentials and endpoints come from where
fsspec and the protocol's package look for them (environment, ``~/.config/fsspec``,
``~/.aws``), or from ``storage_options``; indextar never logs them. Every read is
conditional on the version the shard's index recorded (:mod:`~indextar.source.conditional`);
:class:`~indextar.source.stream.RemoteStream` reads an object front to back.

Transient failures (connection resets, 5xx, timeouts, truncated bodies, answers with
another range than the one asked for) are retried with bounded exponential backoff
and ``Retry-After`` (:mod:`~indextar.source.retry`), by one loop for single requests
(:func:`with_retries`) and batches (:func:`fetch_ranges`); a read that still fails
raises :class:`~indextar.errors.RemoteReadError` naming the URL, the byte range, the
sample and the last status.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import StaleIndexError, WrongRangeError
from .base import ByteSource, Span, SpanBytes, checked_key, fork_generation, split_members
from .conditional import (
    RemoteStat,
    check_version,
    get_range,
    get_range_direct,
    get_ranges,
    get_ranges_direct,
    head_direct,
    wrong_or_stale,
)
from .filesystems import filesystem, split_url, without_client_retries
from .fsspec_internals import default_loop, run_on_default_loop
from .retry import DEFAULT_RETRY, Failed, RetryPolicy, retrying, with_retries
from .s3direct import S3Direct, direct_client_for

__all__ = ["DEFAULT_RETRY", "RetryPolicy", "RangeSource", "fetch_ranges", "with_retries"]

log = logging.getLogger(__name__)


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
        "url", "expected", "storage_options", "retry", "max_in_flight", "_fs", "_path",
        "_generation", "_fs_generation", "_stat", "_direct", "_bucket", "_key",
    )  # fmt: skip

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
        self._generation = -1  # the fork_generation() it was checked fresh in
        self._fs_generation = -1  # the one its filesystem was made in
        self._fs: Any = None
        self._path = ""
        self._stat: RemoteStat | None = None
        self._direct: S3Direct | None = None
        self._bucket = self._key = ""

    def _filesystem(self) -> tuple[Any, str]:
        """The fsspec filesystem (per process): for metadata, and for the ranged reads
        of every protocol but the ``s3://`` the direct client serves."""
        self._ready()
        if self._fs_generation != fork_generation():
            options = without_client_retries(self.url, self.storage_options)
            self._fs, self._path = filesystem(self.url, options)
            self._fs_generation = fork_generation()
        return self._fs, self._path

    def _ready(self) -> None:
        """Once per process (first use, or a forked child): choose the client, and
        compare the object with its index. Where the direct S3 client reads and the
        index recorded an ETag, the comparison is left to the reads: each carries
        ``If-Match``, so a DataLoader worker sends no HEAD and builds no s3fs client."""
        if self._generation == fork_generation():
            return
        self._generation = fork_generation()
        self._stat = None  # a forked child asks again
        try:
            self._direct = direct_client_for(self.url, self.storage_options)
            if self._direct is not None:
                self._bucket, _, self._key = split_url(self.url)[1].partition("/")
            if self._direct is None or self.expected is None or not self.expected.etag:
                self._check_fresh()
        except BaseException:
            self._generation = -1  # check again on the next read
            raise

    def stat(self) -> RemoteStat:
        """The object's current size and ETag (one metadata request per process:
        a HEAD through the direct S3 client where it reads, else fsspec's ``info``)."""
        self._ready()
        if self._stat is None:
            direct, bucket, key = self._direct, self._bucket, self._key
            if direct is not None:
                head = functools.partial(head_direct, direct, bucket, key, self.url)
                stat = with_retries(
                    lambda: run_on_default_loop(head), self.retry, url=self.url,
                    offset=None, length=None,
                )  # fmt: skip
            else:
                fs, path = self._filesystem()
                info = with_retries(
                    lambda: fs.info(path), self.retry, url=self.url, offset=None, length=None
                )
                stat = RemoteStat.from_info(info, self.url)
            self._stat = stat
        return self._stat

    def _check_fresh(self) -> None:
        if self.expected is not None:
            check_version(self.url, self.expected, self.stat())

    @property
    def size(self) -> int:
        return self.expected.size if self.expected is not None else self.stat().size

    @property
    def etag(self) -> str:
        """The ETag every read is conditional on: the index's, else the one this process
        saw first (a stream is then one version from its first chunk to its last)."""
        if self.expected is not None:
            return self.expected.etag
        return self._stat.etag if self._stat is not None else ""

    def held(self, offset: int, length: int) -> bytes | None:
        """The range's bytes if this source holds them locally (a shard being put into
        the cache: :class:`~indextar.source.fillcache.FillingSource`), else None."""
        return None

    def keep(self, offset: int, data: SpanBytes) -> None:
        """Told each range fetched, checked (a filling cache writes it down)."""

    def fetch_length(self, offset: int, length: int) -> int:
        """How many bytes from ``offset`` to fetch for a read of ``length``: ``length``;
        a filling cache takes a sample's tar padding along."""
        return length

    def _plan(self, offset: int, length: int) -> tuple[bytes | None, int]:
        """A read's first half: the range's bytes if :meth:`held`, else None and how many
        to fetch (:meth:`fetch_length`); every read (one, a batch, a coroutine) then
        fetches, and ends by :meth:`_settle`."""
        held = self.held(offset, length)
        return (held, length) if held is not None else (None, self.fetch_length(offset, length))

    def _settle(self, data: SpanBytes, offset: int, length: int, fetched: int) -> SpanBytes:
        """A read's second half: the ``fetched`` bytes from ``offset`` checked (a short
        answer raises :class:`~indextar.errors.WrongRangeError`), only then kept
        (:meth:`keep`), and cut to the ``length`` read."""
        if len(data) != fetched:
            raise WrongRangeError(
                f"{len(data)} bytes (the object is shorter than its index says, or the "
                "server ignores Range)",
                url=self.url, offset=offset, length=fetched, status=None,
            )  # fmt: skip
        self.keep(offset, data)
        return data if fetched == length else data[:length]

    def _read_once(self, offset: int, length: int) -> SpanBytes:
        """One request for the range, its answer checked, its body as received; no retries."""
        held, fetched = self._plan(offset, length)
        if held is not None:
            return held
        (got,) = _fetch([self], [offset], [fetched], [0], 1)
        if isinstance(got, BaseException):
            raise got
        return self._settle(got, offset, length, fetched)

    def range_coroutine(
        self, offset: int, length: int
    ) -> Callable[[], Awaitable[SpanBytes]] | None:
        """A function whose coroutine makes one attempt at the range on fsspec's own
        event loop (:func:`~indextar.source.fsspec_internals.default_loop`), as
        :meth:`_read_once` does but for the retries; None where this shard's reads go
        through a filesystem with a loop of its own, or a blocking one. Call it in a
        reader's thread, never on the loop: the first call may check the object first."""
        self._ready()
        etag, url, direct = self.etag, self.url, self._direct
        hooks = (type(self).held, type(self).keep, type(self).fetch_length)
        plain = hooks == (RangeSource.held, RangeSource.keep, RangeSource.fetch_length)
        if direct is not None and plain:  # the read-ahead's common case: no closure
            request = (self._bucket, self._key, offset, offset + length, etag, url)
            return functools.partial(get_range_direct, direct, request)
        if direct is not None:
            bucket, key = self._bucket, self._key

            def get(start: int, end: int) -> Awaitable[SpanBytes]:
                return get_range_direct(direct, (bucket, key, start, end, etag, url))
        else:
            fs, path = self._filesystem()
            if not getattr(fs, "async_impl", False) or fs.loop is not default_loop():
                return None

            def get(start: int, end: int) -> Awaitable[SpanBytes]:
                return get_range(fs, path, start, end, etag, url)

        if plain:
            return functools.partial(get, offset, offset + length)
        return functools.partial(self._through_hooks, get, offset, length)

    async def _through_hooks(
        self, get: Callable[[int, int], Awaitable[SpanBytes]], offset: int, length: int
    ) -> SpanBytes:
        """The range as :meth:`_read_once` reads it, by ``get(start, end)``; the hooks in
        the loop's executor (a filling cache's block, and its last :meth:`keep` fetches
        on the loop)."""
        loop = asyncio.get_running_loop()
        held, fetched = await loop.run_in_executor(None, self._plan, offset, length)
        if held is not None:
            return held
        data = await get(offset, offset + fetched)
        return await loop.run_in_executor(None, self._settle, data, offset, length, fetched)

    def read(self, offset: int, length: int) -> bytes:
        self._ready()
        data = with_retries(
            lambda: self._read_once(offset, length),
            self.retry, url=self.url, offset=offset, length=length,
        )  # fmt: skip
        return data if type(data) is bytes else bytes(data)

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
        """A sample's members, read and checked in one loop of retries: a span whose
        headers are not the sample's, from an object whose ETag is unchanged, was a wrong
        answer (:func:`~indextar.source.conditional.wrong_or_stale`) and is read again."""
        self._ready()
        checked = checked_key(key, check_names)

        def call() -> list[tuple[str, bytes]]:
            span = self._read_once(offset, length)
            try:
                return split_members(
                    span, member_rows, first, count, ext_names, checked, shard=self.url,
                    offset=offset, name=key,
                )  # fmt: skip
            except StaleIndexError as e:
                if self.expected is None or not self.expected.etag:
                    raise  # no version to tell a changed object from a wrong answer
                where, expected = self._filesystem(), self.expected
                raise wrong_or_stale(
                    self.url, expected, where, self.retry, e, offset, length
                ) from e

        name = None if not key else key.decode("utf-8", "surrogateescape")
        return with_retries(call, self.retry, url=self.url, offset=offset, length=length, key=name)

    def read_members_many(
        self,
        spans: Sequence[Span],
        member_rows: npt.NDArray[np.int64],
        ext_names: tuple[str, ...],
        *,
        check_names: bool = True,
    ) -> list[list[tuple[str, bytes]]]:
        """:meth:`read_members` of each span, all fetched at once; a span whose headers
        are not its sample's is read again alone, by :meth:`read_members`."""
        offsets, lengths = [span[0] for span in spans], [span[1] for span in spans]
        sources = [self] * len(spans)  # the bodies as received: members are copied out once
        datas = fetch_ranges(sources, offsets, lengths, max_in_flight=self.max_in_flight)
        out = []
        for (offset, length, first, count, key), data in zip(spans, datas):
            try:
                members = split_members(
                    data, member_rows, first, count, ext_names, checked_key(key, check_names),
                    shard=self.url, offset=offset, name=key,
                )  # fmt: skip
            except StaleIndexError:
                members = self.read_members(
                    offset, length, member_rows, first, count, ext_names, key,
                    check_names=check_names,
                )  # fmt: skip
            out.append(members)
        return out

    def read_many(self, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """All ranges, up to ``max_in_flight`` requests at once; failed ones are retried."""
        if len(offsets) <= 1:
            return [self.read(offset, length) for offset, length in zip(offsets, lengths)]
        sources = [self] * len(offsets)
        got = fetch_ranges(sources, offsets, lengths, max_in_flight=self.max_in_flight)
        return [data if type(data) is bytes else bytes(data) for data in got]

    def close(self) -> None:
        self._generation = self._fs_generation = -1
        self._fs = self._direct = None

    def __getstate__(self) -> dict[str, Any]:
        names = ("url", "expected", "storage_options", "retry", "max_in_flight")
        return {name: getattr(self, name) for name in names}

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
    keys: Sequence[str] | None = None,
) -> list[SpanBytes]:
    """Range ``i`` of ``sources[i]`` for every ``i``, concurrently, even across shards.

    Requests to one filesystem go out together (fsspec's ``cat_ranges`` on one event
    loop), at most ``max_in_flight`` at once; failed ones are retried with the first
    source's policy, and the short reads are errors. ``keys[i]``, if given, names the
    sample of range ``i`` in errors. Bodies come as received (direct S3: ``bytearray``).
    """
    results: list[Any] = [None] * len(sources)
    asked = list(lengths)  # what is fetched: a filling cache's ranges take their padding
    for i, source in enumerate(sources):
        results[i], asked[i] = source._plan(offsets[i], lengths[i])
    pending = [i for i, result in enumerate(results) if result is None]

    def attempt() -> list[SpanBytes] | Failed:
        nonlocal pending
        failed: list[tuple[int, BaseException]] = []
        for i, outcome in zip(pending, _fetch(sources, offsets, asked, pending, max_in_flight)):
            if isinstance(outcome, BaseException):
                failed.append((i, outcome))
                continue
            try:
                results[i] = sources[i]._settle(outcome, offsets[i], lengths[i], asked[i])
            except WrongRangeError as e:  # short: not kept
                failed.append((i, e))
        if not failed:
            return results
        tried, pending = len(pending), [i for i, _ in failed]
        first = failed[0][0]
        return Failed(
            [error for _, error in failed], sources[first].url, offsets[first], lengths[first],
            f" ({len(failed)} of {tried} ranges failed)", None if keys is None else keys[first],
        )  # fmt: skip

    return retrying(attempt, sources[0].retry if sources else DEFAULT_RETRY)


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
    direct: dict[int, tuple[S3Direct, list[int]]] = {}
    for i in pending:
        source = sources[i]
        try:
            source._ready()
            if source._direct is not None:
                direct.setdefault(id(source._direct), (source._direct, []))[1].append(i)
                continue
            fs, _ = source._filesystem()
        except Exception as e:
            outcomes[i] = e
            continue
        groups.setdefault(id(fs), (fs, []))[1].append(i)
    for client, members in direct.values():
        direct_requests = [
            (s._bucket, s._key, offsets[i], offsets[i] + lengths[i], s.etag, s.url)
            for i, s in ((i, sources[i]) for i in members)
        ]
        got = get_ranges_direct(client, direct_requests, max_in_flight)
        outcomes.update(zip(members, got))
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
        elif len(members) == 1:  # one read: no threads to start
            try:
                got = [fs.cat_file(paths[0], start=starts[0], end=ends[0])]
            except Exception as e:
                got = [e]
        else:
            with concurrent.futures.ThreadPoolExecutor(min(max_in_flight, len(members))) as pool:
                futures = [
                    pool.submit(fs.cat_file, p, start=s, end=e)
                    for p, s, e in zip(paths, starts, ends)
                ]
                got = [f.exception() or f.result() for f in futures]
        outcomes.update(zip(members, got))
    return [outcomes[i] for i in pending]
