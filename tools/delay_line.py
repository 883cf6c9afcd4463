"""A TCP delay line in front of an HTTP server: every byte the server sends reaches
the client ``delay_ms`` later, as ``tc qdisc ... netem delay`` would do on a link,
and the bytes of the responses' bodies are counted.

tools/bench_remote.py measures clients against a store with latency on one 2-core
machine, where the store's CPU and the client's share the cores. The first proxy
(``_serve_proxy`` in loopback_servers.py, an aiohttp server forwarding through an
aiohttp client) spent about 1 ms of CPU on every 100 KB request, as much as the
client under test, so the lab charged every per-request design twice for its
requests. This one parses nothing but the request and status lines and the
``Content-Length``/``Transfer-Encoding`` headers it needs to count (a ``find`` per
head), and moves the bytes with asyncio's protocol callbacks: no task, no object per
chunk. Flow control holds: a client that stops reading stops the upstream reads.

Counts: ``requests`` (responses seen) and ``bytes`` (their bodies, headers not
included, as the aiohttp proxy counted). They are served on a second port, as JSON at
``/stats``; ``/reset`` zeroes them.

Run: ``python tools/delay_line.py UPSTREAM_URL PORT CONTROL_PORT DELAY_MS``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import sys
from urllib.parse import urlsplit

STATS = {"requests": 0, "bytes": 0}
HIGH_WATER = 4 << 20
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r\n]*chunked", re.IGNORECASE)


class _Messages:
    """Walks one direction's stream of HTTP/1.1 messages, finding where each body ends.

    ``on_head(head) -> (body_length or -1 for chunked)``; bodies are skipped by length,
    chunked bodies by their chunk sizes."""

    def __init__(self, on_head: collections.abc.Callable[[bytes], int]):
        self.on_head = on_head
        self.buffer = b""
        self.body = 0  # body bytes still to pass (plain body)
        self.chunked = False
        self.chunk = 0  # bytes left in the current chunk, its CRLF included

    def feed(self, data: bytes) -> int:
        """Pass ``data``; returns how many of its bytes were bodies."""
        counted = 0
        view = memoryview(data)
        while view:
            if self.body:
                take = min(self.body, len(view))
                self.body -= take
                counted += take
                view = view[take:]
                continue
            if self.chunked and self.chunk:
                take = min(self.chunk, len(view))
                self.chunk -= take
                counted += take
                view = view[take:]
                continue
            self.buffer += bytes(view)
            view = memoryview(b"")
            if self.chunked:  # a chunk-size line, or the trailer
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    break
                line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
                size = int(line.split(b";")[0] or b"0", 16)
                if size == 0:
                    self.chunked = False  # the trailer's CRLF is dropped before the next head
                else:
                    self.chunk = size + 2
                view, self.buffer = memoryview(self.buffer), b""
                continue
            if self.buffer.startswith(b"\r\n"):  # a chunked body's last CRLF, split off
                self.buffer = self.buffer.lstrip(b"\r\n")
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head, rest = self.buffer[: end + 2], self.buffer[end + 4 :]
            self.buffer = b""
            length = self.on_head(head)
            if length < 0:
                self.chunked = True
            else:
                self.body = length
            view = memoryview(rest)
        return counted


class _Client(asyncio.Protocol):
    """The client's side of one connection; opens its own upstream connection."""

    def __init__(self, host: str, port: int, delay: float):
        self.host, self.port, self.delay = host, port, delay
        self.methods: collections.deque[bytes] = collections.deque()
        self.requests = _Messages(self._request)
        self.pending: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None

    def _request(self, head: bytes) -> int:
        self.methods.append(head[: head.find(b" ")])
        found = _LENGTH.search(head)
        return -1 if _CHUNKED.search(head) else int(found.group(1)) if found else 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        loop.create_task(self._connect(loop))

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            _, self.upstream = await loop.create_connection(
                lambda: _Upstream(self), self.host, self.port
            )
        except OSError:
            assert self.transport is not None
            self.transport.close()
            return
        for data in self.pending:
            self.upstream.transport.write(data)  # type: ignore[union-attr]
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        self.requests.feed(data)
        if self.upstream is None or self.upstream.transport is None:
            self.pending.append(data)
        else:
            self.upstream.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def pause_writing(self) -> None:  # the client reads slower than upstream sends
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()


class _Upstream(asyncio.Protocol):
    """The server's side: delays what it sends by the delay, in order, and counts."""

    def __init__(self, client: _Client):
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.line: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.timer: asyncio.TimerHandle | None = None
        self.responses = _Messages(self._response)
        self.loop = asyncio.get_running_loop()

    def _response(self, head: bytes) -> int:
        status = int(head[9:12])
        if 100 <= status < 200:
            return 0  # an interim response; the request's answer follows
        method = self.client.methods.popleft() if self.client.methods else b"GET"
        STATS["requests"] += 1
        if method == b"HEAD" or status in (204, 304):
            return 0
        found = _LENGTH.search(head)
        return -1 if _CHUNKED.search(head) else int(found.group(1)) if found else 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=HIGH_WATER)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        STATS["bytes"] += self.responses.feed(data)
        self._queue(data)

    def eof_received(self) -> bool:
        self._queue(None)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.line or self.line[-1][1] is not None:
            self._queue(None)

    def _queue(self, data: bytes | None) -> None:
        self.line.append((self.loop.time() + self.client.delay, data))
        if self.timer is None:
            self.timer = self.loop.call_at(self.line[0][0], self._deliver)

    def _deliver(self) -> None:
        self.timer = None
        now = self.loop.time()
        out = self.client.transport
        while self.line and self.line[0][0] <= now:
            _, data = self.line.popleft()
            if out is None or out.is_closing():
                continue
            if data is None:
                out.close()
            else:
                out.write(data)
        if self.line:
            self.timer = self.loop.call_at(self.line[0][0], self._deliver)


class _Control(asyncio.Protocol):
    """``GET /stats`` (the counts as JSON) and ``GET /reset`` on the control port."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" not in self.buffer:
            return
        if self.buffer.split(b" ")[1].startswith(b"/reset"):
            STATS.update(requests=0, bytes=0)
        body = json.dumps(STATS).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        self.transport.write(head.encode() + b"\r\nConnection: close\r\n\r\n" + body)  # type: ignore[attr-defined]
        self.transport.close()


async def serve(upstream: str, port: int, control: int, delay_ms: float) -> None:
    url = urlsplit(upstream)
    host, up_port = url.hostname or "127.0.0.1", url.port or 80
    loop = asyncio.get_running_loop()
    delay = delay_ms / 1000
    # a backlog of 4096, as nginx_store's: at asyncio's 100, the 256 connections a
    # read-ahead row opens at once overflowed it, and a dropped SYN is retried after 1 s
    proxy = await loop.create_server(
        lambda: _Client(host, up_port, delay), "127.0.0.1", port, backlog=4096
    )
    stats = await loop.create_server(_Control, "127.0.0.1", control)
    parent = os.getppid()
    async with proxy, stats:
        while os.getppid() == parent:  # exit with the process that started us
            await asyncio.sleep(0.5)


def main() -> None:
    upstream, port, control, delay_ms = sys.argv[1:5]
    try:  # libuv's loop: about half the CPU of asyncio's own per response (bench extra)
        import uvloop

        uvloop.run(serve(upstream, int(port), int(control), float(delay_ms)))
    except ImportError:
        asyncio.run(serve(upstream, int(port), int(control), float(delay_ms)))


if __name__ == "__main__":
    main()
