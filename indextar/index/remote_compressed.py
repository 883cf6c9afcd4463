"""The scan of a remote ``.tar.gz`` or ``.tar.zst`` for its index, from a temporary download.

A compressed object cannot be scanned by ranged reads of its headers, and its seek
points are placed by zran, which reads a file: the object is copied once into a
hidden temporary file next to the index (every read conditional on the version first
seen), indexed as a local compressed shard is (:mod:`.decompress`), and deleted. Its
index (:func:`~.remote.scan_remote_shard`) records the object's URL, size and ETag, as
any remote index does.

A ``.tar.zst`` of one zstd frame, which a local index build refuses, is indexed here
too: its tar is decompressed into a second temporary file and scanned as a plain
shard, and its index records the one frame. ``remote="cache"`` reads it from a
decompressed copy in the shard cache; ranged reads refuse it
(:class:`~indextar.source.frames.FramedSource`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..atomic import create_temp
from ..errors import ShardFormatError
from ..source.codecs import decompressed_stream
from ..source.conditional import RemoteStat
from ..source.local import mapped_file
from ..source.remote import RangeSource
from ..tar.compress import zstd_frame_spans
from .arrays import CompressedLayout
from .decompress import DEFAULT_SEEK_SPACING, CompressedScan, scan_compressed
from .localscan import scan_shard_file
from .meta import fingerprint

__all__ = ["scan_compressed_object"]

log = logging.getLogger(__name__)

_CHUNK = 8 << 20


def scan_compressed_object(
    url: str,
    source: RangeSource,
    stat: RemoteStat,
    codec: str,
    scratch: Path,
    *,
    seek_spacing: int = DEFAULT_SEEK_SPACING,
) -> CompressedScan:
    """Scan the compressed object ``url`` (read through ``source``, pinned to ``stat``)
    from a temporary copy beside the file ``scratch`` (the index it is for)."""
    fd, tmp = create_temp(scratch)
    try:
        with os.fdopen(fd, "wb") as f:
            for offset in range(0, stat.size, _CHUNK):
                f.write(source.read(offset, min(_CHUNK, stat.size - offset)))
        log.info("scanning %s from a %d-byte temporary copy", url, stat.size)
        with _naming(url, tmp):
            if codec == "zstd" and (one := _only_zstd_frame(tmp, url)) is not None:
                return _scan_one_frame(url, tmp, *one, scratch)
            return scan_compressed(tmp, codec, ignore_zeros=False, seek_spacing=seek_spacing)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _naming(url: str, *copies: Path) -> Iterator[None]:
    """Errors raised inside name the object ``url``, not its temporary ``copies``."""
    try:
        yield
    except ShardFormatError as e:
        message = str(e)
        for copy in copies:
            message = message.replace(str(copy), url)
        e.args = (message,)
        e.shard = url
        raise


def _only_zstd_frame(copy: Path, url: str) -> tuple[tuple[int, int], str] | None:
    """``(offset, size)`` of the zstd file's data frame and the file's fingerprint if it
    has only one data frame, else ``None``."""
    with mapped_file(copy) as (mm, _, size):
        spans = zstd_frame_spans(mm, shard=url)
        data = [(offset, length) for offset, length, is_data in spans if is_data]
        return (data[0], fingerprint(mm, size)) if len(data) == 1 else None


def _scan_one_frame(
    url: str, copy: Path, frame: tuple[int, int], content_fingerprint: str, local: Path
) -> CompressedScan:
    """What :func:`~.decompress.scan_compressed` gives, for a ``.tar.zst`` of one frame
    (which it refuses): its tar decompressed into a second temporary file and scanned as
    a plain shard; the layout is the one frame, the fingerprint the compressed copy's."""
    fd, plain = create_temp(local)
    try:
        with open(copy, "rb") as raw, os.fdopen(fd, "wb") as out:
            with decompressed_stream(raw, "zstd", shard=url) as stream:
                shutil.copyfileobj(stream, out, _CHUNK)
        with _naming(url, plain):
            try:
                scan, grouping, _, span_names = scan_shard_file(plain)
            except ShardFormatError as e:
                e.args = (f"{e} (an offset in the decompressed tar)",)
                raise
        plain_size = plain.stat().st_size
    finally:
        plain.unlink(missing_ok=True)
    log.info("%s is one zstd frame: %d bytes decompressed", url, plain_size)
    layout = CompressedLayout("zstd", frames=np.array([[*frame, 0, plain_size]], np.int64))
    return CompressedScan(scan, grouping, content_fingerprint, span_names, layout, plain_size)
