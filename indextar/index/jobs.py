"""One shard's build as a job: its options in, a small picklable outcome out.

:func:`build_shard` is what runs in a worker, wherever the executor puts it (a
process pool, a Dask cluster): it indexes one local or remote shard, writes the index
where it belongs (next to the shard, in ``index_dir``, or uploaded next to a remote
shard) and sends back counts and any error as text, never the index's contents.

Which shards need no job at all is :mod:`indextar.index.fresh`'s question.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import IndexFormatError, IndextarError, MissingIndexError, StaleIndexError
from ..source.location import ShardLocation
from .meta_cache import cache_meta
from .options import BuildOptions
from .remote import (
    open_remote_index,
    refuse_stale_rebuild,
    remote_index_path,
    scan_remote_shard,
    upload_index,
)
from .shard import ShardIndex, build_index_as, index_path

__all__ = ["BuildOptions", "ShardOutcome", "build_shard", "build_shards"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShardOutcome:
    """What became of one shard: small enough to send back from any worker.

    Attributes
    ----------
    shard
        The shard's path or URL.
    index
        The opened index (its path and metadata), or ``None`` if the shard failed.
    built
        Whether an index was written (``False``: a valid one was reused).
    seconds
        Time spent on this shard in its worker.
    scan
        How it was read: ``"local"``, ``"stream"``, ``"ranged"``, or ``""`` if reused.
    bytes_fetched
        Bytes read from a remote shard's object store.
    uploaded
        Where the index was uploaded, with ``upload``.
    error, error_type, traceback
        The failure, as text, if the shard failed.
    """

    shard: str
    index: ShardIndex | None = None
    built: bool = False
    seconds: float = 0.0
    scan: str = ""
    bytes_fetched: int = 0
    uploaded: str | None = None
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def summary(self) -> dict[str, Any]:
        """The outcome as JSON-ready fields."""
        result: dict[str, Any] = {"shard": self.shard, "ok": self.ok}
        if self.index is not None:
            meta = self.index.meta
            result.update(
                index=str(self.index.path),
                built=self.built,
                samples=meta.num_samples,
                members=meta.num_members,
                bytes=meta.shard_size,
                seconds=round(self.seconds, 6),
                scan=self.scan,
                bytes_fetched=self.bytes_fetched,
            )
            if self.uploaded is not None:
                result["uploaded"] = self.uploaded
        else:
            result.update(error=self.error, error_type=self.error_type)
        return result


def build_shard(shard: str, options: BuildOptions) -> ShardOutcome:
    """Index ``shard`` (unless a valid index exists) as ``options`` say; never raises."""
    start = time.perf_counter()
    try:
        location = ShardLocation.of(shard)
        build = _build_remote if location.remote else _build_local
        outcome = build(shard, options)
    except Exception as e:  # noqa: BLE001 - reported per shard; the others still run
        message = str(e) if isinstance(e, (IndextarError, OSError)) else f"{type(e).__name__}: {e}"
        return ShardOutcome(
            shard,
            seconds=time.perf_counter() - start,
            error=message or type(e).__name__,
            error_type=type(e).__name__,
            traceback=traceback.format_exc(),
        )
    return replace(outcome, seconds=time.perf_counter() - start)


def build_shards(shards: list[str], options: BuildOptions) -> list[ShardOutcome]:
    """:func:`build_shard` of each of ``shards``, in one job."""
    return [build_shard(shard, options) for shard in shards]


def _build_local(shard: str, options: BuildOptions) -> ShardOutcome:
    if options.upload:
        raise IndextarError(f"upload is for remote shards; {shard!r} is a local file")
    before = _identity(index_path(shard, index_dir=options.index_dir))
    index = build_index_as(shard, options)
    # A rebuilt index is a new file (renamed into place), so a new inode.
    built = before is None or before != _identity(index.path)
    if built:
        cache_meta(index.path, index.meta)
    return ShardOutcome(shard, index, built=built, scan="local" if built else "")


def _build_remote(url: str, options: BuildOptions) -> ShardOutcome:
    if options.ignore_zeros:
        raise IndextarError(f"ignore_zeros is for local shards; {url!r} is remote")
    if options.meta is not None:
        raise IndextarError(f"meta is for local shards; {url!r} is remote")
    if options.checksums:
        raise IndextarError(
            f"checksums are recorded from local shards; {url!r} is remote (index a local "
            "copy with build_index(..., checksums=True) and serve its index next to the "
            "shard, or write it with TarWriter(..., checksums=True))"
        )
    if options.index_dir is None:
        raise IndextarError(f"a remote shard needs index_dir= for its index; {url!r} is remote")
    folder = Path(options.index_dir)
    index: ShardIndex | None = None
    if not options.force and remote_index_path(url, folder).exists():
        try:
            index = open_remote_index(
                url, index_dir=folder, storage_options=options.storage_options, build_missing=False
            )
        except (MissingIndexError, StaleIndexError, IndexFormatError) as e:
            if isinstance(e, StaleIndexError):
                refuse_stale_rebuild(url, remote_index_path(url, folder))
            log.info("rebuilding the index of %s: %s", url, e)
    if index is not None:
        outcome = ShardOutcome(url, index)
    else:
        build = scan_remote_shard(
            url,
            index_dir=folder,
            storage_options=options.storage_options,
            mode=options.remote_mode,
            seek_spacing=options.seek_spacing,
        )
        cache_meta(build.index.path, build.index.meta)
        outcome = ShardOutcome(
            url, build.index, built=True, scan=build.mode, bytes_fetched=build.bytes_fetched
        )
    if options.upload:
        assert outcome.index is not None
        uploaded = upload_index(outcome.index, storage_options=options.storage_options)
        outcome = replace(outcome, uploaded=uploaded)
    return outcome


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns
