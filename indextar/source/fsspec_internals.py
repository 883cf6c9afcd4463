"""What indextar takes from under fsspec's public API, in one place.

fsspec has no public ranged GET that carries a precondition (HTTP ``If-Match``, S3
``IfMatch``), and no public way to keep a forked child from closing the filesystems its
parent cached; :mod:`~indextar.source.conditional` and
:mod:`~indextar.source.filesystems` need both. Every name they take from fsspec's (and
s3fs's) internals is listed in :data:`INTERNALS` and reached only through the functions
below, and :func:`missing_internals` checks the list against the installed packages:
``tests/source/test_fsspec_internals.py`` runs it, so a release that moves one of them
fails that test, naming the package's version and the attribute, rather than a read.

Imports fsspec only inside the functions that need it (``indextar[remote]`` is an
extra).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import threading
import types
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TypeVar

__all__ = [
    "INTERNALS",
    "Internal",
    "cached_instances",
    "cat_file_async",
    "configured_options",
    "default_loop",
    "http_raise_for_status",
    "http_request",
    "http_session",
    "missing_internals",
    "prefer_uvloop",
    "run_on_default_loop",
    "run_on_loop",
    "s3_method_kwargs",
    "s3_split_path",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Internal:
    """One name indextar takes from a class of fsspec or of one of its backends."""

    module: str
    """The module that defines ``owner``, ``"fsspec.implementations.http"``."""
    owner: str
    """The class, ``"HTTPFileSystem"``."""
    name: str
    """The attribute, ``"_raise_not_found_for_status"``."""
    on_instance: bool
    """Set by ``__init__`` (checked on an instance), not defined by the class."""
    why: str


INTERNALS: tuple[Internal, ...] = (
    Internal("fsspec.implementations.http", "HTTPFileSystem", "_cache", False,
             "the instances a forked child must keep (filesystems.py)"),
    Internal("fsspec.implementations.http", "HTTPFileSystem", "set_session", False,
             "the aiohttp session a conditional ranged GET is sent on"),
    Internal("fsspec.implementations.http", "HTTPFileSystem", "encode_url", False,
             "the URL that GET is sent to"),
    Internal("fsspec.implementations.http", "HTTPFileSystem", "kwargs", True,
             "the request options (headers, auth) from storage_options"),
    Internal("fsspec.implementations.http", "HTTPFileSystem", "_raise_not_found_for_status",
             False, "the error of a failed GET, as fsspec's own reads raise it"),
    Internal("s3fs", "S3FileSystem", "_get_s3_method_kwargs", False,
             "a get_object's arguments (requester pays, SSE) as s3fs adds them"),
    Internal("s3fs", "S3FileSystem", "split_path", False,
             "bucket, key and version of a path"),
    Internal("fsspec.asyn", "AsyncFileSystem", "_cat_file", False,
             "a plain ranged read where no precondition can be sent"),
    Internal("fsspec.asyn", "AsyncFileSystem", "loop", False,
             "the event loop a batch of ranged reads runs on"),
    Internal("fsspec.asyn", "", "loop", False,
             "the slot of fsspec's event loop, where a uvloop one is put (default_loop)"),
    Internal("fsspec.asyn", "", "iothread", False, "the slot of that loop's thread"),
    Internal("fsspec.asyn", "", "get_lock", False, "the lock fsspec makes its loop under"),
)  # fmt: skip


def _get(fs: Any, name: str) -> Any:
    """``fs.name``, or an AttributeError that says fsspec changed under indextar."""
    if isinstance(fs, types.ModuleType):
        if not hasattr(fs, name):
            raise AttributeError(
                f"indextar needs {fs.__name__}.{name}, which {_versions()} lacks: install the "
                f"versions indextar[remote] names"
            )
        return getattr(fs, name)
    try:
        return getattr(fs, name)
    except AttributeError as e:
        raise AttributeError(
            f"indextar needs {type(fs).__module__}.{type(fs).__qualname__}.{name}, which "
            f"{_versions()} lacks: install the versions indextar[remote] names"
        ) from e


def _versions() -> str:
    found = []
    for package in ("fsspec", "s3fs"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found) or "the installed fsspec"


def missing_internals() -> list[str]:
    """What of :data:`INTERNALS` the installed packages lack, one line each, naming the
    package's version and the attribute (empty: all there). A package that is not
    installed (s3fs, an optional backend) is skipped."""
    missing = []
    instances: dict[str, Any] = {}
    for internal in INTERNALS:
        try:
            module = importlib.import_module(internal.module)
        except ImportError:
            continue
        package = internal.module.partition(".")[0]
        version = metadata.version(package)
        where = f"{internal.module}.{internal.owner}".rstrip(".")
        owner: Any = getattr(module, internal.owner, None) if internal.owner else module
        if owner is None:
            missing.append(f"{package} {version} has no {where} ({internal.why})")
            continue
        holder = owner
        if internal.on_instance:
            if where not in instances:
                instances[where] = owner()
            holder = instances[where]
        if not hasattr(holder, internal.name):
            missing.append(
                f"{package} {version} has no {where}.{internal.name}, which indextar uses "
                f"for {internal.why}"
            )
    return missing


def cached_instances(cls: type) -> list[Any]:
    """The instances fsspec keeps of the filesystem class ``cls`` (none for a class
    that is not fsspec's)."""
    cache: Mapping[Any, Any] = getattr(cls, "_cache", {})
    return list(cache.values())


async def http_session(fs: Any) -> Any:
    """The aiohttp session of an ``HTTPFileSystem``."""
    return await _get(fs, "set_session")()


def http_request(fs: Any, path: str) -> tuple[str, dict[str, Any]]:
    """The URL for ``path`` and a copy of the request options of an ``HTTPFileSystem``."""
    return _get(fs, "encode_url")(path), dict(_get(fs, "kwargs"))


def http_raise_for_status(fs: Any, response: Any, path: str) -> None:
    """Raise for a failed response as the ``HTTPFileSystem``'s own reads do."""
    _get(fs, "_raise_not_found_for_status")(response, path)


def s3_split_path(fs: Any, path: str) -> tuple[str, str, str | None]:
    """``(bucket, key, version_id)`` of an ``S3FileSystem`` path."""
    bucket, key, version = _get(fs, "split_path")(path)
    return bucket, key, version


def s3_method_kwargs(fs: Any, method: Any, **request: Any) -> dict[str, Any]:
    """``request`` with what s3fs adds to a call of the botocore client's ``method``
    (its ``s3_additional_kwargs``: requester pays, server-side encryption)."""
    kwargs: dict[str, Any] = _get(fs, "_get_s3_method_kwargs")(method, **request)
    return kwargs


async def cat_file_async(fs: Any, path: str, start: int, end: int) -> bytes:
    """Bytes ``start .. end`` of ``path`` on an async filesystem, with no precondition."""
    data: bytes = await _get(fs, "_cat_file")(path, start=start, end=end)
    return data


def run_on_loop(fs: Any, function: Callable[[], Awaitable[T]]) -> T:
    """``await function()`` on the async filesystem's event loop, from this thread."""
    import fsspec.asyn

    result: T = fsspec.asyn.sync(_get(fs, "loop"), function)
    return result


def run_on_default_loop(function: Callable[[], Awaitable[T]]) -> T:
    """``await function()`` on fsspec's own event loop thread (the one its async
    filesystems share), from this thread; a forked child gets a fresh one."""
    import fsspec.asyn

    result: T = fsspec.asyn.sync(default_loop(), function)
    return result


def default_loop() -> asyncio.AbstractEventLoop:
    """fsspec's own event loop (running in its thread; a forked child gets a fresh one),
    made a uvloop loop where :func:`prefer_uvloop` can."""
    import fsspec.asyn

    prefer_uvloop()
    loop: asyncio.AbstractEventLoop = fsspec.asyn.get_loop()
    return loop


_MADE_LOOPS: list[Any] = []  # every uvloop loop made here: a forked child never frees one


def prefer_uvloop() -> None:
    """Make fsspec's event loop, if it has none yet in this process, a uvloop loop.

    Its async filesystems (HTTP, S3) and indextar's own ranged GETs and read-ahead all
    run on that loop, and libuv's costs about a third less CPU a request than asyncio's
    (tools/bench_remote.py). Only where uvloop is installed (``indextar[remote]`` has it
    on Linux and macOS) and ``INDEXTAR_UVLOOP`` is not ``0``; a loop fsspec already
    made is kept. The loop runs in a daemon thread, as fsspec's own does, and a forked
    child gets a fresh one (fsspec empties the slot after a fork; the parent's loop is
    kept referenced, never closed by the child: it shares the parent's epoll)."""
    import fsspec.asyn

    slot = _get(fsspec.asyn, "loop")
    if slot[0] is not None or os.environ.get("INDEXTAR_UVLOOP", "1") == "0":
        return
    try:
        import uvloop
    except ImportError:
        return
    with _get(fsspec.asyn, "get_lock")():
        if slot[0] is not None:
            return
        loop = uvloop.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="fsspecIO", daemon=True)
        slot[0] = loop
        _MADE_LOOPS.append(loop)
        thread.start()
        _get(fsspec.asyn, "iothread")[0] = thread


def configured_options(protocol: str) -> dict[str, Any]:
    """The defaults fsspec's configuration (``~/.config/fsspec``, ``FSSPEC_*``) gives
    ``protocol``'s filesystems, as ``url_to_fs`` applies them."""
    import fsspec.config

    return dict(fsspec.config.conf.get(protocol, {}))
