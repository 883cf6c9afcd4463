"""One scan of a local shard, plain or compressed, as an index build or a check needs it.

:func:`scan_local_shard` is the scan that :func:`~.shard.build_index` indexes and
:func:`~.verify.verify_index` compares an index with (a remote object's is
:func:`~.remote.scan_object`): a plain tar through a read-only map
(:func:`scan_shard_file`), a gzip or zstd one decompressed into its frames or seek
points (:func:`~.decompress.scan_compressed`).
"""

from __future__ import annotations

from pathlib import Path

from ..source.local import mapped_file
from ..tar.scan import TarScan, scan_tar
from .decompress import CompressedScan, scan_compressed
from .meta import fingerprint
from .naming import Grouping, group_members
from .spans import spans_name_their_keys

__all__ = ["scan_local_shard", "scan_shard_file"]


def scan_local_shard(
    shard: Path, codec: str | None, *, ignore_zeros: bool, seek_spacing: int
) -> CompressedScan:
    """The scan of the local ``shard``, compressed with ``codec`` (``None``: a plain tar,
    whose scan has no layout and an ``uncompressed_size`` of 0)."""
    if codec is not None:
        return scan_compressed(shard, codec, ignore_zeros=ignore_zeros, seek_spacing=seek_spacing)
    scan, grouping, content_fingerprint, span_names = scan_shard_file(
        shard, ignore_zeros=ignore_zeros
    )
    return CompressedScan(scan, grouping, content_fingerprint, span_names, None, 0)


def scan_shard_file(
    shard: Path, *, ignore_zeros: bool = False
) -> tuple[TarScan, Grouping, str, bool]:
    """Scan a local shard through a read-only mmap: its members, grouped into samples,
    its fingerprint and whether every sample's span names its key
    (:mod:`indextar.index.spans`), from one map."""
    with mapped_file(shard) as (mm, fd, size):  # an empty file: scan_tar's error
        scan = scan_tar(mm, shard=str(shard), fd=fd, ignore_zeros=ignore_zeros)
        grouping = group_members(scan, shard=str(shard))
        named = spans_name_their_keys(mm, scan, grouping, shard=str(shard))
        return scan, grouping, fingerprint(mm, size), named
