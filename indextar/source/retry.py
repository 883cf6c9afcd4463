"""Retries of remote reads: one loop, with backoff, jitter and ``Retry-After``.

Every ranged read of a shard retries here and nowhere below: botocore's retries are
off for ranged reads (:func:`~indextar.source.filesystems.without_client_retries`) and
the S3 GET bypasses s3fs's loop. Only this loop sees each answer checked (its range,
its ETag, the sample's headers), knows the sample it was for, and keeps one budget of
attempts and waiting; loops nested inside it would multiply the attempts (5 x 5 x 5),
sleep without ``Retry-After``, and hide the last status from the error.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from ..errors import RemoteReadError, ShardNotFoundError, StaleIndexError, WrongRangeError

__all__ = [
    "DEFAULT_RETRY",
    "Failed",
    "RetryPolicy",
    "is_transient",
    "retry_after",
    "retrying",
    "status_of",
    "with_retries",
]

log = logging.getLogger("indextar.source.remote")  # the retries' warnings, where they were

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry a transient failure.

    Attempt ``n`` (from 1) waits ``min(max_delay, initial_delay * 2**(n-1))`` times a
    random factor in ``[0.5, 1]`` before the next try; where the server answered
    ``Retry-After`` (503, 429), at least that (up to ``max_retry_after``), times a
    random factor in ``[1, 1.2]`` so that workers do not come back together. A read
    gives up once its waits would pass ``max_wait`` seconds in all.
    """

    attempts: int = 5
    initial_delay: float = 0.1
    max_delay: float = 2.0
    max_retry_after: float = 30.0
    max_wait: float = 60.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        backoff: float = min(self.max_delay, self.initial_delay * 2.0 ** (attempt - 1))
        wait = backoff * random.uniform(0.5, 1.0)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_retry_after) * random.uniform(1.0, 1.2))
        return wait


def is_transient(error: BaseException) -> bool:
    """Whether retrying might help: not for missing objects, refusals or bad arguments."""
    if isinstance(
        error, (FileNotFoundError, PermissionError, IsADirectoryError, ValueError, TypeError)
    ):
        return False
    status = getattr(error, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int) and not isinstance(error, WrongRangeError):
        return retryable_status(status)
    return isinstance(error, (OSError, TimeoutError)) or type(error).__module__.startswith(
        ("aiohttp", "botocore", "aiobotocore")
    )


def retryable_status(status: int | None) -> bool:
    """Whether a request answered ``status`` (None: not answered) may succeed if sent
    again: no answer, 408, 429 or a 5xx."""
    return status is None or status >= 500 or status in (408, 429)


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    at: BaseException | None = error
    while at is not None and at not in seen:
        seen.append(at)
        at = at.__cause__ or at.__context__
    return seen


def _headers(error: BaseException) -> Mapping[str, str]:
    headers = getattr(error, "headers", None)  # aiohttp.ClientResponseError
    if isinstance(headers, Mapping):
        return headers
    response = getattr(error, "response", None)  # botocore ClientError
    if isinstance(response, Mapping):
        found = response.get("ResponseMetadata", {}).get("HTTPHeaders")
        if isinstance(found, Mapping):
            return found
    return {}


def status_of(error: BaseException) -> int | None:
    """The HTTP status that ``error`` (or its cause) answered, where there was one."""
    for each in _chain(error):
        status = getattr(each, "status", None)  # aiohttp, WrongRangeError, RemoteReadError
        if isinstance(status, int):
            return status
        response = getattr(each, "response", None)  # botocore ClientError
        if isinstance(response, Mapping):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
    return None


def retry_after(error: BaseException) -> float | None:
    """Seconds the server asked to wait (``Retry-After``: seconds or an HTTP date)."""
    for each in _chain(error):
        headers = _headers(each)
        value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return None


@dataclass(frozen=True, slots=True)
class Failed:
    """An attempt that failed: its errors, the first one's request, and a note such as
    how many of the attempt's requests failed."""

    errors: list[BaseException]
    url: str
    offset: int | None
    length: int | None
    note: str = ""
    key: str | None = None


def retrying(attempt: Callable[[], T | Failed], policy: RetryPolicy) -> T:
    """``attempt()`` until it returns a result, with backoff while its failures are all
    transient (honouring ``Retry-After``); a changed object (:class:`StaleIndexError`)
    is never retried. Then :class:`ShardNotFoundError` or :class:`RemoteReadError` for
    the first failure."""
    waited = 0.0
    for number in range(1, policy.attempts + 1):
        outcome = attempt()
        if not isinstance(outcome, Failed):
            return outcome
        for error in outcome.errors:
            if isinstance(error, StaleIndexError):
                raise error
        error, url = outcome.errors[0], outcome.url
        asked = [after for after in map(retry_after, outcome.errors) if after is not None]
        wait = policy.delay(number, max(asked) if asked else None)
        spent = waited + wait > policy.max_wait
        if not all(map(is_transient, outcome.errors)) or number == policy.attempts or spent:
            if isinstance(error, FileNotFoundError):
                missing = f"remote shard {url!r} does not exist ({error})"
                raise ShardNotFoundError(missing) from error
            note = f" (gave up: the next wait would pass {policy.max_wait}s)" if spent else ""
            raise RemoteReadError(
                f"{type(error).__name__}: {error}{outcome.note}{note}",
                url=url,
                offset=outcome.offset,
                length=outcome.length,
                attempts=number,
                key=outcome.key,
                status=status_of(error),
            ) from error
        log.warning(
            "reading %s bytes %s+%s failed (%s: %s)%s; retry %d/%d in %.2fs",
            url, outcome.offset, outcome.length, type(error).__name__, error, outcome.note,
            number, policy.attempts - 1, wait,
        )  # fmt: skip
        time.sleep(wait)
        waited += wait
    raise AssertionError("unreachable")


def with_retries(
    call: Callable[[], T],
    policy: RetryPolicy,
    *,
    url: str,
    offset: int | None,
    length: int | None,
    key: str | None = None,
) -> T:
    """``call()``, retried on transient errors; then :class:`RemoteReadError`."""

    def attempt() -> T | Failed:
        try:
            return call()
        except (StaleIndexError, RemoteReadError):
            raise  # final already: a changed object, a nested read's verdict
        except Exception as e:
            return Failed([e], url, offset, length, key=key)

    return retrying(attempt, policy)


DEFAULT_RETRY = RetryPolicy()
