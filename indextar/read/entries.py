"""A dataset's shards as manifest entries, made from the shards' indexes.

A dataset holds one :class:`~indextar.index.manifest.ManifestShard` per shard, read
from a manifest or made here; :func:`~indextar.index.opener.open_entry` opens one
entry's shard again wherever it is needed (a DataLoader worker, ``indextar get``).
"""

from __future__ import annotations

import concurrent.futures
import logging
from pathlib import Path

from ..errors import MissingIndexError, ShardNotFoundError
from ..index.build import build_indexes
from ..index.manifest import ManifestShard
from ..index.opener import OpenOptions, find_index
from ..index.shard import ShardIndex, index_path, open_index
from ..source.location import ShardLocation, remote_shards

__all__ = ["OPEN_THREADS", "index_entries"]

log = logging.getLogger(__name__)

OPEN_THREADS = 32
"""Remote shards whose indexes are found (and checked, one HEAD each) at once."""


def index_entries(
    shards: list[str],
    *,
    options: OpenOptions,
    progress: bool,
    workers: int | None,
) -> list[ManifestShard]:
    """The entries of ``shards`` from their indexes, the missing ones built if
    ``options.build_missing`` (local shards in ``workers`` processes, remote ones here).

    Raises
    ------
    ShardNotFoundError
        If a shard does not exist.
    MissingIndexError
        If ``build_missing`` is false and local shards lack an index (all are named).
    """
    opened = _open_remote_indexes([shards[n] for n in sorted(remote_shards(shards))], options)
    local = [shard for shard in shards if shard not in opened]
    indexes = _open_local_indexes(
        local,
        index_dir=options.index_dir,
        build_missing=options.build_missing,
        progress=progress,
        workers=workers,
    )
    opened.update(zip(local, indexes))
    return [
        ManifestShard(
            url=index.shard,
            nsamples=index.meta.num_samples,
            filesize=index.meta.shard_size,
            fingerprint=index.meta.fingerprint,
            index=str(index.path),
        )
        for index in (opened[shard] for shard in shards)
    ]


def _open_remote_indexes(urls: list[str], options: OpenOptions) -> dict[str, ShardIndex]:
    """Each remote shard's index, found (fetched, or built) and checked against its
    object, ``OPEN_THREADS`` shards at once: a dataset of many shards opens in a few
    round trips, not one per shard. The first shard's error in order is raised."""
    if len(urls) <= 1:
        return {url: find_index(ShardLocation.of(url), options) for url in urls}
    with concurrent.futures.ThreadPoolExecutor(
        min(OPEN_THREADS, len(urls)), thread_name_prefix="indextar-open"
    ) as pool:
        futures = [pool.submit(find_index, ShardLocation.of(url), options) for url in urls]
        return {url: future.result() for url, future in zip(urls, futures)}


def _open_local_indexes(
    shards: list[str],
    *,
    index_dir: str | None,
    build_missing: bool,
    progress: bool,
    workers: int | None,
) -> list[ShardIndex]:
    missing = [shard for shard in shards if not index_path(shard, index_dir=index_dir).exists()]
    if missing and not build_missing:
        for shard in missing:
            if not Path(shard).exists():
                raise ShardNotFoundError(f"shard {shard!r} does not exist")
        listed = ", ".join(repr(shard) for shard in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise MissingIndexError(
            f"{len(missing)} of {len(shards)} shards have no index: {listed}{more}",
            [str(shard) for shard in missing],
            "build them with build_index() or pass build_missing=True",
        )
    absent = set(missing)
    opened = {
        shard: open_index(shard, index_dir=index_dir) for shard in shards if shard not in absent
    }
    if missing:
        meta = _json_member(list(opened.values()))
        log.info("building %d missing indexes (attributes_from=%r)", len(missing), meta)
        indexes = build_indexes(
            missing,
            index_dir=index_dir,
            workers=workers,
            progress=progress,
            attributes_from=meta,
            on_error="skip",
        )
        opened.update(zip(missing, indexes))
    return [opened[shard] for shard in shards]


def _json_member(indexes: list[ShardIndex]) -> str | None:
    """The member the other shards' attributes were read from (``"json"``), if they
    name exactly one: a missing index is built with the same, so that a ``where`` sees
    its samples' attributes rather than none. ``None`` (a plain build) otherwise."""
    members: set[str] = set()
    for index in indexes:
        members.update(index.json_members())
    return members.pop() if len(members) == 1 else None
