"""One scan of a local shard, plain or compressed, as an index build or a check needs it.

:func:`scan_local_shard` is the scan that :func:`~.shard.build_index` indexes and
:func:`~.verify.verify_index` compares an index with (a remote object's is
:func:`~.remote.scan_object`): a plain tar through a read-only map
(:func:`scan_shard_file`), a gzip or zstd one decompressed into its frames or seek
points (:func:`~.decompress.scan_compressed`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..source.local import mapped_file
from ..tar.scan import TarScan, scan_tar
from .checksums import span_checksums
from .decompress import CompressedScan, scan_compressed
from .meta import fingerprint
from .naming import Grouping, group_members
from .spans import spans_name_their_keys
from .tables import sample_spans

__all__ = ["scan_local_shard", "scan_shard_file"]


def scan_local_shard(
    shard: Path, codec: str | None, *, ignore_zeros: bool, seek_spacing: int, checksum: str = ""
) -> CompressedScan:
    """The scan of the local ``shard``, compressed with ``codec`` (``None``: a plain tar,
    whose scan has no layout and an ``uncompressed_size`` of 0), with each sample's
    ``checksum`` (an algorithm of :mod:`.checksums`) if one is named."""
    if codec is not None:
        return scan_compressed(
            shard, codec, ignore_zeros=ignore_zeros, seek_spacing=seek_spacing, checksum=checksum
        )
    scan, grouping, content_fingerprint, span_names = scan_shard_file(
        shard, ignore_zeros=ignore_zeros
    )
    sums = _file_checksums(shard, scan, grouping, checksum) if checksum else None
    return CompressedScan(scan, grouping, content_fingerprint, span_names, None, 0, sums)


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


def _file_checksums(
    shard: Path, scan: TarScan, grouping: Grouping, algorithm: str
) -> npt.NDArray[np.uint64]:
    """Each sample's checksum, hashed from a map of the local plain tar ``shard``."""
    with mapped_file(shard) as (mm, _, _):
        return span_checksums(mm, *sample_spans(scan, grouping), algorithm)
