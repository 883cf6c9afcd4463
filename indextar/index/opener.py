"""The one door to a shard: its index and its bytes, wherever the shard is.

:func:`open_shard` gives a shard's validated index and a byte source of its
uncompressed tar from its :class:`~indextar.source.location.ShardLocation` and the
:class:`OpenOptions`. Every reader (the dataset, its views, ``describe_sample``), the
tools (``info``, ``ls``, ``cat``, ``get``, ``verify``, ``meta import``, ``reshard``,
``export``) and the CLI open shards through it, or through its two halves,
:func:`find_index` and :func:`shard_source`.

A local shard's index is next to it or in ``index_dir``. A remote shard's is found as
:func:`~.remote.open_remote_index` finds it: in ``index_dir`` (by default
:func:`~.remote.default_index_dir`), else fetched from ``<url>.idx.sqlite`` beside the
object, else, with ``build_missing``, built by a scan; it is checked against the
object before use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MissingIndexError, ShardNotFoundError, StaleIndexError
from ..source.base import ByteSource
from ..source.cache import ShardCache
from ..source.location import ShardLocation, SourceOptions
from .arrays import decompressing_source
from .manifest import ManifestShard
from .remote import default_index_dir, open_remote_index
from .shard import PathLike, ShardIndex, build_index, open_index, open_index_at

__all__ = [
    "OpenOptions",
    "open_shard",
    "open_entry",
    "find_index",
    "shard_source",
    "open_entry_index",
    "open_shard_index",
    "usable_index",
]


@dataclass(frozen=True, slots=True)
class OpenOptions:
    """How shards are opened.

    Attributes
    ----------
    index_dir
        The folder of the indexes: ``None`` means next to a local shard, and
        :func:`~.remote.default_index_dir` for a remote one.
    source
        How a remote shard's bytes are read: storage options, ranges or the cache.
    build_missing
        Build a missing index (a local shard's by :func:`~.shard.build_index`, a
        remote one's by a scan) instead of raising :class:`MissingIndexError`.
    """

    index_dir: str | None = None
    source: SourceOptions = field(default_factory=SourceOptions)
    build_missing: bool = False

    @classmethod
    def make(
        cls,
        index_dir: PathLike | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache: ShardCache | None = None,
        build_missing: bool = False,
    ) -> OpenOptions:
        return cls(
            None if index_dir is None else os.fspath(index_dir),
            SourceOptions(dict(storage_options or {}), cache),
            build_missing,
        )

    @property
    def storage_options(self) -> Mapping[str, Any]:
        return self.source.storage_options


def open_shard(location: ShardLocation, options: OpenOptions) -> tuple[ShardIndex, ByteSource]:
    """The validated index of the shard at ``location`` and a source of its uncompressed
    tar bytes, every read checked against the version the index recorded. Raises as
    :func:`find_index` does."""
    index = find_index(location, options)
    return index, shard_source(index, options.source, location=location)


def open_entry(
    entry: ManifestShard, options: OpenOptions, *, number: int, manifest: PathLike | None
) -> tuple[ShardIndex, ByteSource]:
    """:func:`open_shard` of shard number ``number`` of a dataset (of ``manifest``, if
    read from one): its index is the one ``entry`` records, and is checked against it
    (:func:`open_entry_index`)."""
    location = ShardLocation.of(entry.url)
    index = open_entry_index(entry, options, number=number, manifest=manifest, location=location)
    return index, shard_source(index, options.source, location=location)


def find_index(
    location: ShardLocation, options: OpenOptions, *, recorded: PathLike | None = None
) -> ShardIndex:
    """Open and validate the index of the shard at ``location``: at ``recorded`` if
    given (a manifest records where it is), else where ``options.index_dir`` says.

    Raises
    ------
    MissingIndexError
        If the shard has no index (a URL's: neither in ``index_dir`` nor beside it),
        and ``options.build_missing`` is false or the index is recorded elsewhere.
    StaleIndexError
        If the shard, or the remote object, changed since it was indexed.
    ShardNotFoundError, IndexFormatError
        As :func:`~.shard.open_index`.
    """
    if location.remote:
        if recorded is not None and Path(recorded).exists():  # no request: checked on read
            return ShardIndex.unchecked(location.name, Path(recorded))
        folder = default_index_dir() if options.index_dir is None else options.index_dir
        return open_remote_index(
            location.name,
            index_dir=folder,
            storage_options=options.storage_options,
            build_missing=options.build_missing,
        )
    if recorded is not None:
        return open_index_at(location.name, recorded)
    try:
        return open_index(location.name, index_dir=options.index_dir)
    except MissingIndexError:
        if not options.build_missing:
            raise
        return build_index(location.name, index_dir=options.index_dir)


def shard_source(
    index: ShardIndex,
    options: SourceOptions | None = None,
    *,
    location: ShardLocation | None = None,
) -> ByteSource:
    """The uncompressed tar bytes of the shard ``index`` describes (a local file or a
    remote object, ``location`` if known), every read checked against the version the
    index recorded."""
    location = location or index.location
    meta = index.meta
    raw = location.open_raw(meta, options)
    if not meta.compression:  # plain shards keep their raw source
        return raw
    local_path = None if location.remote else location.name
    return decompressing_source(index.path, meta, raw, local_path=local_path)


def open_entry_index(
    entry: ManifestShard,
    options: OpenOptions,
    *,
    number: int,
    manifest: PathLike | None,
    location: ShardLocation | None = None,
) -> ShardIndex:
    """Open and validate the index of shard ``number`` of a dataset, and check it against
    the dataset's entry.

    The index is the one the entry records, else found by ``options.index_dir``. A
    missing index is built if ``options.build_missing`` and the entry records none (a
    remote shard's, also where the recorded one is gone). ``manifest`` names the
    entries' manifest in errors.

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
        index = find_index(location or ShardLocation.of(entry.url), options, recorded=entry.index)
    except ShardNotFoundError as e:
        raise ShardNotFoundError(
            f"shard {entry.url!r} (number {number} of the dataset) no longer exists: {e}"
        ) from e
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


def open_shard_index(
    shard: PathLike,
    *,
    index_dir: PathLike | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> ShardIndex:
    """:func:`find_index` of ``shard``, a local path or a URL; never builds it.

    ``index_dir`` is the folder of the indexes: for a local shard, ``None`` means next
    to it; for a URL, :func:`~.remote.default_index_dir`. ``storage_options`` go to
    fsspec (``None``: credentials from the environment, as fsspec's backends take them).
    """
    options = OpenOptions.make(index_dir, storage_options=storage_options)
    return find_index(ShardLocation.of(shard), options)


def usable_index(shard: PathLike, *, index_dir: PathLike | None = None) -> ShardIndex:
    """The index of ``shard``: a local shard's is built if missing or unusable
    (:func:`~.shard.build_index`); a URL's must exist (``indextar index`` or
    ``build_indexes`` builds it). What the tools that copy or export shards read."""
    location = ShardLocation.of(shard)
    if location.remote:
        return find_index(location, OpenOptions.make(index_dir))
    return build_index(location.name, index_dir=index_dir)
