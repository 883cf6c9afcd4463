"""The hand-written HTTP/1.1 client of the direct S3 reads (source/http11.py) against a
server on 127.0.0.1 that answers as servers may: bodies in pieces, chunked after a
``100 Continue``, up to the connection's end; kept-alive connections closed while idle;
answers cut short, stalled, or not HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from indextar import native
from indextar.source import extensions
from indextar.source.http11 import Answer, Http11Pool, request_head

BODY = bytes(range(256)) * 400  # 102,400 bytes


@pytest.fixture(autouse=True, params=["c", "python"])
def head_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here with _http11.c's parsing, and again with the Python reference."""
    if request.param == "python":
        monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
    else:
        assert extensions.http11() is not None, "indextar/source/_http11.c did not build"
    return str(request.param)


async def _answer(path: str, writer: asyncio.StreamWriter) -> bool:
    """Write the answer to ``path``; whether the connection stays open."""
    head = b"HTTP/1.1 206 Partial Content\r\ncontent-range: bytes 0-9/10\r\n"
    if path == "/pieces":  # a long body in pieces, then kept alive
        writer.write(head + b'ETag: "abc"\r\ncontent-length: %d\r\n\r\n' % len(BODY))
        for at in range(0, len(BODY), 30_000):
            await writer.drain()
            await asyncio.sleep(0.001)
            writer.write(BODY[at : at + 30_000])
        return True
    if path == "/chunked":
        chunks = b"".join(
            b"%x;x=1\r\n%s\r\n" % (len(c), c) for c in (b"<Code>", b"SlowDown</Code>")
        )
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        writer.write(b"HTTP/1.1 503 Slow Down\r\ntransfer-encoding: chunked\r\n\r\n" + chunks)
        await writer.drain()
        writer.write(b"0\r\n\r\n")
        return True
    if path == "/to-the-end":
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + BODY[:5000])
        return False
    if path == "/cut":
        writer.write(head + b"content-length: %d\r\n\r\n" % len(BODY) + BODY[:1000])
        return False
    if path == "/stall":
        writer.write(head + b"content-length: 10\r\n\r\n12345")
        await writer.drain()
        await asyncio.sleep(5)
        return False
    if path == "/gibberish":
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        return False
    writer.write(
        head + b"content-length: 10\r\nconnection: %s\r\n\r\n0123456789" % path[1:].encode()
    )
    return path != "/close"


class Server:
    """Answers each request by its path (:func:`_answer`), and counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                if not await _answer(path, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def drop_idle(self) -> None:
        for writer in self.writers:
            writer.close()


def serve(test: Callable[[Http11Pool, Server], Awaitable[None]], read_timeout: float = 5) -> None:
    async def run() -> None:
        server = Server()
        listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        port = listening.sockets[0].getsockname()[1]
        pool = Http11Pool("http", f"127.0.0.1:{port}", connect_timeout=5, read_timeout=read_timeout)
        try:
            await test(pool, server)
        finally:
            pool.close()
            server.drop_idle()
            listening.close()
            await listening.wait_closed()

    asyncio.run(run())


async def get(pool: Http11Pool, path: str) -> Answer:
    head = request_head(path, f"{pool.host}:{pool.port}", {"range": "bytes=0-9"})
    return await pool.get(f"http://{pool.host}:{pool.port}{path}", head)


def test_bodies_in_pieces_come_whole_over_one_kept_alive_connection() -> None:
    async def test(pool: Http11Pool, server: Server) -> None:
        for _ in range(3):
            answer = await get(pool, "/pieces")
            assert (answer.status, answer.reason) == (206, "Partial Content")
            assert answer.body == BODY and answer.headers["etag"] == '"abc"'
        assert server.connections == 1
        both = await asyncio.gather(get(pool, "/pieces"), get(pool, "/keep-alive"))
        assert [a.body for a in both] == [BODY, b"0123456789"] and server.connections == 2

    serve(test)


def test_a_connection_closed_while_idle_or_by_its_answer_is_replaced() -> None:
    async def test(pool: Http11Pool, server: Server) -> None:
        assert (await get(pool, "/keep-alive")).body == b"0123456789"
        server.drop_idle()  # the server closes it while the pool keeps it
        await asyncio.sleep(0.05)
        assert (await get(pool, "/keep-alive")).body == b"0123456789"
        assert (await get(pool, "/close")).body == b"0123456789"  # "connection: close"
        assert (await get(pool, "/keep-alive")).body == b"0123456789"
        assert server.connections == 3

    serve(test)


def test_chunked_after_100_continue_and_up_to_the_end_bodies_are_read() -> None:
    async def test(pool: Http11Pool, server: Server) -> None:
        chunked = await get(pool, "/chunked")
        assert (chunked.status, chunked.body) == (503, b"<Code>SlowDown</Code>")
        assert (await get(pool, "/keep-alive")).body == b"0123456789"
        assert server.connections == 1  # the chunked answer left it reusable
        to_the_end = await get(pool, "/to-the-end")
        assert (to_the_end.status, to_the_end.body) == (200, BODY[:5000])

    serve(test)


@pytest.mark.parametrize(
    ("path", "error", "says"),
    [
        ("/cut", ConnectionError, "after 1000 bytes of its body"),
        ("/stall", TimeoutError, "no answer for 0.3 s"),
        ("/gibberish", ConnectionError, "not an HTTP/1.1 answer"),
    ],
)
def test_answers_cut_short_stalled_or_not_http_raise_what_the_retries_retry(
    path: str, error: type[Exception], says: str
) -> None:
    async def test(pool: Http11Pool, server: Server) -> None:
        with pytest.raises(error, match=says):
            await get(pool, path)
        assert (await get(pool, "/keep-alive")).body == b"0123456789"  # a new connection

    serve(test, read_timeout=0.3)


def test_a_refused_connection_is_a_connection_error() -> None:
    async def test() -> None:
        pool = Http11Pool("http", "127.0.0.1:1", connect_timeout=5, read_timeout=5)
        with pytest.raises(ConnectionError):
            await get(pool, "/keep-alive")

    asyncio.run(test())
