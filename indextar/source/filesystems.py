"""fsspec filesystems by URL scheme, imported on first use, and the package each scheme
needs (:data:`REMOTE_SCHEMES`, which :mod:`indextar.source.location` names too).

A missing fsspec, or a protocol's missing package, raises an ImportError that says what
to install. A forked child keeps the filesystems its parent used (see
:func:`_keep_inherited_filesystems`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .fsspec_internals import cached_instances, prefer_uvloop

__all__ = [
    "REMOTE_SCHEMES",
    "filesystem",
    "scheme_package",
    "split_url",
    "without_client_retries",
]

_USED_CLASSES: set[type] = set()
_INHERITED: list[Any] = []


# scheme -> the package fsspec needs for it, for the ImportError's install hint.
REMOTE_SCHEMES: dict[str, str] = {
    "http": "aiohttp",
    "https": "aiohttp",
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "hf": "huggingface_hub",
}


def split_url(url: str) -> tuple[str, str]:
    """A URL's scheme and the rest, ``("s3", "bucket/key")``; ``("", url)`` for a name
    without one. Only for names already known to be remote: whether a name is remote is
    :func:`~indextar.source.location.url_scheme`'s to say."""
    scheme, sep, rest = url.partition("://")
    return (scheme, rest) if sep else ("", url)


def scheme_package(scheme: str) -> str:
    """What to install to read ``scheme://`` shards (:data:`REMOTE_SCHEMES`)."""
    return REMOTE_SCHEMES.get(scheme, f"the fsspec backend for {scheme}://")


def _keep_inherited_filesystems() -> None:
    # A forked child (a DataLoader worker) must never close its parent's async
    # filesystems: their sockets are registered in the parent's epoll instance, which
    # the child shares, so closing them here unregisters them there and the parent
    # then waits forever for its next response. fsspec drops its cached instances in
    # a child (and finalizers would close them); keeping a reference prevents that.
    for cls in _USED_CLASSES:
        _INHERITED.extend(cached_instances(cls))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_keep_inherited_filesystems)


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path within it.

    Raises
    ------
    ImportError
        If fsspec or the protocol's package is not installed, saying what to install.
    """
    protocol = split_url(url)[0]
    try:
        import fsspec.core
    except ImportError as e:
        raise ImportError(
            f"reading {protocol}:// shards needs fsspec: pip install 'indextar[remote]'"
        ) from e
    prefer_uvloop()  # before the filesystem takes fsspec's loop
    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError as e:
        package = scheme_package(protocol)
        raise ImportError(
            f"reading {protocol}:// shards needs {package}: pip install {package} "
            f"(or 'indextar[remote]' for http and s3) ({e})"
        ) from e
    _USED_CLASSES.add(type(fs))
    return fs, path


def without_client_retries(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """``storage_options`` with botocore's own retries off for an ``s3://`` URL, unless
    the caller chose them (``config_kwargs={"retries": ...}``).

    Ranged reads retry in one loop of their own
    (:func:`~indextar.source.remote.with_retries`), which checks each answer's range,
    honours ``Retry-After`` and names the sample; botocore's loop inside it would
    multiply the attempts and sleep without ``Retry-After``, unseen.
    """
    options = dict(storage_options)
    if split_url(url)[0] in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})
        options["config_kwargs"] = config
    return options
