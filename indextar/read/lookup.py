"""Look inside shards: list samples, read one member, describe one sample of a dataset,
name the keys of a dataset's samples.

The library side of ``indextar ls``, ``cat``, ``get`` and ``query --keys``. Shards are
local paths or URLs (:mod:`indextar.index.opener`). A local shard without an index is
scanned in memory; nothing is written. A remote shard's index must exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import MissingIndexError, SampleIndexError, SampleKeyError
from ..index.manifest import is_manifest, read_manifest
from ..index.members import MemberTable, load_members, scan_members
from ..index.naming import split_name
from ..index.opener import OpenOptions, open_entry_index, open_shard_index, shard_source
from ..index.shard import PathLike, ShardIndex
from ..source.base import ByteSource
from ..source.local import open_source
from ..source.location import ShardLocation, SourceOptions
from ..source.patterns import expand_shards
from .protocols import IndexedShards

__all__ = [
    "MemberInfo",
    "SampleInfo",
    "shard_members",
    "read_member",
    "describe_sample",
    "sample_keys",
]

DatasetArg = str | Sequence[str] | IndexedShards


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
    """The samples and members of ``shard`` (a local path or a URL), from its index or,
    lacking one, a scan of the local shard.

    Raises
    ------
    MissingIndexError
        If ``shard`` is a URL and has no index.
    """
    return _members(shard, index_dir)[0]


def _members(shard: PathLike, index_dir: PathLike | None) -> tuple[MemberTable, ShardIndex | None]:
    location = ShardLocation.of(shard)
    try:
        index = open_shard_index(location.name, index_dir=index_dir)
    except MissingIndexError:
        if location.remote:  # a remote shard is never scanned here
            raise
        return scan_members(location.name), None
    return load_members(index), index


def _source(table: MemberTable, index: ShardIndex | None) -> ByteSource:
    """The uncompressed bytes ``table``'s offsets point into."""
    if index is None:  # an uncompressed local shard, scanned: its file
        return open_source(table.shard)
    return shard_source(index)


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
    table, index = _members(shard, index_dir)
    samples = [i for i, k in enumerate(table.keys) if k == key]
    if not samples:
        raise SampleKeyError(f"shard {str(shard)!r} has no sample with key {key!r}")
    for sample in samples:
        for row in table.members_of(sample):
            if table.exts[row] == ext:
                with _source(table, index) as source:
                    return source.read(int(table.data_offsets[row]), int(table.sizes[row]))
    present = sorted({table.exts[row] for s in samples for row in table.members_of(s)})
    raise SampleKeyError(
        f"shard {str(shard)!r}: sample {key!r} has no {ext!r} member; it has {', '.join(present)}"
    )


def _dataset_shards(
    dataset: DatasetArg, index_dir: PathLike | None
) -> tuple[list[int], Callable[[int], ShardIndex], SourceOptions | None]:
    """Each shard's sample count, a function giving shard ``n``'s index (a manifest's
    shards, and an open dataset's, are opened only then), and how the remote shards'
    bytes are read."""
    if not isinstance(dataset, str | Sequence):  # an IndexedTarDataset: its counts are known
        options = SourceOptions(dataset.storage_options or {})
        return dataset.shard_sizes.tolist(), dataset.shard_index, options
    if isinstance(dataset, str) and is_manifest(dataset):
        manifest = read_manifest(dataset)
        opening = OpenOptions.make(index_dir)

        def open_shard(n: int) -> ShardIndex:
            return open_entry_index(manifest.shards[n], opening, number=n, manifest=manifest.path)

        return [s.nsamples for s in manifest.shards], open_shard, None
    shards = expand_shards(dataset)
    indexes = [open_shard_index(shard, index_dir=index_dir) for shard in shards]
    return [len(ix) for ix in indexes], indexes.__getitem__, None


def describe_sample(
    dataset: DatasetArg,
    index: int,
    *,
    index_dir: PathLike | None = None,
    head_bytes: int = 64,
) -> SampleInfo:
    """Locate sample number ``index`` of a dataset (shard patterns, a manifest, or an
    open :class:`~indextar.IndexedTarDataset`, whose ``index_dir`` then holds) and
    describe it.

    Negative numbers count from the end. Each member's first ``head_bytes`` are read.

    Raises
    ------
    SampleIndexError
        If ``index`` is out of range.
    """
    counts, open_shard, source_options = _dataset_shards(dataset, index_dir)
    total = sum(counts)
    position = index + total if index < 0 else index
    if not 0 <= position < total:
        raise SampleIndexError(f"sample {index} is out of range: the dataset has {total} samples")
    ends = np.cumsum(counts)
    which = int(np.searchsorted(ends, position, side="right"))
    local = position - int(ends[which] - counts[which])
    shard_index = open_shard(which)
    table = load_members(shard_index)
    rows = table.members_of(local)
    with shard_source(shard_index, source_options) as source:
        heads = source.read_many(
            [int(table.data_offsets[row]) for row in rows],
            [min(head_bytes, int(table.sizes[row])) for row in rows],
        )
    members = tuple(
        MemberInfo(
            name=table.names[row],
            ext=table.exts[row],
            size=int(table.sizes[row]),
            data_offset=int(table.data_offsets[row]),
            head=head,
        )
        for row, head in zip(rows, heads)
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


def sample_keys(dataset: IndexedShards, indices: npt.ArrayLike) -> Iterator[str]:
    """The key of each of ``dataset``'s samples at ``indices``, in their order; each run
    of samples in one shard reads that shard's keys once (sorted indices: each shard's)."""
    positions = np.asarray(indices, dtype=np.int64)
    if positions.size and not (0 <= positions.min() and positions.max() < len(dataset)):
        raise SampleIndexError(
            f"indices must be in [0, {len(dataset)}); got {positions.min()}..{positions.max()}"
        )
    starts = dataset.shard_starts
    shard_nos = np.searchsorted(starts, positions, side="right") - 1
    runs = np.flatnonzero(np.diff(shard_nos)) + 1
    for lo, hi in zip([0, *runs.tolist()], [*runs.tolist(), positions.size]):
        if lo == hi:
            continue
        shard_no = int(shard_nos[lo])
        keys = dataset.shard_index(shard_no).keys()
        for at in (positions[lo:hi] - starts[shard_no]).tolist():
            yield keys[at]
