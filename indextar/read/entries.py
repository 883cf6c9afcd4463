"""A dataset's shards as manifest entries, and each entry's index, opened and checked.

A dataset holds one :class:`~indextar.index.manifest.ManifestShard` per shard, read
from a manifest or made from the shards' indexes; :func:`open_entry_index` opens one
entry's index again wherever it is needed (a DataLoader worker, ``indextar get``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import MissingIndexError, ShardNotFoundError, StaleIndexError
from ..index.build import build_indexes
from ..index.manifest import ManifestShard
from ..index.shard import PathLike, ShardIndex, index_path, open_index, open_index_at
from ..patterns import is_url
from .remote_options import RemoteOptions

__all__ = ["open_entry_index", "index_entries"]

log = logging.getLogger(__name__)


def open_entry_index(
    entry: ManifestShard,
    *,
    number: int,
    manifest: PathLike | None,
    index_dir: PathLike | None,
    build_missing: bool = False,
    remote: RemoteOptions | None = None,
) -> ShardIndex:
    """Open and validate the index of shard ``number`` of a dataset, and check it against
    the dataset's entry.

    The index is the one the entry records, else found by ``index_dir`` (local shards)
    or through ``remote`` (URLs; without ``remote`` a URL is treated as a local path).
    A missing index of a local shard is built if ``build_missing`` and the entry
    records none. ``manifest`` names the entries' manifest in errors.

    Raises
    ------
    ShardNotFoundError
        If the shard no longer exists.
    MissingIndexError
        If the index is missing and is not built.
    StaleIndexError
        If the shard changed since it was indexed, or the index disagrees with the
        entry's sample count or fingerprint.
    """
    try:
        if is_url(entry.url) and remote is not None:
            index = remote.index(entry.url, entry.index, build_missing=build_missing)
        elif entry.index is not None:
            index = open_index_at(entry.url, entry.index)
        else:
            index = open_index(entry.url, index_dir=index_dir)
    except ShardNotFoundError as e:
        raise ShardNotFoundError(
            f"shard {entry.url!r} (number {number} of the dataset) no longer exists: {e}"
        ) from e
    except MissingIndexError:
        if not build_missing or entry.index is not None:
            raise
        index = build_indexes([entry.url], index_dir=index_dir, workers=1)[0]
    if index.meta.num_samples != entry.nsamples or (
        entry.fingerprint is not None and entry.fingerprint != index.meta.fingerprint
    ):
        raise StaleIndexError(
            f"manifest {str(manifest)!r} lists shard {entry.url!r} with {entry.nsamples} "
            f"samples and fingerprint {entry.fingerprint}; its index {str(index.path)!r} has "
            f"{index.meta.num_samples} samples and fingerprint {index.meta.fingerprint}; "
            "rewrite the manifest with write_manifest()"
        )
    return index


def index_entries(
    shards: list[str],
    *,
    index_dir: str | None,
    build_missing: bool,
    progress: bool,
    workers: int | None,
    remote: RemoteOptions,
) -> list[ManifestShard]:
    """The entries of ``shards`` from their indexes, the missing ones built if
    ``build_missing`` (local shards in ``workers`` processes).

    Raises
    ------
    ShardNotFoundError
        If a shard does not exist.
    MissingIndexError
        If ``build_missing`` is false and local shards lack an index (all are named).
    """
    opened = {
        shard: remote.index(shard, None, build_missing=build_missing)
        for shard in shards
        if is_url(shard)
    }
    local = [shard for shard in shards if shard not in opened]
    indexes = _open_local_indexes(
        local, index_dir=index_dir, build_missing=build_missing, progress=progress, workers=workers
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
        log.info("building %d missing indexes (meta=%r)", len(missing), meta)
        indexes = build_indexes(
            missing,
            index_dir=index_dir,
            workers=workers,
            progress=progress,
            meta=meta,
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
