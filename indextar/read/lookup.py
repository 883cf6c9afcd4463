"""Look inside shards: list samples, read one member, describe one sample of a dataset.

The library side of ``indextar ls``, ``cat`` and ``get``. A shard without an index is
scanned in memory; nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import MissingIndexError, SampleIndexError, SampleKeyError
from ..index.manifest import is_manifest, read_manifest
from ..index.members import MemberTable, load_members, scan_members
from ..index.naming import split_name
from ..index.shard import PathLike, ShardIndex, open_index, open_index_at
from ..patterns import expand_shards

__all__ = ["MemberInfo", "SampleInfo", "shard_members", "read_member", "describe_sample"]


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """One member of a described sample; ``head`` is the start of its data."""

    name: str
    ext: str
    size: int
    data_offset: int
    head: bytes


@dataclass(frozen=True, slots=True)
class SampleInfo:
    """Where a dataset's sample lives and what it holds."""

    index: int
    shard: str
    shard_sample: int
    key: str
    start_offset: int
    end_offset: int
    members: tuple[MemberInfo, ...]


def shard_members(shard: PathLike, *, index_dir: PathLike | None = None) -> MemberTable:
    """The samples and members of ``shard``, from its index or, lacking one, a scan."""
    try:
        return load_members(open_index(shard, index_dir=index_dir))
    except MissingIndexError:
        return scan_members(str(shard))


def _read(shard: str, offset: int, size: int) -> bytes:
    with open(shard, "rb") as f:
        f.seek(offset)
        return f.read(size)


def read_member(shard: PathLike, member: str, *, index_dir: PathLike | None = None) -> bytes:
    """The data of member ``member`` (``"KEY.EXT"``, extension in any case) of ``shard``.

    Raises
    ------
    SampleKeyError
        If no sample has that key, or the sample has no member with that extension.
    """
    split = split_name(member)
    if split is None:
        raise SampleKeyError(f"{member!r} is not KEY.EXT: it has no extension")
    key, ext = split
    table = shard_members(shard, index_dir=index_dir)
    samples = [i for i, k in enumerate(table.keys) if k == key]
    if not samples:
        raise SampleKeyError(f"shard {str(shard)!r} has no sample with key {key!r}")
    for sample in samples:
        for row in table.members_of(sample):
            if table.exts[row] == ext:
                return _read(table.shard, int(table.data_offsets[row]), int(table.sizes[row]))
    present = sorted({table.exts[row] for s in samples for row in table.members_of(s)})
    raise SampleKeyError(
        f"shard {str(shard)!r}: sample {key!r} has no {ext!r} member; it has {', '.join(present)}"
    )


def _dataset_shards(
    dataset: str | Sequence[str], index_dir: PathLike | None
) -> tuple[list[str], list[int], list[ShardIndex | None], list[str | None]]:
    """Shards, sample counts, opened indexes (where opened) and recorded index paths."""
    if isinstance(dataset, str) and is_manifest(dataset):
        manifest = read_manifest(dataset)
        return (
            [s.url for s in manifest.shards],
            [s.nsamples for s in manifest.shards],
            [None] * len(manifest.shards),
            [s.index for s in manifest.shards],
        )
    shards = expand_shards(dataset)
    indexes = [open_index(shard, index_dir=index_dir) for shard in shards]
    return shards, [len(ix) for ix in indexes], list(indexes), [None] * len(shards)


def describe_sample(
    dataset: str | Sequence[str],
    index: int,
    *,
    index_dir: PathLike | None = None,
    head_bytes: int = 64,
) -> SampleInfo:
    """Locate sample number ``index`` of a dataset (shard patterns or a manifest) and describe it.

    Negative numbers count from the end. Each member's first ``head_bytes`` are read.

    Raises
    ------
    SampleIndexError
        If ``index`` is out of range.
    """
    shards, counts, indexes, index_paths = _dataset_shards(dataset, index_dir)
    total = sum(counts)
    position = index + total if index < 0 else index
    if not 0 <= position < total:
        raise SampleIndexError(f"sample {index} is out of range: the dataset has {total} samples")
    ends = np.cumsum(counts)
    which = int(np.searchsorted(ends, position, side="right"))
    local = position - int(ends[which] - counts[which])
    shard_index = indexes[which]
    if shard_index is None:
        recorded = index_paths[which]
        shard_index = (
            open_index_at(shards[which], recorded)
            if recorded is not None
            else open_index(shards[which], index_dir=index_dir)
        )
    table = load_members(shard_index)
    members = tuple(
        MemberInfo(
            name=table.names[row],
            ext=table.exts[row],
            size=int(table.sizes[row]),
            data_offset=int(table.data_offsets[row]),
            head=_read(
                table.shard, int(table.data_offsets[row]), min(head_bytes, int(table.sizes[row]))
            ),
        )
        for row in table.members_of(local)
    )
    return SampleInfo(
        index=position,
        shard=table.shard,
        shard_sample=local,
        key=table.keys[local],
        start_offset=int(table.start_offset[local]),
        end_offset=int(table.end_offset[local]),
        members=members,
    )
