"""S3 ranged GETs without botocore's request pipeline: :mod:`.http11` and :mod:`.sigv4`.

A ranged read through s3fs's aiobotocore client costs 3-4 ms of CPU on a loaded
2-core machine, two thirds of it botocore's per-request objects, hooks, user agent,
response parsing and signer (``docs/benchmarks-remote.md``); a plain aiohttp GET
signed by hand costs what an unsigned one does. :func:`direct_client` builds such a
client from the ``storage_options`` s3fs would take, where it can honour all of them:
the endpoint (``endpoint_url``, ``client_kwargs``, ``AWS_ENDPOINT_URL(_S3)``), its
addressing style as botocore chooses it (path-style for a custom endpoint,
virtual-host for AWS buckets whose names allow it), the region, credentials (given,
from the environment, or botocore's provider chain once, re-read when refreshable
ones expire), ``anon=True`` unsigned, ``requester_pays``, timeouts and TLS
verification. Anything else s3fs would add to a GET (SSE-C keys,
``s3_additional_kwargs``, version-aware paths, access-point ARNs, an explicit
``session``) returns None, and the read goes through botocore as before.

The client checks nothing: :mod:`~indextar.source.conditional` sends its GETs and
checks their answers. Ranged GETs go out on :mod:`.http11`'s keep-alive connections
(through aiohttp's session where a proxy is set), HEADs and streams through aiohttp's;
one pool of connections and one session per event loop and process. Importing this
module imports no aiohttp, fsspec or botocore.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import os
import re
import threading
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

from .base import fork_generation
from .filesystems import split_url
from .fsspec_internals import configured_options
from .http11 import Answer, Http11Pool, request_head, ssl_context
from .sigv4 import Credentials, SigV4Signer, quote_key

__all__ = ["S3Direct", "direct_client", "direct_client_for"]

# storage_options that change nothing about a GET, or that this client honours
_HONOURED = {
    "anon", "key", "secret", "token", "username", "password", "endpoint_url", "use_ssl",
    "client_kwargs", "config_kwargs", "requester_pays", "profile", "skip_instance_cache",
    "use_listings_cache", "listings_expiry_time", "max_paths", "default_block_size",
    "default_fill_cache", "default_cache_type", "cache_regions", "max_concurrency",
    "fixed_upload_size", "local_expiry_check", "version_aware", "asynchronous", "loop",
}  # fmt: skip
_CLIENT_KWARGS = {"endpoint_url", "region_name", "verify", "use_ssl"}
_CONFIG_KWARGS = {"retries", "connect_timeout", "read_timeout", "s3", "max_pool_connections",
                  "signature_version", "region_name"}  # fmt: skip
_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9\-]{1,61}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class _Endpoint:
    scheme: str
    netloc: str  # as the endpoint URL gives it
    host: str  # the Host header: a port only where it is not the scheme's default
    prefix: str  # the endpoint's own path, "/s3" for AIStore's gateway; else ""
    virtual: bool  # bucket.host/key rather than host/bucket/key


class _CredentialSource:
    """Credentials taken once; refreshable ones (botocore's) are re-read as they expire."""

    __slots__ = ("_fixed", "_refreshable", "_lock")

    def __init__(self, fixed: Credentials | None, refreshable: Any = None):
        self._fixed = fixed
        self._refreshable = refreshable
        self._lock = threading.Lock()

    def current(self) -> Credentials:
        if self._fixed is not None:
            return self._fixed
        with self._lock:  # botocore refreshes under its own lock; one reader is enough
            frozen = self._refreshable.get_frozen_credentials()
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


class S3Direct:
    """Signed ranged GETs to one S3 endpoint, over one aiohttp session per event loop."""

    def __init__(
        self,
        endpoint: _Endpoint,
        region: str,
        credentials: _CredentialSource | None,
        *,
        headers: Mapping[str, str],
        connect_timeout: float,
        read_timeout: float,
        verify: bool | str,
    ):
        self.endpoint = endpoint
        self.region = region
        self._credentials = credentials
        self._headers = dict(headers)
        self._timeouts = (connect_timeout, read_timeout)
        self._verify = verify
        self._signer: SigV4Signer | None = None
        self._sessions: dict[tuple[int, int], Any] = {}
        self._pools: dict[tuple[int, int, str], Http11Pool] = {}
        self._places: dict[tuple[str, str], tuple[str, str, str]] = {}
        self.proxy = _proxy(endpoint)

    def _signed(
        self, method: str, host: str, path: str, query: str, headers: dict[str, str]
    ) -> dict[str, str]:
        if self._credentials is None:
            return headers
        credentials = self._credentials.current()
        signer = self._signer
        if signer is None or (
            signer.credentials is not credentials and signer.credentials != credentials
        ):
            signer = self._signer = SigV4Signer(credentials, self.region)
        return signer.sign(method, host, path, query, headers)

    def request(
        self,
        bucket: str,
        key: str,
        start: int,
        end: int | None,
        etag: str,
        *,
        method: str = "GET",
    ) -> tuple[str, dict[str, str]]:
        """The URL (encoded) and the signed headers of a GET of bytes ``start .. end``
        of ``bucket/key`` (``end=None``: to the object's end; ``end <= start``: all of
        it; ``method="HEAD"``: its metadata), conditional on ``etag`` where it is not
        empty."""
        netloc, host, path = self._where(bucket, key)
        headers = self._signed(method, host, path, "", self._conditions(start, end, etag))
        return f"{self.endpoint.scheme}://{netloc}{path}", headers

    def get(self, bucket: str, key: str, start: int, end: int, etag: str) -> Awaitable[Answer]:
        """The answer to a GET of bytes ``start .. end`` of ``bucket/key``, conditional
        on ``etag`` where it is not empty: sent by :mod:`.http11` on this event loop's
        keep-alive connections (through aiohttp's session where a proxy is set). Call
        it on the loop: it signs at once, and its awaitable sends (no coroutine of its
        own a request)."""
        netloc, host, path = self._where(bucket, key)
        headers = self._signed("GET", host, path, "", self._conditions(start, end, etag))
        url = f"{self.endpoint.scheme}://{netloc}{path}"
        if self.proxy is not None:
            return self._get_by_session(url, headers)
        return self._pool(netloc).get(url, request_head(path, host, headers))

    def _where(self, bucket: str, key: str) -> tuple[str, str, str]:
        """``(netloc, Host header, encoded path)`` of ``bucket/key`` (kept: a shard is
        read many times)."""
        found = self._places.get((bucket, key))
        if found is None:
            if len(self._places) > 4096:
                self._places.clear()
            found = self._places[bucket, key] = self._place(bucket, key)
        return found

    def _place(self, bucket: str, key: str) -> tuple[str, str, str]:
        endpoint = self.endpoint
        if endpoint.virtual and _virtual_ok(bucket, endpoint):
            netloc, host = f"{bucket}.{endpoint.netloc}", f"{bucket}.{endpoint.host}"
            return netloc, host, f"{endpoint.prefix}/{quote_key(key)}"
        return endpoint.netloc, endpoint.host, f"{endpoint.prefix}/{bucket}/{quote_key(key)}"

    def _conditions(self, start: int, end: int | None, etag: str) -> dict[str, str]:
        headers = dict(self._headers)
        if end is None:
            headers["range"] = f"bytes={start}-"
        elif end > start:
            headers["range"] = f"bytes={start}-{end - 1}"
        if etag:
            headers["if-match"] = f'"{etag}"'
        return headers

    def _pool(self, netloc: str) -> Http11Pool:
        """This event loop's connections to ``netloc`` (made on first use, in this process)."""
        import asyncio

        loop = asyncio.get_running_loop()
        slot = (id(loop), fork_generation(), netloc)
        pool = self._pools.get(slot)
        if pool is None:
            connect, read = self._timeouts
            pool = Http11Pool(
                self.endpoint.scheme, netloc, verify=self._verify, connect_timeout=connect,
                read_timeout=read,
            )  # fmt: skip
            if not _OPEN:
                atexit.register(_close_sessions)
            self._pools[slot] = pool
            _OPEN.append((loop, fork_generation(), pool))
        return pool

    async def _get_by_session(self, url: str, headers: dict[str, str]) -> Answer:
        from yarl import URL

        session = await self.session()
        async with session.get(
            URL(url, encoded=True), headers=headers, allow_redirects=False, proxy=self.proxy
        ) as response:
            body = await response.read()
            found = {name.lower(): value for name, value in response.headers.items()}
            return Answer(url, response.status, response.reason or "", found, body)

    async def session(self) -> Any:
        """This event loop's aiohttp session (made on first use, in this process)."""
        import asyncio

        loop = asyncio.get_running_loop()
        slot = (id(loop), fork_generation())
        session = self._sessions.get(slot)
        if session is None or session.closed:
            import aiohttp

            if not _OPEN:
                atexit.register(_close_sessions)

            connect, read = self._timeouts
            https = self.endpoint.scheme == "https"  # a context loads the CA bundle: only then
            tls = ssl_context(self._verify) if https else True
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=tls, enable_cleanup_closed=True),
                timeout=aiohttp.ClientTimeout(sock_connect=connect, sock_read=read),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
            self._sessions[slot] = session  # an inherited one is kept, never closed here
            _OPEN.append((loop, fork_generation(), session))
        return session

    def __repr__(self) -> str:
        endpoint = self.endpoint
        return f"S3Direct({endpoint.scheme}://{endpoint.host}, region={self.region!r})"


_OPEN: list[tuple[Any, int, Any]] = []  # (loop, fork generation, session or pool) made here


def _close_sessions() -> None:
    """At exit, close this process's sessions and connections on their loops, while
    these still run (else aiohttp and asyncio complain from their finalizers once the
    interpreter is half gone)."""
    import asyncio

    async def close(opened: Any) -> None:
        if isinstance(opened, Http11Pool):
            opened.close()
        elif not opened.closed:
            await opened.close()

    for loop, generation, opened in _OPEN:
        if generation == fork_generation() and loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(close(opened), loop).result(timeout=1)


def _proxy(endpoint: _Endpoint) -> str | None:
    """The proxy ``HTTP(S)_PROXY`` and ``NO_PROXY`` name for the endpoint, as botocore
    reads them: once, not on every request as aiohttp's ``trust_env`` does."""
    import urllib.request

    if urllib.request.proxy_bypass(endpoint.host.rpartition(":")[0] or endpoint.host):
        return None
    return urllib.request.getproxies().get(endpoint.scheme)


_CLIENTS: dict[str, S3Direct | None] = {}
_CLIENTS_LOCK = threading.Lock()


def direct_client(storage_options: Mapping[str, Any]) -> S3Direct | None:
    """The direct client for these s3fs ``storage_options`` (one per process and set of
    options), or None where a GET needs what only botocore does (see the module)."""
    cache_key = repr(sorted(storage_options.items()))
    with _CLIENTS_LOCK:
        if cache_key not in _CLIENTS:
            _CLIENTS[cache_key] = _build({**configured_options("s3"), **storage_options})
        return _CLIENTS[cache_key]


def direct_client_for(url: str, storage_options: Mapping[str, Any]) -> S3Direct | None:
    """:func:`direct_client` for an ``s3://bucket/key`` URL; None for other URLs, for a
    version (``?versionId=``) and for an access point (s3fs and botocore resolve those)."""
    protocol, path = split_url(url)
    bucket, _, key = path.partition("/")
    if protocol not in ("s3", "s3a") or not bucket or not key or "?versionId=" in key:
        return None
    if bucket.startswith("arn:"):
        return None
    return direct_client(storage_options)


def _build(options: Mapping[str, Any]) -> S3Direct | None:
    client_kwargs = dict(options.get("client_kwargs") or {})
    config = dict(options.get("config_kwargs") or {})
    s3_config = dict(config.get("s3") or {})
    if (
        set(options) - _HONOURED
        or options.get("version_aware")
        or set(client_kwargs) - _CLIENT_KWARGS
        or set(config) - _CONFIG_KWARGS
        or set(s3_config) - {"addressing_style"}
        or options.get("s3_additional_kwargs")
    ):
        return None
    unsigned = bool(options.get("anon")) or str(config.get("signature_version")) == "UNSIGNED"
    if config.get("signature_version") not in (None, "s3v4", "v4", "UNSIGNED"):
        return None
    use_ssl = client_kwargs.get("use_ssl", options.get("use_ssl", True))
    url = (
        options.get("endpoint_url")
        or client_kwargs.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    region = (
        client_kwargs.get("region_name")
        or config.get("region_name")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    credentials: _CredentialSource | None = None
    if not unsigned:
        found = _credentials(options)
        if found is None:
            return None  # botocore decides what to do without credentials
        credentials, chain_region = found
        region = region or chain_region
    if not url and not region:
        return None  # an AWS bucket in a region unknown here: botocore finds it
    region = str(region or "us-east-1")
    endpoint = _endpoint(url, region, bool(use_ssl), s3_config.get("addressing_style"))
    if endpoint is None:
        return None
    headers = {"x-amz-request-payer": "requester"} if options.get("requester_pays") else {}
    return S3Direct(
        endpoint, region, credentials, headers=headers,
        connect_timeout=float(config.get("connect_timeout", 60)),
        read_timeout=float(config.get("read_timeout", 60)),
        verify=client_kwargs.get("verify", True),
    )  # fmt: skip


def _credentials(options: Mapping[str, Any]) -> tuple[_CredentialSource, str | None] | None:
    """Credentials as s3fs finds them, and the region the profile names (if it was read)."""
    key = options.get("key") or options.get("username")
    secret = options.get("secret") or options.get("password")
    token = options.get("token")
    if key and secret:
        return _CredentialSource(Credentials(key, secret, token)), None
    environ = os.environ
    if (
        "profile" not in options
        and environ.get("AWS_ACCESS_KEY_ID")
        and environ.get("AWS_SECRET_ACCESS_KEY")
        and "AWS_CREDENTIAL_EXPIRATION" not in environ
    ):  # the first provider of botocore's chain, without importing botocore
        token = environ.get("AWS_SESSION_TOKEN") or environ.get("AWS_SECURITY_TOKEN")
        fixed = Credentials(environ["AWS_ACCESS_KEY_ID"], environ["AWS_SECRET_ACCESS_KEY"], token)
        return _CredentialSource(fixed), None
    import botocore.session

    session = botocore.session.Session(profile=options.get("profile"))
    found = session.get_credentials()
    if found is None:
        return None
    region = session.get_config_variable("region")
    if hasattr(found, "refresh_needed"):  # RefreshableCredentials: re-read as they expire
        return _CredentialSource(None, found), region
    fixed = Credentials(found.access_key, found.secret_key, found.token)
    return _CredentialSource(fixed), region


def _endpoint(url: str | None, region: str, use_ssl: bool, style: str | None) -> _Endpoint | None:
    """Where GETs go, addressed as botocore would address them."""
    from urllib.parse import urlsplit

    if url:
        parts = urlsplit(url)
        if parts.query or parts.scheme not in ("http", "https"):
            return None
        scheme, netloc, prefix = parts.scheme, parts.netloc, quote_key(parts.path.rstrip("/"))
        virtual = style == "virtual"
    else:
        scheme = "https" if use_ssl else "http"
        netloc, prefix = f"s3.{region}.amazonaws.com", ""
        virtual = style != "path"
    host = netloc
    hostname, _, port = netloc.rpartition(":") if netloc.count(":") == 1 else (netloc, "", "")
    if port and port == {"http": "80", "https": "443"}[scheme]:
        host = hostname  # botocore signs, and aiohttp sends, no default port
    return _Endpoint(scheme, netloc, host, prefix, virtual)


@functools.lru_cache(maxsize=1024)
def _virtual_ok(bucket: str, endpoint: _Endpoint) -> bool:
    """Whether ``bucket`` may be a host name label on this endpoint (else path style)."""
    if not _DNS_BUCKET.match(bucket) or "." in bucket:
        return False
    try:
        ipaddress.ip_address(endpoint.host.rpartition(":")[0] or endpoint.host)
    except ValueError:
        return True
    return False
