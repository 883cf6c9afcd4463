"""Which shards need no build: the driver's quick checks before any job starts.

:func:`fresh_on_stat` answers for a local shard with one ``stat`` and the index's
metadata, read from an extended attribute of the index file
(:mod:`indextar.index.meta_cache`; the jobs set it when an index is built).
:func:`fresh_by_listing` answers for remote shards a folder at a time: one listing of
the store (1,000 objects a request on S3) gives every object's size and ETag, compared
with the indexes in ``index_dir``, instead of a metadata request per shard.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import IndexFormatError
from ..source.conditional import RemoteStat
from ..source.filesystems import filesystem
from .checksums import checksum_algorithm
from .meta import IndexMeta, read_meta
from .meta_cache import cache_meta, cached_meta
from .options import BuildOptions
from .remote import expected_stat, remote_index_path
from .shard import INDEX_SUFFIX, ShardIndex, index_path

__all__ = ["fresh_on_stat", "fresh_by_listing"]

log = logging.getLogger(__name__)


def fresh_on_stat(shard: str, options: BuildOptions) -> ShardIndex | None:
    """The index of a local ``shard`` if it records the shard's current size and mtime.

    The quick check of a re-run: one ``stat`` of the shard and a read of the index's
    metadata (from the index file's extended attribute where one was set), no
    fingerprint (opening the dataset checks that); with ``meta``, a query of its
    attribute tables too. ``None`` means the shard needs a job: no index, a stale or
    unreadable one, or options it was not built with.
    """
    if options.force:
        return None
    if options.index_dir is None:  # index_path's answer, without pathlib (a third of the cost)
        path = shard + INDEX_SUFFIX
    else:
        path = str(index_path(shard, index_dir=options.index_dir))
    try:
        st = os.stat(shard)
    except OSError:
        return None
    meta = _meta_at(path)
    if meta is None:
        return None
    if (st.st_size, st.st_mtime_ns) != (meta.shard_size, meta.shard_mtime_ns):
        return None
    if meta.ignore_zeros and not options.ignore_zeros:
        return None  # build_index rebuilds it
    if options.checksums and meta.checksum != checksum_algorithm(options.checksums):
        return None  # build_index rebuilds it with them
    index = ShardIndex(shard=shard, path=Path(path), meta=meta)
    if options.meta is not None:
        try:
            if not index.has_attributes(options.meta):
                return None  # build_index rebuilds it, or refuses to drop imported ones
        except (sqlite3.Error, IndexFormatError):
            return None
    return index


def _meta_at(path: str | Path) -> IndexMeta | None:
    """The metadata of the index at ``path``: from its attribute, else its tables."""
    meta = cached_meta(path)
    if meta is None and os.path.exists(path):
        try:
            meta = read_meta(Path(path))
        except (OSError, IndexFormatError):
            return None
        cache_meta(path, meta)
    return meta


def fresh_by_listing(urls: Sequence[str], options: BuildOptions) -> dict[str, ShardIndex]:
    """The indexes in ``options.index_dir`` of those remote shards ``urls`` whose object,
    as listed by the store, has the size and ETag the index records.

    One listing per folder holding two or more of the shards (a lone shard's check on a
    worker costs as little). Objects listed without an ETag (HTTP servers list none),
    and folders that cannot be listed, are left to the jobs. With ``upload``, a shard
    also needs its ``.idx.sqlite`` next to it in the listing.
    """
    if options.force or options.index_dir is None:
        return {}
    if options.meta is not None or options.ignore_zeros or options.checksums:
        return {}  # options each job refuses for a remote shard: no listing vouches
    folders: dict[str, list[str]] = defaultdict(list)
    for url in urls:
        folders[url.rpartition("/")[0]].append(url)
    fresh: dict[str, ShardIndex] = {}
    for folder, members in folders.items():
        if len(members) < 2:
            continue
        listed = _listing(folder, options.storage_options)
        for url in members:
            name = url.rpartition("/")[2]
            entry = listed.get(name)
            if entry is None or (options.upload and name + INDEX_SUFFIX not in listed):
                continue
            if entry.get("size") is None or not (entry.get("ETag") or entry.get("etag")):
                continue  # an HTML folder page lists names, not versions
            now = RemoteStat.from_info(entry, url)
            path = remote_index_path(url, options.index_dir)
            meta = _meta_at(path)
            if meta is not None and now.etag and now == expected_stat(meta):
                fresh[url] = ShardIndex(shard=url, path=path, meta=meta)
    log.info("%d of %d remote shards are fresh by their listing", len(fresh), len(urls))
    return fresh


def _listing(folder: str, storage_options: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The objects in the remote ``folder`` by name, or nothing if it cannot be listed."""
    try:
        fs, path = filesystem(folder, storage_options)
        entries = fs.ls(path, detail=True, refresh=True)
    except Exception as e:  # noqa: BLE001 - no listing: each shard is checked by its job
        log.info("cannot list %s (%s): each shard is checked on its own", folder, e)
        return {}
    return {
        str(entry["name"]).rstrip("/").rpartition("/")[2]: entry
        for entry in entries
        if entry.get("type", "file") == "file"
    }
