"""One version of a remote object: what identifies it, and reads that insist on it.

:class:`RemoteStat` is an object's size and ETag; :func:`check_version` refuses an
object that is no longer the version an index recorded, before its first read. Every
ranged read of an indexed shard then carries that ETag (HTTP ``If-Match``, S3
``IfMatch``), so that an object replaced mid-epoch is refused by the server (412) or,
where the server ignores the precondition, by the ETag it answers with: never read as
bytes. Protocols without conditional reads get plain ranges (the span check still
guards those).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import RemoteReadError, StaleIndexError, WrongRangeError
from .base import SpanBytes
from .fsspec_internals import (
    cat_file_async,
    http_raise_for_status,
    http_request,
    http_session,
    run_on_default_loop,
    run_on_loop,
    s3_method_kwargs,
    s3_split_path,
)
from .retry import retryable_status, status_of, with_retries
from .s3direct import S3Direct

__all__ = [
    "DirectRequest",
    "RemoteStat",
    "check_version",
    "get_range",
    "get_range_direct",
    "get_ranges",
    "get_ranges_direct",
    "head_direct",
    "precondition_failed",
    "s3_error",
    "s3_get_object",
    "wrong_or_stale",
]

DirectRequest = tuple[str, str, int, int, str, str]
"""A GET for :func:`get_ranges_direct`: ``(bucket, key, start, end, etag, url)``."""


@dataclass(frozen=True, slots=True)
class RemoteStat:
    """What identifies a version of a remote object: its size and, if served, its ETag."""

    size: int
    etag: str = ""

    @classmethod
    def from_info(cls, info: Mapping[str, Any], url: str) -> RemoteStat:
        size = info.get("size")
        if size is None:
            raise RemoteReadError("the server reports no size (no Content-Length)", url=url)
        etag = info.get("ETag") or info.get("etag") or ""
        return cls(int(size), str(etag).strip('"'))


def check_version(
    url: str,
    expected: RemoteStat,
    now: RemoteStat,
    *,
    index: str = "",
    remedy: str = "rebuild the index (build_index(url, index_dir=..., force=True))",
    content_matches: Callable[[], bool] | None = None,
) -> None:
    """Refuse an object that is no longer the version its index recorded.

    Sizes are compared, and ETags where both sides have one; where the sizes agree and
    ETags cannot tell, ``content_matches()``, if given, decides (an index compares its
    content fingerprint).

    Raises
    ------
    StaleIndexError
        Naming what changed, the index (its path ``index``, if given) and ``remedy``.
    """
    changes = []
    if now.size != expected.size:
        changes.append(f"its size changed from {expected.size} to {now.size} bytes")
    if expected.etag and now.etag:
        if now.etag != expected.etag:
            changes.append(f"its ETag changed from {expected.etag!r} to {now.etag!r}")
    elif not changes and content_matches is not None and not content_matches():
        changes.append("its content fingerprint changed")
    if changes:
        where = f" (index {index!r})" if index else ""
        raise StaleIndexError(
            f"remote shard {url!r} changed since it was indexed{where}: "
            f"{'; '.join(changes)}; {remedy}"
        )


def _stale(url: str, etag: str, what: str) -> StaleIndexError:
    return StaleIndexError(
        f"remote shard {url!r} changed since it was indexed (ETag {etag!r}): {what}; "
        "no sample is read through its old index; rebuild it "
        "(build_index(url, index_dir=..., force=True))"
    )


_PRECONDITION_FAILED = "its ETag changed: the server answered 412 Precondition Failed"


def _answered_etag(url: str, etag: str, answered: str | None) -> None:
    """Refuse a response whose ETag is another version's."""
    got = (answered or "").removeprefix("W/").strip('"')
    if etag and got and got != etag:
        raise _stale(url, etag, f"the server answered a ranged read with ETag {got!r}")


def precondition_failed(error: BaseException) -> bool:
    """Whether ``error`` (or its cause) is an HTTP 412 answer."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "status", None) == 412:  # aiohttp
            return True
        response = getattr(seen, "response", None)  # botocore ClientError
        if isinstance(response, Mapping):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return True
        seen = seen.__cause__ or seen.__context__
    return False


def _check_answer(
    url: str, start: int, end: int, status: int, content_range: str | None, data: SpanBytes
) -> None:
    """Refuse ``data`` unless it answers a read of bytes ``start .. end``: a 206 whose
    ``Content-Range`` is that range, with a body of its length (or a 200 with the whole
    object when the range was all of it); :class:`WrongRangeError`, transient."""
    length = end - start
    if status == 206:
        answered = (content_range or "").strip().partition("/")[0]
        if answered != f"bytes {start}-{end - 1}":
            what = f"Content-Range {content_range!r}" if content_range else "no Content-Range"
            raise WrongRangeError(
                f"{what} (status 206, {len(data)} bytes)",
                url=url, offset=start, length=length, status=status,
            )  # fmt: skip
    elif not (status == 200 and start == 0):
        raise WrongRangeError(
            f"status {status} ({len(data)} bytes; the server ignored Range?)",
            url=url, offset=start, length=length, status=status,
        )  # fmt: skip
    if len(data) != length:
        raise WrongRangeError(
            f"{len(data)} bytes (status {status}, Content-Range {content_range!r})",
            url=url, offset=start, length=length, status=status,
        )  # fmt: skip


async def _http_range(fs: Any, path: str, start: int, end: int, etag: str, url: str) -> bytes:
    target, kwargs = http_request(fs, path)
    headers = {**(kwargs.pop("headers", None) or {}), "Range": f"bytes={start}-{end - 1}"}
    if etag and not etag.startswith("W/"):  # If-Match compares strongly: a weak tag never matches
        headers["If-Match"] = f'"{etag}"'
    session = await http_session(fs)
    async with session.get(target, headers=headers, **kwargs) as response:
        if response.status == 412:
            raise _stale(url, etag, _PRECONDITION_FAILED)
        http_raise_for_status(fs, response, path)
        _answered_etag(url, etag, response.headers.get("ETag"))
        data: bytes = await response.read()
        _check_answer(url, start, end, response.status, response.headers.get("Content-Range"), data)
        return data


async def s3_get_object(fs: Any, path: str, byte_range: str, etag: str) -> Any:
    """botocore's answer to a ``GetObject`` of ``byte_range`` (``"bytes=A-B"`` or
    ``"bytes=A-"``) of ``path`` on s3fs's client, ``If-Match`` on ``etag`` where there is
    one; botocore's error as it raises it, for the caller to sort."""
    bucket, key, version = s3_split_path(fs, path)
    request = {"Bucket": bucket, "Key": key, "Range": byte_range}
    if etag:
        request["IfMatch"] = f'"{etag}"'
    if version:
        request["VersionId"] = version
    await fs.set_session()
    client = await fs.get_s3(bucket)
    return await client.get_object(**s3_method_kwargs(fs, client.get_object, **request))


async def _s3_range(fs: Any, path: str, start: int, end: int, etag: str, url: str) -> bytes:
    """One GET, straight to the botocore client: s3fs's own retries (and botocore's,
    off in the client :func:`~indextar.source.filesystems.filesystem` gives ranged
    reads) would hide each failure, its status and its ``Retry-After`` from
    :mod:`~indextar.source.remote`'s one loop."""
    from s3fs.errors import translate_boto_error

    try:
        response = await s3_get_object(fs, path, f"bytes={start}-{end - 1}", etag)
    except Exception as e:
        if precondition_failed(e):
            raise _stale(url, etag, _PRECONDITION_FAILED) from e
        if retryable_status(status_of(e)):
            raise  # transient, or not an answer: the caller's loop decides
        raise translate_boto_error(e) from e  # 403, 404, ...: FileNotFoundError and the like
    try:
        _answered_etag(url, etag, response.get("ETag"))
        data: bytes = await response["Body"].read()
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 206)
        _check_answer(url, start, end, status, response.get("ContentRange"), data)
        return data
    finally:
        response["Body"].close()


async def _direct_body(
    client: S3Direct, bucket: str, key: str, start: int, end: int, etag: str, url: str
) -> SpanBytes:
    """One GET of bytes ``start .. end`` through the direct client (:mod:`.s3direct`),
    checked as :func:`_s3_range` checks botocore's answer; errors as botocore's path
    raises them (404: FileNotFoundError, 403: PermissionError, else the status). The
    body as it was received: a ``bytearray``, not copied again."""
    if end <= start:
        return b""
    answer = await client.get(bucket, key, start, end, etag)
    status, headers = answer.status, answer.headers
    if status == 412:
        raise _stale(url, etag, _PRECONDITION_FAILED)
    if status >= 300:
        raise s3_error(url, answer, bytes(answer.body))
    _answered_etag(url, etag, headers.get("etag"))
    _check_answer(url, start, end, status, headers.get("content-range"), answer.body)
    return answer.body


def s3_error(url: str, response: Any, body: bytes) -> Exception:
    """The error for an S3 answer of status 300 or more (its XML ``body`` read for the
    code and message) as botocore's path raises it: 404 FileNotFoundError, 403
    PermissionError, else aiohttp's ClientResponseError with the status and headers
    that :mod:`~indextar.source.retry` reads."""
    import aiohttp

    found = dict(re.findall(rb"<(Code|Message)>([^<]*)</", body[:4096]))
    code = found.get(b"Code", b"").decode(errors="replace")
    message = found.get(b"Message", b"").decode(errors="replace")
    what = f"{url}: {response.status} {code or response.reason}" + (
        f" ({message})" if message else ""
    )
    error = aiohttp.ClientResponseError(
        response.request_info, response.history, status=response.status, message=what,
        headers=response.headers,
    )  # fmt: skip
    if response.status == 404:
        missing = FileNotFoundError(errno.ENOENT, what)
        missing.__cause__ = error
        return missing
    if response.status == 403:
        refused = PermissionError(errno.EACCES, what)
        refused.__cause__ = error
        return refused
    return error


# protocol -> a ranged GET that carries If-Match and checks the answered ETag and range
_CONDITIONAL_GETS = {
    "http": _http_range,
    "https": _http_range,
    "s3": _s3_range,
    "s3a": _s3_range,
}


async def _get_range(fs: Any, path: str, start: int, end: int, etag: str, url: str) -> bytes:
    """Bytes ``start .. end`` of ``path``: conditional on ``etag`` where the protocol
    allows it (HTTP, S3) and the answer's range checked; plain elsewhere (the length
    and the span check still guard those)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    conditional = _CONDITIONAL_GETS.get(protocol)
    if end <= start:
        return b""
    if conditional is None:
        return await cat_file_async(fs, path, start, end)
    return await conditional(fs, path, start, end, etag, url)


async def _gather(
    get: Callable[..., Awaitable[SpanBytes]],
    requests: Sequence[tuple[Any, ...]],
    max_in_flight: int,
) -> list[Any]:
    """``get(*request)`` of each request, at most ``max_in_flight`` at once; exceptions
    are returned. ``max_in_flight`` tasks take the requests in turn: no task and no
    semaphore wait per request (asyncio's ``Semaphore`` scans its waiters on each
    acquire)."""
    results: list[Any] = [None] * len(requests)
    turns = iter(enumerate(requests))

    async def worker() -> None:
        for i, request in turns:
            try:
                results[i] = await get(*request)
            except Exception as e:
                results[i] = e

    await asyncio.gather(*(worker() for _ in range(min(max_in_flight, len(requests)))))
    return results


async def get_range(fs: Any, path: str, start: int, end: int, etag: str, url: str) -> bytes:
    """One attempt at bytes ``start .. end`` of ``path`` on an async filesystem, as
    :func:`get_ranges` reads each (conditional, its answer checked); not retried."""
    return await _get_range(fs, path, start, end, etag, url)


def get_range_direct(client: S3Direct, request: DirectRequest) -> Awaitable[SpanBytes]:
    """One attempt at a :data:`DirectRequest` through the direct S3 client, as
    :func:`get_ranges_direct` reads each, not retried, its body as it was received
    (:func:`_direct_body`). Await it on fsspec's loop."""
    return _direct_body(client, *request)


async def head_direct(client: S3Direct, bucket: str, key: str, url: str) -> RemoteStat:
    """The object's size and ETag from one HEAD through the direct S3 client (no
    botocore client to build, as s3fs's ``info`` must); errors as :func:`_direct_body`
    raises them. Await it on fsspec's loop."""
    from yarl import URL

    target, headers = client.request(bucket, key, 0, 0, "", method="HEAD")
    session = await client.session()
    async with session.head(
        URL(target, encoded=True), headers=headers, allow_redirects=False, proxy=client.proxy
    ) as response:
        if response.status >= 300:
            raise s3_error(url, response, b"")
        length = response.headers.get("Content-Length")
        info = {
            "size": None if length is None else int(length),
            "ETag": response.headers.get("ETag"),
        }
        return RemoteStat.from_info(info, url)


def get_ranges(
    fs: Any, requests: Sequence[tuple[str, int, int, str, str]], max_in_flight: int
) -> list[Any]:
    """``_get_range`` of each ``(path, start, end, etag, url)``, at most
    ``max_in_flight`` at once on the filesystem's event loop; exceptions are returned."""
    get = functools.partial(_get_range, fs)
    return run_on_loop(fs, lambda: _gather(get, requests, max_in_flight))


def get_ranges_direct(
    client: S3Direct, requests: Sequence[DirectRequest], max_in_flight: int
) -> list[Any]:
    """Each :data:`DirectRequest` through the direct S3 client, at most ``max_in_flight``
    at once on fsspec's event loop thread, its body as it was received
    (:func:`_direct_body`: a ``bytearray``, not copied); exceptions are returned."""
    get = functools.partial(_direct_body, client)
    return run_on_default_loop(lambda: _gather(get, requests, max_in_flight))


def wrong_or_stale(
    url: str,
    expected: RemoteStat,
    where: tuple[Any, str],
    retry: Any,
    error: StaleIndexError,
    offset: int,
    length: int,
) -> Exception:
    """What a failed header check of bytes read from ``url`` (``where``: its fsspec
    filesystem and path) means.

    Where the index recorded an ETag and the object still has it (asked again, past any
    cache), the object is unchanged and the answer was wrong: a transient
    :class:`~indextar.errors.WrongRangeError` to retry. Else ``error`` stands, or the
    :class:`StaleIndexError` naming what changed. Without ETags nothing can tell the two
    apart, so ``error`` stands.
    """
    fs, path = where
    with contextlib.suppress(Exception):
        fs.invalidate_cache(path)
    info = with_retries(lambda: fs.info(path), retry, url=url, offset=None, length=None)
    now = RemoteStat.from_info(info, url)
    try:
        check_version(url, expected, now)
    except StaleIndexError as changed:
        return changed
    if not now.etag:
        return error
    return WrongRangeError(
        f"bytes that are not the sample's ({error}); its ETag {now.etag!r} is unchanged, "
        "so the answer was wrong, not the object",
        url=url, offset=offset, length=length, status=None,
    )  # fmt: skip
