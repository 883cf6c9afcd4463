"""Decompressing a gzip or zstd shard once, to index the tar inside.

The whole file is decompressed and checked (each gzip member's CRC and length, each
zstd frame's checksum where it has one): a truncated stream or a corrupt block is an
error naming the shard and the compressed byte offset, never a shorter index. What
random access will need is recorded on the way (:class:`~.arrays.CompressedLayout`):

* a file of several gzip members or zstd frames, none larger than ``4 * seek_spacing``
  uncompressed (per-sample shards, ``.tar.zst`` from ``zstd --seekable``-style writers):
  every frame's span;
* a single-stream ``.tar.gz`` (``tar czf``, webdataset's ``.tgz``): zran seek points
  every ``seek_spacing`` bytes, placed by ``_gunzip.c`` in the same pass that
  decompresses and checks the file (where it is not built, by
  :func:`~indextar.source.seekpoints.build_seek_points` in a second pass), their windows
  made sparse on a second thread as the pass goes;
* a ``.tar.zst`` of one frame is refused: zstd cannot resume inside a frame, so it is
  read from the front only (streaming) or converted (``indextar recompress``).

The decompressed tar is held in memory while it is scanned.
"""

from __future__ import annotations

import logging
import shlex
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import cast

import numpy as np
import numpy.typing as npt

from ..errors import CompressedShardError, ShardFormatError, TruncatedShardError
from ..source import extensions
from ..source.codecs import decompress_frame
from ..source.local import mapped_file
from ..source.seekpoints import MIN_SPACING, SeekPoints, build_seek_points
from ..tar.compress import zstd_frame_spans
from ..tar.scan import TarScan, scan_tar
from .arrays import CompressedLayout
from .checksums import span_checksums
from .meta import fingerprint
from .naming import Grouping, group_members
from .spans import spans_name_their_keys
from .tables import sample_spans

__all__ = ["DEFAULT_SEEK_SPACING", "CompressedScan", "decompress_shard", "scan_compressed"]

log = logging.getLogger(__name__)

Frames = list[tuple[int, int, int, int]]
"""``(compressed_offset, compressed_size, uncompressed_offset, uncompressed_size)`` rows."""

DEFAULT_SEEK_SPACING = 1 << 17
"""Uncompressed bytes between seek points: a sample-sized read decompresses 64 KiB on
average before its first byte (ratarmount's 16 MiB spacing costs 128 times that). The
windows are sparse (:meth:`~indextar.source.seekpoints.SeekPoints.from_decompressed`), so
the index of the bench's 253 MB JPEG tar holds 3.5 MB of them at this spacing, where
whole windows took 5 MB at 1 MiB."""


@dataclass(frozen=True, slots=True)
class CompressedScan:
    """What an index build needs of a compressed shard, from one decompression (or of a
    plain tar, from a remote object's scan: no ``layout``, an ``uncompressed_size`` of 0)."""

    scan: TarScan
    grouping: Grouping
    fingerprint: str
    """The compressed file's :func:`~indextar.index.meta.fingerprint`."""
    span_names: bool
    """Whether every sample's span names its key (:mod:`indextar.index.spans`)."""
    layout: CompressedLayout | None
    uncompressed_size: int
    """The decompressed tar's size."""
    checksums: npt.NDArray[np.uint64] | None = None
    """Each sample's checksum of its uncompressed span, where the scan was asked for them."""


def scan_compressed(
    shard: Path, codec: str, *, ignore_zeros: bool, seek_spacing: int, checksum: str = ""
) -> CompressedScan:
    """What ``build_index`` needs of a compressed shard: the tar's scan and grouping, the
    file's fingerprint, whether spans name their keys, the layout and the tar's size.

    Errors in the tar itself give offsets into the decompressed tar, and say so.
    """
    with mapped_file(shard) as (mm, _, size):
        content_fingerprint = fingerprint(mm, size)
        data, layout = decompress_shard(
            memoryview(mm), codec, shard=shard, seek_spacing=seek_spacing
        )
    try:
        scan = scan_tar(data, shard=str(shard), ignore_zeros=ignore_zeros)
        grouping = group_members(scan, shard=str(shard))
    except ShardFormatError as e:
        e.args = (f"{e} (an offset in the decompressed tar)",)
        raise
    # a bytearray reads as bytes do; cast rather than copy the whole tar
    named = spans_name_their_keys(cast(bytes, data), scan, grouping, shard=str(shard))
    checksums = None
    if checksum:
        checksums = span_checksums(data, *sample_spans(scan, grouping), checksum)
    return CompressedScan(scan, grouping, content_fingerprint, named, layout, len(data), checksums)


def decompress_shard(
    buf: memoryview, codec: str, *, shard: Path, seek_spacing: int = DEFAULT_SEEK_SPACING
) -> tuple[bytearray, CompressedLayout]:
    """The decompressed tar of the compressed file ``buf`` at ``shard``, and its layout."""
    # One pass where _gunzip.c is built: zlib decompresses and checks, the points are
    # placed on the way and their windows made on a second thread. The reference: zlib's
    # checked pass, then zran's to place the points (zran alone does not notice a
    # truncated file; the two passes in two threads were slower on this 2-core machine
    # under load: 1.4-1.9 s against 0.8-1.0 s a 100 MB).
    gunzip = extensions.gunzip() if codec == "gzip" else None
    rows: list[tuple[int, int, int, int]] | None = None
    windows: list[bytes] | None = None
    if gunzip is not None:
        data, frames, rows, windows = _gunzip_one_pass(gunzip, buf, str(shard), seek_spacing)
    elif codec == "gzip":
        data, frames = _gunzip_members(buf, str(shard))
    else:
        data, frames = _unzstd_frames(buf, str(shard))
    framed = len(frames) > 1 and max(row[3] for row in frames) <= 4 * seek_spacing
    if framed or codec == "zstd":  # zstd: one frame was refused before decompressing
        return data, CompressedLayout(codec, frames=np.array(frames, np.int64).reshape(-1, 4))
    spacing = max(seek_spacing, MIN_SPACING)
    if rows is not None and windows is not None:  # _gunzip.c gave both
        points = SeekPoints.from_decompressed(
            rows, data, compressed_size=len(buf), spacing=spacing, made=windows, compressed=buf
        )
        return data, CompressedLayout(codec, seek_points=points)
    points = build_seek_points(str(shard), spacing=seek_spacing)
    if points.uncompressed_size != len(data):
        raise ShardFormatError(
            f"zran found {points.uncompressed_size} uncompressed bytes, zlib {len(data)}",
            shard=str(shard),
        )
    return data, CompressedLayout(codec, seek_points=points)


def _single_frame_message(shard: str) -> str:
    quote = shlex.quote
    framed = (
        shard[: -len(".tar.zst")] + "-framed.tar.zst"
        if shard.endswith(".tar.zst")
        else (shard + ".framed")
    )
    return (
        "shard is one zstd frame: zstd cannot start reading inside a frame, so random access "
        "needs a shard of many small frames; read this one from the front "
        "(StreamingTarDataset) or convert it: indextar recompress "
        f"{quote(shard)} {quote(framed)}"
    )


def _gunzip_members(buf: memoryview, shard: str) -> tuple[bytearray, Frames]:
    """Every gzip member decompressed and checked, and its spans."""
    size = len(buf)
    out = bytearray()
    frames: Frames = []
    pos = 0
    while pos < size:
        start, u_start = pos, len(out)
        decompressor = zlib.decompressobj(wbits=31)
        chunk = 4096  # grows: a small member's unused_data copies little
        while not decompressor.eof:
            if pos >= size:
                raise TruncatedShardError(
                    f"the compressed shard is truncated: it ends inside the gzip member that "
                    f"starts at compressed byte offset {start}",
                    shard=shard,
                    offset=start,
                )
            try:
                out += decompressor.decompress(buf[pos : pos + chunk])
            except zlib.error as e:
                raise ShardFormatError(
                    f"corrupt gzip data in the member that starts at compressed byte offset "
                    f"{start}, within bytes [{pos}, {min(size, pos + chunk)}) ({e})",
                    shard=shard,
                    offset=pos,
                ) from e
            pos += min(chunk, size - pos)
            chunk = min(chunk * 2, 1 << 20)
        pos -= len(decompressor.unused_data)
        frames.append((start, pos - start, u_start, len(out) - u_start))
    return out, frames


def _gunzip_one_pass(
    gunzip: ModuleType, buf: memoryview, shard: str, seek_spacing: int
) -> tuple[bytearray, Frames, list[tuple[int, int, int, int]], list[bytes]]:
    """:func:`_gunzip_members`, the seek points and their sparse windows in one pass,
    by ``_gunzip.c``, with the same errors."""
    data, frames, rows, error, windows = gunzip.gunzip(buf, max(seek_spacing, MIN_SPACING), 1)
    if error is not None:
        kind, start, chunk_start, chunk_end, message = error
        if kind == "truncated":
            raise TruncatedShardError(
                f"the compressed shard is truncated: it ends inside the gzip member that "
                f"starts at compressed byte offset {start}",
                shard=shard,
                offset=start,
            )
        at = max(start, chunk_start)  # a chunk may start in the member before
        raise ShardFormatError(
            f"corrupt gzip data in the member that starts at compressed byte offset "
            f"{start}, within bytes [{at}, {chunk_end}) ({message})",
            shard=shard,
            offset=at,
        )
    return data, frames, rows, windows


def _unzstd_frames(buf: memoryview, shard: str) -> tuple[bytearray, Frames]:
    """Every zstd data frame decompressed and checked, and its spans."""
    out = bytearray()
    frames: Frames = []
    spans = zstd_frame_spans(buf, shard=shard)
    if sum(is_data for _, _, is_data in spans) == 1:
        raise CompressedShardError(_single_frame_message(shard), shard=shard)
    for start, length, is_data in spans:
        if is_data:
            u_start = len(out)
            out += decompress_frame("zstd", buf[start : start + length], shard=shard, offset=start)
            frames.append((start, length, u_start, len(out) - u_start))
    return out, frames
