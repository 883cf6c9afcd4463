"""HTTP/1.1 GETs on keep-alive connections, by hand: the direct S3 client's ranged reads.

A ranged GET through aiohttp's ``ClientSession`` builds a request, a response, two
header multidicts, a URL, a payload parser, a stream reader and its chunk list (joined
into the body: one copy), and reschedules a timer on every read: 0.3 ms of CPU for a
100 kB sample, half of what a read-ahead sample cost in all (docs/remote.md). A signed
ranged GET needs less: its request written in one ``send``, a status line and a few
headers parsed, and a body of a known length received straight into one buffer
(``recv_into``). :class:`Http11Pool` does that over keep-alive connections to one
host, one request on a connection at a time, as many connections as requests in
flight (aiohttp's ``limit=0``); :mod:`.s3direct` sends its ranged GETs through it and
:mod:`.conditional` checks the answers as it checked aiohttp's.

Failures reach the retry loop as aiohttp's did, transient: a refused or reset
connection, or a response cut short, as ``ConnectionError``; a connection that takes
longer than the connect timeout, or a response that stalls longer than the read
timeout between two reads, as ``TimeoutError``. A kept-alive connection the server
closed while it was idle is replaced once, as aiohttp does, before the error counts.
Bodies come with a ``Content-Length``, chunked (S3's error documents may) or up to the
connection's end.

An answer's head is parsed, and its body's buffer made without zeroing it first, in C
where ``_http11.c`` is built (:func:`parse_head`, ``bytearray(n)``'s zeros are 4% of a
read-ahead worker's CPU); :func:`parse_head_py` is the reference it is tested against.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .extensions import http11 as _extension

if TYPE_CHECKING:
    import ssl

__all__ = ["Answer", "Http11Pool", "parse_head", "parse_head_py", "request_head", "ssl_context"]

_HEAD_BYTES = 16 << 10  # a response's status line and headers, to start with
_MAX_HEAD_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class Answer:
    """A response: its status, reason, headers (names in lower case) and body."""

    url: str
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes | bytearray

    @property
    def request_info(self) -> Any:
        """aiohttp's ``RequestInfo`` of the GET, for the errors that carry it."""
        from aiohttp import RequestInfo
        from multidict import CIMultiDict, CIMultiDictProxy
        from yarl import URL

        url = URL(self.url, encoded=True)
        return RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict()), url)

    @property
    def history(self) -> tuple[()]:
        return ()


def request_head(path: str, host: str, headers: dict[str, str]) -> bytes:
    """The bytes of a GET of ``path`` (encoded) from ``host`` with ``headers``."""
    lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    return f"GET {path} HTTP/1.1\r\nhost: {host}\r\n{lines}\r\n".encode("latin-1")


Head = tuple[str, int, str, dict[str, str]]
"""An answer's ``(version, status, reason, headers)``: header names in lower case, a
repeated header's values joined by ``", "``."""


def parse_head_py(head: bytes | bytearray | memoryview, end: int) -> Head:
    """The status line and headers in ``head[:end]`` (the blank line not included);
    ``ValueError`` where it is not an HTTP/1.x status line."""
    lines = str(memoryview(head)[:end], "latin-1").split("\r\n")
    version, _, answered = lines[0].partition(" ")
    code, _, reason = answered.partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"status line {lines[0][:80]!r}")
    status = int(code)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return version, status, reason, headers


def parse_head(head: bytes | bytearray | memoryview, end: int) -> Head:
    """:func:`parse_head_py`, in C where it is built (its common case: an ASCII head)."""
    extension = _extension()
    parsed = None if extension is None else extension.parse_head(head, end)
    return parse_head_py(head, end) if parsed is None else parsed


def unfilled(size: int) -> bytearray:
    """A ``bytearray`` of ``size`` bytes to be overwritten whole (not zeroed in C)."""
    extension = _extension()
    return bytearray(size) if extension is None else extension.unfilled(size)


class _Connection(asyncio.BufferedProtocol):
    """One keep-alive connection; reads each response into one buffer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float, where: str):
        self.loop = loop
        self.read_timeout = read_timeout
        self.where = where
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = True
        self._waiter: asyncio.Future[Answer] | None = None
        self._url = ""
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0  # when the last bytes came
        self._head = bytearray(_HEAD_BYTES)
        self._head_len = 0
        self._status, self._reason, self._headers = 0, "", {}  # type: ignore[var-annotated]
        self._body: bytearray | None = None  # None: still reading the head
        self._got = 0
        self._length = -1  # the body's length; -1: up to the connection's end
        self._chunked = False
        self._received = False  # any byte of the answer yet

    # -- a request -------------------------------------------------------------------

    def send(self, url: str, head: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None and self._waiter is None
        if len(self._head) > _HEAD_BYTES:  # grown for a long chunked body: let it go
            self._head = bytearray(_HEAD_BYTES)
        self._waiter = waiter = self.loop.create_future()
        self._url, self._received, self._head_len, self._body = url, False, 0, None
        self._last = self.loop.time()
        if self._timer is None:  # one timer a connection, re-armed only when it fires
            self._timer = self.loop.call_at(self._last + self.read_timeout, self._check_timeout)
        self.transport.write(head)
        return waiter

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()

    def _check_timeout(self) -> None:
        self._timer = None
        if self._waiter is None or self._waiter.done():
            return
        due = self._last + self.read_timeout
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check_timeout)
            return
        self._fail(TimeoutError(f"{self._url}: no answer for {self.read_timeout:g} s"))
        self.abort()

    def _fail(self, error: BaseException) -> None:
        self.reusable = False
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _finish(self, body: bytes | bytearray) -> None:
        waiter, self._waiter = self._waiter, None
        self._body = None
        if not self.reusable and self.transport is not None:
            self.transport.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(Answer(self._url, self._status, self._reason, self._headers, body))

    # -- asyncio's protocol ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        body = self._body
        if body is not None and not self._chunked and self._length >= 0:
            return memoryview(body)[self._got :]
        if self._head_len == len(self._head):  # a long head, or a chunked or open body
            self._head.extend(bytes(len(self._head)))
        return memoryview(self._head)[self._head_len :]

    def buffer_updated(self, nbytes: int) -> None:
        self._last = self.loop.time()
        self._received = True
        if self._waiter is None:  # bytes nobody asked for: never reuse this one
            self.abort()
            return
        if self._body is not None and not self._chunked and self._length >= 0:
            self._got += nbytes
            if self._got >= self._length:
                self._finish(self._body)
            return
        self._head_len += nbytes
        try:
            self._parse()
        except (ValueError, IndexError) as e:
            self._fail(ConnectionError(f"{self._url}: not an HTTP/1.1 answer ({e})"))
            self.abort()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost says what it cut short

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed, self.reusable = True, False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiter is None:
            return
        if self._body is not None and self._length < 0 and not self._chunked:
            self._finish(bytes(self._head[: self._head_len]))  # a body up to the end
            return
        got = "no answer" if not self._received else f"{self._got} bytes of its body"
        error = ConnectionError(f"{self._url}: the connection closed after {got}")
        if exc is not None:
            error.__cause__ = exc
        self._fail(error)

    # -- parsing ---------------------------------------------------------------------

    def _parse(self) -> None:
        """Parse what the head buffer holds: the head, then a body that is not read
        into a buffer of its own (chunked, or up to the connection's end)."""
        head = self._head
        if self._body is None:
            end = head.find(b"\r\n\r\n", 0, self._head_len)
            if end < 0:
                if self._head_len >= _MAX_HEAD_BYTES:
                    raise ValueError(f"no end of its head in {self._head_len} bytes")
                return
            if not self._start_body(end):
                return self._parse()  # a 1xx answer before the real one
        # a chunked body ends with CRLF CRLF: parse it whole only then (once, mostly),
        # not at every read (a long body would be copied over and over)
        if self._chunked and head[self._head_len - 4 : self._head_len] == b"\r\n\r\n":
            body = _dechunked(head, self._head_len)
            if body is not None:
                self._finish(body)

    def _start_body(self, end: int) -> bool:
        """Take the status and headers of the head that ends at ``end`` and start its
        body; False for a 1xx answer (the real one follows)."""
        head, start = self._head, end + 4
        version, status, reason, headers = parse_head(head, end)
        if status < 200:
            self._shift(start)
            return False
        self._status, self._reason, self._headers = status, reason, headers
        connection = headers.get("connection", "").lower()
        self.reusable = "close" not in connection and (
            version == "HTTP/1.1" or "keep-alive" in connection
        )
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._got, self._length = 0, -1
        if self._chunked or length is None:  # the body is read into the head buffer
            self.reusable = self.reusable and self._chunked
            self._shift(start)
            self._body = bytearray()  # a marker: the head is read
            return True
        self._length = int(length)
        rest = self._head_len - start
        if rest > self._length:
            self.reusable = False  # more than the answer: never reuse this connection
        self._body = body = unfilled(self._length)  # handed out only once filled
        self._got = got = min(rest, self._length)
        body[:got] = memoryview(head)[start : start + got]
        self._head_len = 0
        if got == self._length:
            self._finish(body)
        return True

    def _shift(self, start: int) -> None:
        """Drop the head buffer's bytes before ``start``."""
        rest = self._head_len - start
        self._head[:rest] = self._head[start : self._head_len]
        self._head_len = rest


def _dechunked(data: bytearray, size: int) -> bytes | None:
    """A chunked body's bytes once ``data[:size]`` holds all of it, else None."""
    out, at = bytearray(), 0
    while True:
        line_end = data.find(b"\r\n", at, size)
        if line_end < 0:
            return None
        length = int(bytes(data[at:line_end]).split(b";")[0].strip() or b"0", 16)
        at = line_end + 2
        if length == 0:
            return bytes(out) if data.find(b"\r\n\r\n", at - 2, size) >= 0 else None
        if at + length + 2 > size:
            return None
        out += data[at : at + length]
        at += length + 2


class Http11Pool:
    """Keep-alive connections to one host, for one event loop in one process.

    Parameters
    ----------
    scheme, netloc
        ``http`` or ``https``, and the host with its port where it is not the scheme's.
    verify
        For ``https``: verify the server's certificate (``True``), not (``False``), or
        against this CA bundle; as aiohttp's ``ssl=`` and botocore's ``verify=``.
    connect_timeout, read_timeout
        Seconds to connect, and at most between two reads of an answer.
    """

    def __init__(
        self,
        scheme: str,
        netloc: str,
        *,
        verify: bool | str = True,
        connect_timeout: float,
        read_timeout: float,
    ):
        self.host, self.port = _host_port(netloc, scheme)
        self.ssl_context = ssl_context(verify) if scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []

    async def get(self, url: str, head: bytes) -> Answer:
        """The answer to the request ``head`` (:func:`request_head`) of ``url``."""
        # One coroutine a request: a read-ahead worker makes thousands a second, and
        # each coroutine frame costs.
        connection = self._idle_connection()
        while True:
            kept = connection is not None
            if connection is None:
                connection = await self._connect()
            try:
                answer = await connection.send(url, head)
            except BaseException as e:
                connection.abort()  # an answer cut short, or cancelled: never reused
                if kept and isinstance(e, ConnectionError) and not connection._received:
                    connection = None  # closed by the server while idle: once on a new one
                    continue
                raise
            if connection.reusable and not connection.closed:
                self._idle.append(connection)
            return answer

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        where = f"{self.host}:{self.port}"
        connecting = loop.create_connection(
            lambda: _Connection(loop, self.read_timeout, where), self.host, self.port,
            ssl=self.ssl_context, server_hostname=self.host if self.ssl_context else None,
        )  # fmt: skip
        try:
            _, connection = await asyncio.wait_for(connecting, self.connect_timeout)
        except asyncio.TimeoutError as e:
            raise TimeoutError(f"connecting to {where} took over {self.connect_timeout:g} s") from e
        return connection

    def close(self) -> None:
        """Close the idle connections, at once: aborted (a TLS connection's close waits
        for the server's close_notify first, and a loop that ends meanwhile, as
        ``asyncio.run``'s does, leaves its socket to the garbage collector; HTTP/1.1's
        answers are framed by their lengths, so nothing is lost)."""
        for connection in self._idle:
            connection.abort()
        self._idle.clear()


def _host_port(netloc: str, scheme: str) -> tuple[str, int]:
    """The host to connect to and its port (the scheme's where the netloc names none)."""
    host, port = netloc, ""
    if netloc.startswith("["):  # an IPv6 address
        host, _, port = netloc[1:].partition("]")
        port = port.removeprefix(":")
    elif netloc.count(":") == 1:
        host, _, port = netloc.partition(":")
    return host, int(port) if port else {"http": 80, "https": 443}[scheme]


def ssl_context(verify: bool | str) -> ssl.SSLContext:
    """The TLS context of botocore's ``verify=``: verify (``True``), not (``False``), or
    against this CA bundle (a path)."""
    import ssl

    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=None if verify is True else verify)
