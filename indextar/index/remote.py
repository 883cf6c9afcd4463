"""Indexes of remote shards: found next to the shard, kept in ``index_dir``, or built once.

The index of ``<url>`` is looked for, in order:

1. in ``index_dir`` (a local folder), under the shard's name plus a hash of its URL;
2. next to the shard as ``<url>.idx.sqlite``, which is downloaded into ``index_dir``;
3. nowhere: the shard is scanned as it streams past (or its headers alone are read,
   for large members), and the index is written into ``index_dir``; no copy of the
   shard touches the disk.

Every index is checked against the object before use: size and ETag, or, where the
server gives no ETag, the content fingerprint (two ranged reads of 64 KiB).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..errors import IndexFormatError, MissingIndexError, StaleIndexError
from ..source.conditional import RemoteStat, check_version
from ..source.filesystems import filesystem
from ..source.forward import ForwardReader, ScanMode
from ..source.location import ShardLocation
from ..source.remote import DEFAULT_RETRY, RangeSource, with_retries
from ..tar.streamscan import StreamedBytes, scan_stream
from .decompress import DEFAULT_SEEK_SPACING, CompressedScan
from .meta import FINGERPRINT_SPAN, IndexMeta, fingerprint_parts, read_meta
from .naming import group_members
from .remote_compressed import scan_compressed_object
from .shard import INDEX_SUFFIX, ShardIndex, refuse_to_drop_imports
from .spans import headers_name_their_keys
from .tables import index_lock, write_index

__all__ = [
    "RemoteBuild",
    "default_cache_root",
    "default_index_dir",
    "remote_index_path",
    "open_remote_index",
    "build_remote_index",
    "scan_remote_shard",
    "ObjectScan",
    "scan_object",
    "upload_index",
    "refuse_stale_rebuild",
]

log = logging.getLogger(__name__)


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/indextar`` (``~/.cache/indextar``): remote indexes and shards."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "indextar"


def default_index_dir() -> Path:
    """Where remote shards' indexes are kept when no ``index_dir`` is given."""
    return default_cache_root() / "indexes"


def remote_index_path(url: str, index_dir: str | os.PathLike[str]) -> Path:
    """Where the local copy of ``url``'s index lives in ``index_dir``."""
    return ShardLocation.of(url).index_path(index_dir)


def expected_stat(meta: IndexMeta) -> RemoteStat:
    """The object version an index was built for."""
    return RemoteStat(meta.shard_size, meta.etag)


def _check(meta: IndexMeta, source: RangeSource, path: Path) -> None:
    now = source.stat()
    check_version(
        source.url,
        expected_stat(meta),
        now,
        index=str(path),
        remedy=f"build_missing=True or `indextar index {source.url}` rebuilds it",
        content_matches=lambda: _remote_fingerprint(source, now.size) == meta.fingerprint,
    )


def _remote_fingerprint(source: RangeSource, size: int) -> str:
    tail_start = max(0, size - FINGERPRINT_SPAN)
    head, tail = source.read_many([0, tail_start], [min(size, FINGERPRINT_SPAN), size - tail_start])
    return fingerprint_parts(size, head, tail)


def open_remote_index(
    url: str,
    *,
    index_dir: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    build_missing: bool = True,
) -> ShardIndex:
    """Find, fetch or build the index of the remote shard ``url``; validated.

    Raises
    ------
    MissingIndexError
        If there is no index and ``build_missing`` is false.
    StaleIndexError
        If the only index there is no longer matches the object (and ``build_missing``
        is false).
    """
    local = remote_index_path(url, index_dir)
    source = RangeSource(url, storage_options=storage_options)
    if local.exists() or _fetch_sidecar(url, local, storage_options):
        try:
            meta = read_meta(local)
            _check(meta, source, local)
            return ShardIndex(shard=url, path=local, meta=meta)
        except (StaleIndexError, IndexFormatError) as e:
            if not build_missing:
                raise
            if isinstance(e, StaleIndexError):
                refuse_stale_rebuild(url, local)
            log.warning("rebuilding the index of %s: %s", url, e)
    if not build_missing:
        raise MissingIndexError(
            f"remote shard {url!r} has no index (looked in {str(local)!r} and at "
            f"{url + INDEX_SUFFIX!r})",
            [url],
            "build it with build_indexes() or build_missing=True",
        )
    return build_remote_index(url, index_dir=index_dir, storage_options=storage_options)


def refuse_stale_rebuild(url: str, local: Path) -> None:
    """Refuse to replace ``url``'s stale index ``local`` by a scan if it holds imported
    columns, which the object cannot give back: a :class:`StaleIndexError` (raised while
    handling the one that found it stale, which says what changed)."""
    refuse_to_drop_imports(
        ShardIndex(shard=url, path=local, meta=read_meta(local)),
        f"{url!r} changed since it was indexed",
        remedy=f"build_remote_index({url!r}, index_dir=...) (`indextar index --force {url}`)",
        error=StaleIndexError,
    )


def _fetch_sidecar(url: str, local: Path, storage_options: Mapping[str, Any] | None) -> bool:
    """Download ``<url>.idx.sqlite`` to ``local``; whether there was one."""
    fs, path = filesystem(url + INDEX_SUFFIX, storage_options)
    try:
        data = with_retries(
            lambda: fs.cat_file(path),
            DEFAULT_RETRY,
            url=url + INDEX_SUFFIX,
            offset=None,
            length=None,
        )
    except FileNotFoundError:  # ShardNotFoundError from with_retries: no sidecar
        return False
    with index_lock(local):
        write_atomic(local, data)
    log.info("fetched the index of %s from %s", url, url + INDEX_SUFFIX)
    return True


@dataclass(frozen=True, slots=True)
class RemoteBuild:
    """A remote shard's index as built, and what building it fetched.

    ``mode`` is how the shard was read: ``"stream"`` (every byte, once),
    ``"ranged"`` (its headers alone) or, for a gzip or zstd object, ``"download"`` (a
    temporary copy, :mod:`.remote_compressed`); ``bytes_fetched`` counts the bytes read.
    """

    index: ShardIndex
    mode: str
    bytes_fetched: int


def build_remote_index(
    url: str,
    *,
    index_dir: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    mode: ScanMode = "auto",
    seek_spacing: int = DEFAULT_SEEK_SPACING,
) -> ShardIndex:
    """Scan ``url`` as it streams (or its headers by ranged reads) into an index in
    ``index_dir``; no copy of the shard is written. See :func:`scan_remote_shard`."""
    return scan_remote_shard(
        url,
        index_dir=index_dir,
        storage_options=storage_options,
        mode=mode,
        seek_spacing=seek_spacing,
    ).index


def scan_remote_shard(
    url: str,
    *,
    index_dir: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    mode: ScanMode = "auto",
    seek_spacing: int = DEFAULT_SEEK_SPACING,
) -> RemoteBuild:
    """Build the index of ``url`` in ``index_dir`` from one forward read of the object.

    ``mode="stream"`` reads every byte once, in order; ``"ranged"`` reads the headers
    alone, jumping over member data; ``"auto"`` chooses from the first headers
    (:class:`~indextar.source.forward.ForwardReader`). Either way the members, and
    any error, are :func:`~indextar.tar.scan.scan_tar`'s, and every read is
    conditional on the object's first version. ``seek_spacing`` is
    :func:`~indextar.build_index`'s, for a single-stream ``.tar.gz``.
    """
    local = remote_index_path(url, index_dir)
    local.parent.mkdir(parents=True, exist_ok=True)
    stat = RangeSource(url, storage_options=storage_options).stat()
    read = scan_object(
        url,
        stat,
        scratch=local,
        storage_options=storage_options,
        mode=mode,
        seek_spacing=seek_spacing,
    )
    scanned, layout = read.scanned, read.scanned.layout
    meta = IndexMeta.describe(
        scanned.scan,
        scanned.grouping,
        shard_name=url,
        shard_size=stat.size,
        shard_mtime_ns=0,
        fingerprint=scanned.fingerprint,
        etag=stat.etag,
        span_names=scanned.span_names,
        compression=layout.codec if layout is not None else "",
        uncompressed_size=scanned.uncompressed_size,
        seek_spacing=layout.seek_spacing if layout is not None else 0,
    )
    with index_lock(local):
        write_index(local, meta, scanned.scan, scanned.grouping, layout=layout)
    fetched = read.bytes_fetched
    log.info("indexed %s: %s scan, %d of %d bytes fetched", url, read.mode, fetched, stat.size)
    return RemoteBuild(ShardIndex(shard=url, path=local, meta=meta), read.mode, fetched)


@dataclass(frozen=True, slots=True)
class ObjectScan:
    """One read of a remote object, as an index build (or a verification) needs it.

    ``scanned`` is what a local build would have of it (its ``layout`` a ``.tar.gz``'s
    or ``.tar.zst``'s frames or seek points, ``None`` for a plain tar); ``mode`` and
    ``bytes_fetched`` are as :class:`RemoteBuild`'s.
    """

    scanned: CompressedScan
    mode: str
    bytes_fetched: int


def scan_object(
    url: str,
    stat: RemoteStat,
    *,
    scratch: Path,
    storage_options: Mapping[str, Any] | None = None,
    mode: ScanMode = "auto",
    seek_spacing: int = DEFAULT_SEEK_SPACING,
) -> ObjectScan:
    """Scan the object ``url``, every read conditional on its version ``stat``: a plain
    tar in one forward read (``mode``), a gzip or zstd one from a temporary copy made
    beside the file ``scratch`` (:mod:`.remote_compressed`)."""
    source = RangeSource(url, expected=stat, storage_options=storage_options)
    location = ShardLocation.of(url)
    codec = location.codec(source)
    if codec is not None:  # .tar.gz, .tar.zst: from a temporary copy
        packed = scan_compressed_object(
            url, source, stat, codec, scratch, seek_spacing=seek_spacing
        )
        return ObjectScan(packed, "download", stat.size)
    log.info("scanning %s (%d bytes) in one forward read", url, stat.size)
    with ForwardReader(source, mode=mode) as reader:
        view = StreamedBytes(
            reader, stat.size, shard=url, edges=FINGERPRINT_SPAN, remote=location.remote
        )
        scan = scan_stream(view)
        grouping = group_members(scan, shard=url)
        span_names = headers_name_their_keys(view.read, scan, grouping, shard=url)
        view.finish()
        content_fingerprint = fingerprint_parts(stat.size, view.head(), view.tail())
        scanned = CompressedScan(scan, grouping, content_fingerprint, span_names, None, 0)
        return ObjectScan(scanned, reader.mode, reader.bytes_fetched)


def upload_index(index: ShardIndex, *, storage_options: Mapping[str, Any] | None = None) -> str:
    """Put ``index`` next to its remote shard as ``<url>.idx.sqlite``; return that URL."""
    target = index.shard + INDEX_SUFFIX
    fs, path = filesystem(target, storage_options)
    fs.put_file(str(index.path), path)
    return target
