"""A remote object read front to back by one long streaming GET, resumed where it broke.

webdataset reads a shard with one GET (``curl``), and a 20 ms round trip costs it
nothing: the body flows while the samples are used. :class:`ObjectStream` does the
same for ``http(s)://`` and ``s3://`` (a GET signed by :mod:`.sigv4` and sent by the
direct client, :mod:`.s3direct`, where it serves the ``storage_options``; else a
``GetObject`` through s3fs's botocore client), its body streamed, with what a bare GET
lacks:

* **Freshness.** The first answer's ETag (or the one an index recorded) is the
  version read: every resumed request carries it (``If-Match``) and checks the one
  answered, so an object replaced mid-stream raises
  :class:`~indextar.errors.StaleIndexError` and never splices two versions. A server
  that sends no ETag is resumed from byte 0, its first bytes checked against a hash
  of those already read.
* **Resumes.** A reset, a short body or a 5xx mid-body is retried from the byte
  reached (``Range: bytes=N-``) by :mod:`~indextar.source.retry`'s loop; an attempt
  that made progress starts a fresh budget of retries.
* **Read-ahead within a budget.** A thread keeps the GET going while the caller
  parses, up to ``buffer_bytes`` ahead; :meth:`ObjectStream.start` may be called
  before the caller needs the object (the next shard), so that its round trip is
  hidden behind the current one.

The first bytes come one round trip after :meth:`~ObjectStream.start`: no ``HEAD``
and no big first chunk (the size comes from the GET's ``Content-Range``). Other
protocols have no streaming GET here (:func:`streams_protocol`); they read in ranged
chunks (:class:`~indextar.source.stream.RemoteStream`).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import io
import logging
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import IndextarError, StaleIndexError, WrongRangeError
from .conditional import RemoteStat, check_version
from .filesystems import split_url
from .retry import DEFAULT_RETRY, RetryPolicy, with_retries
from .streamgets import StreamAnswer, StreamGet, streaming_get

__all__ = ["ObjectStream", "streams_protocol"]

log = logging.getLogger(__name__)

_STREAMING_PROTOCOLS = ("http", "https", "s3", "s3a")


def streams_protocol(url: str) -> bool:
    """Whether ``url`` is read by one streaming GET (:class:`ObjectStream`)."""
    return split_url(url)[0] in _STREAMING_PROTOCOLS


class _Closed(Exception):
    """The reader closed the stream: the GET stops."""


class ObjectStream(io.RawIOBase):
    """An object's bytes front to back from one streaming GET, resumed where it broke.

    Parameters
    ----------
    url
        An ``http(s)://`` or ``s3://`` URL (see :func:`streams_protocol`).
    storage_options
        fsspec options for the protocol (endpoint, credentials).
    expected
        The size and ETag an index recorded, if any: a different object raises
        :class:`~indextar.errors.StaleIndexError` before its first byte is read.
    retry
        Backoff for transient failures; a failure after progress resumes at once.
    buffer_bytes
        How far the GET may run ahead of the reader.

    Wrap it in :class:`io.BufferedReader` for small reads. ``fetched`` counts the
    bytes received.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        expected: RemoteStat | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        buffer_bytes: int = 16 << 20,
    ):
        super().__init__()
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.expected = expected
        self.retry = retry
        self.buffer_bytes = buffer_bytes
        self.fetched = 0  # bytes received, and where a resumed GET starts
        self.size: int | None = None if expected is None else expected.size
        self.etag = "" if expected is None else expected.etag
        self._chunks: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._end: BaseException | bool = False  # True at the end; an error to raise
        self._stopped = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._buffer = memoryview(b"")
        self._consumed = 0
        self._prefix: Any = None  # the blake2b of the bytes received, where no ETag
        self._room: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def start(self) -> ObjectStream:
        """Send the GET now (idempotent); reads start it if nobody did."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._produce, name="indextar-objectstream", daemon=True
            )
            self._thread.start()
        return self

    # -- the producing thread ---------------------------------------------------------

    def _produce(self) -> None:
        end: BaseException | bool = True
        try:
            run, get = streaming_get(self.url, self.storage_options)
            while (self.size is None or self.fetched < self.size) and not self._stopped:
                offset = self.fetched
                with_retries(
                    lambda: run(lambda: self._pump(get)),
                    self.retry, url=self.url, offset=offset, length=None,
                )  # fmt: skip
        except BaseException as e:  # handed to the reader, raised there
            end = True if self._stopped else e
        with self._changed:
            self._end = end
            self._changed.notify_all()

    async def _pump(self, get: StreamGet) -> None:
        """One GET from ``fetched`` on: its bytes into the buffer until the end, or an
        error. An error after progress returns, so that the next GET resumes with a
        fresh budget of retries; before any, it raises for the retry loop.

        Without an ETag to make it conditional, a resumed GET starts again at byte 0
        and its bytes up to ``fetched`` must hash as those handed out did."""
        start = self.fetched if self.etag or not self.fetched else 0
        body = await get(start, self.etag)
        try:
            self._check(body, start)
            if start < self.fetched:
                await self._match_prefix(body)
                start = self.fetched
            while self.size is None or self.fetched < self.size:
                try:
                    data = await body.read()
                except Exception as e:
                    if self.fetched == start:
                        raise
                    log.warning(
                        "streaming %s broke at byte %d (%s: %s); resuming there",
                        self.url, self.fetched, type(e).__name__, e,
                    )  # fmt: skip
                    return
                if not data:
                    if self.size is None:  # a 200 without Content-Length: its end is the end
                        self.size = self.fetched
                        return
                    raise WrongRangeError(
                        f"the body ended at byte {self.fetched} of {self.size}",
                        url=self.url, offset=start, length=self.size - start, status=body.status,
                    )  # fmt: skip
                await self._put(data)
        finally:
            body.release()

    async def _match_prefix(self, body: StreamAnswer) -> None:
        """Read the answer up to ``fetched``: a version other than the one handed out
        raises; any bytes past it are handed out."""
        digest, seen, target = hashlib.blake2b(), 0, self.fetched
        while seen < target:
            data = await body.read()
            if not data:
                raise WrongRangeError(
                    f"the body ended at byte {seen} of {self.size}",
                    url=self.url, offset=0, length=target, status=body.status,
                )  # fmt: skip
            head = data[: target - seen]
            digest.update(head)
            seen += len(head)
            if seen == target:
                if self._prefix is None or digest.digest() != self._prefix.digest():
                    raise self._stale("its first bytes differ from those already read")
                if len(head) < len(data):
                    await self._put(data[len(head) :])

    def _check(self, body: StreamAnswer, start: int) -> None:
        """Take the object's size and ETag from the first answer; refuse an answer that
        is another version's, or another range."""
        if body.status == 412:
            raise self._stale("the server answered 412 Precondition Failed")
        if body.status == 416 and start == 0:  # an empty object
            self._record(0, body.etag)
            return
        answered = (body.content_range or "").strip()
        if body.status == 206 and answered.startswith(f"bytes {start}-"):
            total = answered.rpartition("/")[2]
            self._record(int(total) if total.isdigit() else None, body.etag)
        elif body.status == 200 and start == 0:
            self._record(body.length, body.etag)
        else:
            raise WrongRangeError(
                f"status {body.status} and Content-Range {body.content_range!r} (asked "
                f"Range: bytes={start}-; the server ignored Range?)",
                url=self.url, offset=start, length=max(1, (self.size or 0) - start),
                status=body.status,
            )  # fmt: skip

    def _record(self, size: int | None, etag: str | None) -> None:
        got = (etag or "").removeprefix("W/").strip('"')
        if self.etag and got and got != self.etag:
            raise self._stale(f"the server answered with ETag {got!r}")
        if self.size is not None and size is not None and size != self.size:
            raise self._stale(f"its size is now {size} bytes, not {self.size}")
        if self.fetched == 0:
            if self.expected is not None:
                check_version(self.url, self.expected, RemoteStat(size or 0, got))
            self.etag = self.etag or got
            self.size = size if self.size is None else self.size

    def _stale(self, what: str) -> StaleIndexError:
        return StaleIndexError(
            f"remote shard {self.url!r} changed while it was streamed (ETag "
            f"{self.etag!r}, {self.fetched} bytes read): {what}; no sample is read "
            "from two versions"
        )

    async def _put(self, data: bytes) -> None:
        if not self.etag:  # what a resume without If-Match must find again
            self._prefix = self._prefix or hashlib.blake2b()
            self._prefix.update(data)
        while True:
            with self._changed:
                if self._stopped:
                    raise _Closed
                if self._queued < self.buffer_bytes:
                    self._chunks.append(data)
                    self._queued += len(data)
                    self.fetched += len(data)
                    self._changed.notify_all()
                    return
                # full: wait on the loop (no thread held) until the reader takes a chunk
                room = self._room = (asyncio.get_running_loop(), asyncio.Event())
            await room[1].wait()

    def _wake_producer(self) -> None:
        """Tell a GET waiting for room that there is some (call holding ``_changed``)."""
        if self._room is not None:
            loop, event = self._room
            self._room = None
            loop.call_soon_threadsafe(event.set)

    # -- the reader -----------------------------------------------------------------

    def readable(self) -> bool:
        return True

    def _next_chunk(self) -> bool:
        """Make the next received chunk the buffer; False at the end of the object."""
        self.start()
        with self._changed:
            self._changed.wait_for(lambda: self._chunks or self._end is not False)
            if not self._chunks:
                if isinstance(self._end, BaseException):
                    if isinstance(self._end, IndextarError):
                        raise self._end
                    raise IndextarError(
                        f"streaming {self.url!r} failed: {self._end}"
                    ) from self._end
                return False
            chunk = self._chunks.popleft()
            self._queued -= len(chunk)
            self._wake_producer()
        self._buffer = memoryview(chunk)
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._buffer and not self._next_chunk():
            return 0
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        self._consumed += n
        return n

    def tell(self) -> int:
        """The object's offset read up to (what decompression errors report)."""
        return self._consumed

    def close(self) -> None:
        """Stop the GET (it ends at its next chunk) and drop what it buffered."""
        with self._changed:
            self._stopped = True
            self._chunks.clear()
            self._queued = 0
            self._wake_producer()
        super().close()
