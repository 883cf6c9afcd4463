"""An object store whose CPU is (nearly) elsewhere: nginx serving S3's read API.

tools/bench_remote.py runs the store, the proxy and the client on one 2-core
machine. SeaweedFS's S3 gateway spends 1.1-1.4 ms of CPU on each 100 KB ranged GET
(measured with tools/bench_remote.py ``--server-cpu``), several times what a good
client spends, so against it every design that sends one request per sample is held
by the server's CPU on the client's own cores, which a real store does not take.
nginx (C, ``sendfile``) serves the same objects for a few tens of microseconds each,
so the rows measure the clients.

It answers what the readers here send: path-style ``GET``/``HEAD /bucket/key``
with ``Range`` (206 and ``Content-Range``), ``ETag``, ``If-Match`` (412). It checks
no signature and every listing is empty, so a reader must be given its objects' URLs. Objects
are the files under ``<folder>/root/<bucket>/``, hard-linked there by :meth:`upload`.
With ``rate_limit=N`` it serves N requests a second (a burst of 64 more), and answers
the rest at once with 503, as S3 answers a prefix asked too fast (SlowDown).

Needs the ``nginx`` binary (Debian: ``apt-get install nginx-light``).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loopback_servers import (  # noqa: E402
    ChildServer,
    SeaweedServer,
    _wait_until,
    free_ports,
    self_signed_certificate,
)

PREAMBLE = """\
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
daemon off;
user root;
events {{ worker_connections 8192; }}
"""

CONFIG = (
    PREAMBLE
    + """\
http {{
    access_log off;
{limit_zone}    sendfile on;
    # not tcp_nopush: with it, a 100 KB answer's last segment waited for the
    # client's delayed ACK, 40 ms, on most keep-alive requests (one ranged GET took
    # 61-64 ms through the 20 ms delay line, 1 MB ones 22 ms): every per-request row
    # saw three times the latency asked for, and the whole-shard streams once a shard
    tcp_nopush off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    default_type application/octet-stream;
    client_body_temp_path {folder}/tmp;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {folder}/root;
        location / {{
{limit}            # a listing (ListObjectsV2) is always empty: readers are given their URLs
            if ($args ~ "list-type=") {{
                add_header Content-Type application/xml;
                return 200 '{empty_listing}';
            }}
        }}
    }}
}}
"""
)


EMPTY_LISTING = (
    '<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><KeyCount>0</KeyCount>'
    "<IsTruncated>false</IsTruncated></ListBucketResult>"
)


def _run_nginx(
    nginx: str, config: Path, ready: Callable[[], bool], what: str
) -> subprocess.Popen[bytes]:
    """nginx on ``config`` (its folder the prefix), in a session of its own, once ready."""
    process = subprocess.Popen(
        [nginx, "-c", str(config), "-p", str(config.parent)], start_new_session=True
    )
    _wait_until(ready, process, what)
    return process


class NginxStore(ChildServer):
    """``nginx`` on a free port of 127.0.0.1, serving ``<folder>/root`` path-style."""

    def __init__(self, folder: str | os.PathLike[str], *, rate_limit: int | None = None):
        self.folder = Path(folder).resolve()
        self.rate_limit = rate_limit  # GETs a second, the rest answered 503 as S3's SlowDown
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str | None:
        return shutil.which("nginx") or next(
            (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
        )

    def __enter__(self) -> NginxStore:
        nginx = self.binary()
        if nginx is None:
            raise RuntimeError("no nginx binary: apt-get install nginx-light")
        self.port = free_ports(1)[0]
        (self.folder / "root").mkdir(parents=True, exist_ok=True)
        (self.folder / "tmp").mkdir(exist_ok=True)
        config = self.folder / "nginx.conf"
        zone = limit = ""
        if self.rate_limit is not None:  # beyond the rate and a burst of 64: 503 at once
            zone = f"    limit_req_zone $server_addr zone=store:1m rate={self.rate_limit}r/s;\n"
            limit = (
                "            limit_req zone=store burst=64 nodelay;\n"
                "            limit_req_status 503;\n"
            )
        config.write_text(
            CONFIG.format(
                folder=self.folder,
                port=self.port,
                empty_listing=EMPTY_LISTING,
                limit_zone=zone,
                limit=limit,
            )  # fmt: skip
        )
        self._process = _run_nginx(nginx, config, self._ready, "nginx")
        return self

    def _ready(self) -> bool:
        return _answers(f"http://127.0.0.1:{self.port}/")

    def upload(self, bucket: str, files: Iterable[Path], prefix: str = "") -> None:
        """Put each file in ``bucket`` under ``prefix`` and its own name (a hard link)."""
        for path in files:
            self.put(Path(path), f"{bucket}/{prefix}{Path(path).name}")

    def put(self, path: Path, key: str) -> None:
        target = self.folder / "root" / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)

    # s3fs options for this endpoint, as SeaweedServer's (the keys are sent, not checked)
    storage_options = SeaweedServer.storage_options


TLS_FRONT = (
    PREAMBLE
    + """\
http {{
    access_log off;
    proxy_temp_path {folder}/tmp;
    client_body_temp_path {folder}/tmp;
    upstream behind {{
        server {upstream};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port} ssl backlog=4096;
        ssl_certificate {folder}/cert.pem;
        ssl_certificate_key {folder}/key.pem;
        keepalive_requests 10000000;
        keepalive_timeout 300s;
        location / {{
            proxy_pass http://behind;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering off;
        }}
    }}
}}
"""
)


class NginxTlsFront(ChildServer):
    """HTTPS on a free port of 127.0.0.1, forwarded as plain HTTP over kept-alive
    connections to ``upstream`` (``host:port``, the delay line): clients pay for TLS
    as against a real store, while the delay line still reads the answers it counts.
    Its certificate, made here by the ``openssl`` command for 127.0.0.1, is
    :attr:`ca` (its own CA). nginx's CPU for TLS is the server's, as a store's is."""

    def __init__(self, folder: str | os.PathLike[str], upstream: str):
        self.folder = Path(folder).resolve()
        self.upstream = upstream
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def ca(self) -> Path:
        return self.folder / "cert.pem"

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> NginxTlsFront:
        nginx = NginxStore.binary()
        (self.folder / "tmp").mkdir(parents=True, exist_ok=True)
        if nginx is None or self_signed_certificate(self.folder) is None:
            raise RuntimeError("needs nginx (apt-get install nginx-light) and openssl")
        self.port = free_ports(1)[0]
        config = self.folder / "nginx.conf"
        config.write_text(
            TLS_FRONT.format(folder=self.folder, port=self.port, upstream=self.upstream)
        )
        self._process = _run_nginx(nginx, config, self._ready, "nginx's TLS front")
        return self

    def ssl_context(self) -> ssl.SSLContext:
        """A client's TLS context that trusts the front's certificate."""
        return ssl.create_default_context(cafile=str(self.ca))

    def _ready(self) -> bool:
        return _answers(f"{self.endpoint}/", self.ssl_context())


def _answers(url: str, context: ssl.SSLContext | None = None) -> bool:
    """Whether the server at ``url`` answers (any status); refused until it listens (an
    OSError)."""
    try:
        urllib.request.urlopen(url, timeout=2, context=context).close()
    except urllib.error.HTTPError:
        pass  # a 403 or 404 is an answer
    return True
