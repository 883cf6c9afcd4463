"""tools/delay_line.py, the delaying proxy of tools/bench_remote.py: every response
arrives the delay late, bytes pass unchanged, and the counts are of bodies only."""

from __future__ import annotations

import http.client
import os
import select
import signal
import socket
import time
from pathlib import Path

import pytest
from loopback_servers import DelayProxy, HttpServer


@pytest.fixture
def served(tmp_path: Path) -> tuple[Path, bytes]:
    data = bytes(range(256)) * 4000  # 1,024,000 bytes
    (tmp_path / "blob.bin").write_bytes(data)
    return tmp_path, data


def _get(port: int, path: str, method: str = "GET", **headers: str) -> tuple[int, bytes, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    start = time.perf_counter()
    connection.request(method, path, headers=headers)
    answer = connection.getresponse()
    body = answer.read()
    connection.close()
    return answer.status, body, time.perf_counter() - start


def test_the_delay_line_delays_each_response_and_counts_its_body(
    served: tuple[Path, bytes],
) -> None:
    folder, data = served
    with (
        HttpServer(folder) as server,
        DelayProxy(f"http://127.0.0.1:{server.port}", delay_ms=150) as proxy,
    ):
        _, _, direct = _get(server.port, "/files/blob.bin", Range="bytes=0-99")
        proxy.reset()
        status, body, late = _get(proxy.port, "/files/blob.bin", Range="bytes=1000-100999")
        assert status == 206 and body == data[1000:101000]
        assert late >= 0.15 and late - direct >= 0.1
        status, whole, _ = _get(proxy.port, "/files/blob.bin")
        assert status == 200 and whole == data
        status, nothing, _ = _get(proxy.port, "/files/blob.bin", method="HEAD")
        assert status == 200 and nothing == b""
        # three responses; the bodies only (a HEAD's Content-Length is not a body)
        assert proxy.stats() == {"requests": 3, "bytes": 100_000 + len(data)}
        proxy.reset()
        assert proxy.stats() == {"requests": 0, "bytes": 0}


def test_many_requests_on_one_connection_come_back_in_order(served: tuple[Path, bytes]) -> None:
    folder, data = served
    with (
        HttpServer(folder) as server,
        DelayProxy(f"http://127.0.0.1:{server.port}", delay_ms=20) as proxy,
    ):
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        for start in range(0, 50_000, 5_000):  # keep-alive: one connection, ten responses
            connection.request(
                "GET", "/files/blob.bin", headers={"Range": f"bytes={start}-{start + 4999}"}
            )
            answer = connection.getresponse()
            assert answer.status == 206 and answer.read() == data[start : start + 5000]
        connection.close()
        assert proxy.stats() == {"requests": 10, "bytes": 50_000}


@pytest.mark.parametrize("kind", ["tcp", "aiohttp"])
def test_connections_opened_at_once_all_queue_while_the_proxy_is_busy(
    served: tuple[Path, bytes], kind: str
) -> None:
    """A read-ahead row opens 256 connections at once. A listen backlog smaller than
    that (asyncio's 100, aiohttp's 128) dropped the SYNs over it, each retried a second
    later: a stall of the lab, not of the client. With the proxy stopped, the kernel's
    accept queue alone must hold them all."""
    folder, _ = served
    with (
        HttpServer(folder) as server,
        DelayProxy(f"http://127.0.0.1:{server.port}", kind=kind) as proxy,
    ):
        sockets = []
        os.kill(proxy.pid, signal.SIGSTOP)
        try:
            for _ in range(300):
                s = socket.socket()
                sockets.append(s)
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", proxy.port))
            # a connection is writable once its handshake is done (queued for accept);
            # one whose SYN was dropped is not, until a retry a second later
            pending, deadline = list(sockets), time.monotonic() + 0.5
            while pending and time.monotonic() < deadline:
                _, done, _ = select.select([], pending, [], 0.05)
                pending = [s for s in pending if s not in done]
            assert len(pending) == 0, f"{len(pending)} of 300 connections not accepted"
            assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in sockets)
        finally:
            os.kill(proxy.pid, signal.SIGCONT)
            for s in sockets:
                s.close()
        assert proxy.stats() == {"requests": 0, "bytes": 0}  # it still answers
