"""The index of a remote ``.tar.gz`` or ``.tar.zst``, built from a temporary download.

A compressed object cannot be scanned by ranged reads of its headers, and its seek
points are placed by zran, which reads a file: the object is copied once into a
hidden temporary file next to the index (every read conditional on the version first
seen), indexed as a local compressed shard is (:mod:`.decompress`), and deleted. The
index records the object's URL, size and ETag, as any remote index does.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..atomic import create_temp
from ..errors import ShardFormatError
from ..source.conditional import RemoteStat
from ..source.remote import RangeSource
from .decompress import DEFAULT_SEEK_SPACING, scan_compressed
from .meta import IndexMeta
from .shard import ShardIndex
from .tables import write_index

__all__ = ["index_compressed_object"]

log = logging.getLogger(__name__)

_CHUNK = 8 << 20


def index_compressed_object(
    url: str,
    source: RangeSource,
    stat: RemoteStat,
    codec: str,
    local: Path,
    *,
    seek_spacing: int = DEFAULT_SEEK_SPACING,
) -> ShardIndex:
    """Index the compressed object ``url`` (read through ``source``, pinned to ``stat``)
    into the index file ``local``."""
    fd, tmp = create_temp(local)
    try:
        with os.fdopen(fd, "wb") as f:
            for offset in range(0, stat.size, _CHUNK):
                f.write(source.read(offset, min(_CHUNK, stat.size - offset)))
        log.info("indexing %s from a %d-byte temporary copy", url, stat.size)
        try:
            compressed = scan_compressed(tmp, codec, ignore_zeros=False, seek_spacing=seek_spacing)
        except ShardFormatError as e:  # name the object, not the temporary copy
            e.args = (str(e).replace(str(tmp), url),)
            e.shard = url
            raise
    finally:
        tmp.unlink(missing_ok=True)
    meta = IndexMeta.describe(
        compressed.scan,
        compressed.grouping,
        shard_name=url,
        shard_size=stat.size,
        shard_mtime_ns=0,
        fingerprint=compressed.fingerprint,
        etag=stat.etag,
        span_names=compressed.span_names,
        compression=codec,
        uncompressed_size=compressed.uncompressed_size,
        seek_spacing=compressed.layout.seek_spacing,
    )
    write_index(local, meta, compressed.scan, compressed.grouping, layout=compressed.layout)
    return ShardIndex(shard=url, path=local, meta=meta)
