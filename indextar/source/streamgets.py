"""The streaming GETs that :class:`~indextar.source.objectstream.ObjectStream` sends:
one per protocol, each answering an open :class:`StreamAnswer` whose body is read as it
arrives.

``s3://`` goes through the direct client (:mod:`.s3direct`, signed by :mod:`.sigv4`)
where it serves the ``storage_options``: no botocore client to build (0.4 s before
the first byte on a loaded machine) and no request pipeline per GET. Options only
botocore honours fall back to s3fs's client; ``http(s)://`` goes through fsspec's
aiohttp session. A 412 or 416 is answered, not raised: the stream decides what it
means; other refusals raise as the ranged reads raise them (404 FileNotFoundError, 403
PermissionError, a transient status for :mod:`.retry`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .conditional import precondition_failed, s3_error, s3_get_object
from .filesystems import filesystem, split_url, without_client_retries
from .fsspec_internals import (
    http_raise_for_status,
    http_request,
    http_session,
    run_on_default_loop,
    run_on_loop,
)
from .retry import retryable_status, status_of
from .s3direct import S3Direct, direct_client_for

__all__ = ["Runner", "StreamAnswer", "StreamGet", "streaming_get"]

_READ = 256 << 10  # the most bytes one read of the body hands over


@dataclass(frozen=True, slots=True)
class StreamAnswer:
    """The open answer to one GET: its status, the headers that matter, and its body."""

    status: int
    etag: str | None
    content_range: str | None
    length: int | None
    read: Callable[[], Awaitable[bytes]]
    release: Callable[[], object]


async def _no_body() -> bytes:
    return b""


async def _http_get(fs: Any, path: str, start: int, etag: str) -> StreamAnswer:
    target, kwargs = http_request(fs, path)
    headers = {**(kwargs.pop("headers", None) or {}), "Range": f"bytes={start}-"}
    if etag and not etag.startswith("W/"):  # If-Match compares strongly
        headers["If-Match"] = f'"{etag}"'
    session = await http_session(fs)
    response = await session.get(target, headers=headers, **kwargs)
    if response.status not in (412, 416):
        try:
            http_raise_for_status(fs, response, path)
        except BaseException:
            response.release()
            raise
    return StreamAnswer(
        response.status, response.headers.get("ETag"), response.headers.get("Content-Range"),
        response.content_length, lambda: response.content.read(_READ), response.release,
    )  # fmt: skip


async def _s3_get(fs: Any, path: str, start: int, etag: str) -> StreamAnswer:
    """A signed ``GetObject`` through s3fs's client (its retries off: ours decide), the
    body left open: for the options the direct client does not serve."""
    try:
        response = await s3_get_object(fs, path, f"bytes={start}-", etag)
    except Exception as e:
        if precondition_failed(e):
            return StreamAnswer(412, None, None, None, _no_body, lambda: None)
        status = status_of(e)
        if status == 416:
            return StreamAnswer(416, None, None, None, _no_body, lambda: None)
        if retryable_status(status):
            raise
        from s3fs.errors import translate_boto_error

        raise translate_boto_error(e) from e
    body = response["Body"]
    return StreamAnswer(
        response.get("ResponseMetadata", {}).get("HTTPStatusCode", 206),
        response.get("ETag"), response.get("ContentRange"), response.get("ContentLength"),
        lambda: body.read(_READ), body.close,
    )  # fmt: skip


async def _direct_get(
    client: S3Direct, bucket: str, key: str, url: str, start: int, etag: str
) -> StreamAnswer:
    """A ``GetObject`` signed by :mod:`.sigv4` and sent by the direct client, the body
    left open; refusals raised as the botocore path raises them."""
    from yarl import URL

    target, headers = client.request(bucket, key, start, None, etag)
    session = await client.session()
    response = await session.get(
        URL(target, encoded=True), headers=headers, allow_redirects=False, proxy=client.proxy
    )
    status = response.status
    if status in (412, 416) or status >= 300:
        try:
            answer = await response.read()
        finally:
            response.release()
        if status >= 300 and status not in (412, 416):
            raise s3_error(url, response, answer)
        return StreamAnswer(
            status, response.headers.get("ETag"), None, None, _no_body, lambda: None
        )
    return StreamAnswer(
        status, response.headers.get("ETag"), response.headers.get("Content-Range"),
        response.content_length, lambda: response.content.read(_READ), response.release,
    )  # fmt: skip


_GETS = {"http": _http_get, "https": _http_get, "s3": _s3_get, "s3a": _s3_get}

StreamGet = Callable[[int, str], Awaitable[StreamAnswer]]
"""``get(start, etag)``: the GET of the object's bytes from ``start`` on, ``If-Match``
on ``etag`` where it is not empty."""
Runner = Callable[[Callable[[], Awaitable[None]]], None]
"""``run(coroutine_function)``: awaits it on the client's event loop, from this thread."""


def streaming_get(url: str, storage_options: Mapping[str, Any]) -> tuple[Runner, StreamGet]:
    """The GET for ``url`` and the runner of its coroutines: the direct S3 client on
    fsspec's loop where it serves these options, else the fsspec filesystem's client on
    that filesystem's loop."""
    direct = direct_client_for(url, storage_options)
    if direct is not None:
        bucket, _, key = split_url(url)[1].partition("/")
        return run_on_default_loop, functools.partial(_direct_get, direct, bucket, key, url)
    fs, path = filesystem(url, without_client_retries(url, storage_options))
    get = _GETS[fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]]
    return functools.partial(run_on_loop, fs), functools.partial(get, fs, path)
