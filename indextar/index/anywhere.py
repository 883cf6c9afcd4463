"""A shard's existing index, and its bytes, wherever the shard is: a local path or a URL.

What the tools that inspect, copy or export shards (``indextar info``, ``ls``, ``cat``,
``get``, ``verify``, ``meta import``, ``reshard``, ``export``) open. A remote shard's
index is never built here: it is found as a dataset finds it
(:func:`~.remote.open_remote_index`: in ``index_dir``, by default
:func:`~.remote.default_index_dir`, else fetched from ``<url>.idx.sqlite`` beside the
object), and checked against the object.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..patterns import is_url
from ..source.base import ByteSource
from ..source.local import FileVersion, open_source
from ..source.remote import RangeSource
from .compressed import decompressing_source
from .remote import default_index_dir, expected_stat, open_remote_index
from .shard import PathLike, ShardIndex, build_index, open_index

__all__ = ["open_shard_index", "usable_index", "shard_source"]


def open_shard_index(
    shard: PathLike,
    *,
    index_dir: PathLike | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> ShardIndex:
    """Open and validate the index of ``shard``, a local path or a URL; never build it.

    ``index_dir`` is the folder of the indexes: for a local shard, ``None`` means next
    to it; for a URL, :func:`~.remote.default_index_dir`. ``storage_options`` go to
    fsspec (``None``: credentials from the environment, as fsspec's backends take them).

    Raises
    ------
    MissingIndexError
        If the shard has no index (a URL's: neither in ``index_dir`` nor beside it).
    StaleIndexError
        If the shard, or the remote object, changed since it was indexed.
    ShardNotFoundError, IndexFormatError
        As :func:`~.shard.open_index`.
    """
    url = os.fspath(shard)
    if not is_url(url):
        return open_index(shard, index_dir=index_dir)
    return open_remote_index(
        url,
        index_dir=default_index_dir() if index_dir is None else index_dir,
        storage_options=storage_options,
        build_missing=False,
    )


def usable_index(shard: PathLike, *, index_dir: PathLike | None = None) -> ShardIndex:
    """The index of ``shard``: a local shard's is built if missing (:func:`~.shard.build_index`);
    a URL's must exist (:func:`open_shard_index`; ``indextar index`` or ``build_indexes``
    builds it). What the tools that copy or export shards read."""
    if is_url(os.fspath(shard)):
        return open_shard_index(shard, index_dir=index_dir)
    return build_index(shard, index_dir=index_dir)


def shard_source(
    index: ShardIndex, *, storage_options: Mapping[str, Any] | None = None
) -> ByteSource:
    """The uncompressed tar bytes of the shard ``index`` describes (a local file or a
    remote object), every read checked against the version the index recorded."""
    raw: ByteSource
    if is_url(index.shard):
        expected = expected_stat(index.meta)
        raw = RangeSource(index.shard, expected=expected, storage_options=storage_options)
        return decompressing_source(index.path, index.meta, raw)
    raw = open_source(index.shard, FileVersion(index.meta.shard_size, index.meta.shard_mtime_ns))
    return decompressing_source(index.path, index.meta, raw, local_path=index.shard)
