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

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MissingIndexError, ShardNotFoundError, StaleIndexError
from ..source.base import ByteSource
from ..source.cache import ShardCache
from ..source.location import ShardLocation, SourceOptions
from .arrays import (
    CompressedLayout,
    ShardArrays,
    arrays_from,
    decompressed,
    layout_from,
    read_layout,
)
from .manifest import ManifestShard
from .meta import IndexMeta, check_fresh, meta_from, reading_index
from .remote import default_index_dir, open_remote_index
from .shard import PathLike, ShardIndex, build_index, open_index, open_index_at

__all__ = [
    "OpenOptions",
    "open_shard",
    "OpenedEntry",
    "open_entry",
    "check_entry",
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


@dataclass(frozen=True, slots=True)
class OpenedEntry:
    """A dataset's shard opened for random access (:func:`open_entry`): its validated
    index, the arrays read from it, and a source of its uncompressed tar bytes."""

    index: ShardIndex
    arrays: ShardArrays
    source: ByteSource


def open_entry(
    entry: ManifestShard, options: OpenOptions, *, number: int, manifest: PathLike | None
) -> OpenedEntry:
    """:func:`open_shard` of shard number ``number`` of a dataset (of ``manifest``, if
    read from one), and its arrays. Its index is the one ``entry`` records, and is
    checked against it (:func:`open_entry_index`).

    The index is read through one connection: its meta, its arrays and a compressed
    shard's frames or seek points. One to be fetched or built is found as
    :func:`find_index` finds it, then read.
    """
    location = ShardLocation.of(entry.url)
    name = location.name if location.remote else str(Path(location.name))  # as open_index_at
    path = _index_there(entry, location, options)
    if path is None:  # found, fetched or built: its meta read and checked there, once
        found = open_entry_index(entry, options, number=number, manifest=manifest)
        with reading_index(found.path) as conn:
            arrays, layout = _arrays_and_layout(conn, found.path, found.meta)
        index = ShardIndex(shard=name, path=found.path, meta=found.meta)
    else:
        with reading_index(path) as conn:
            meta = meta_from(conn, path)
            arrays, layout = _arrays_and_layout(conn, path, meta)
        index = ShardIndex(shard=name, path=path, meta=meta)
        if not location.remote:  # a remote one's reads are checked against its version
            with _named_as_entry(entry, number):
                check_fresh(Path(location.name), meta, path)
        check_entry(entry, index, manifest=manifest)
    source = shard_source(index, options.source, location=location, layout=layout)
    return OpenedEntry(index, arrays, source)


def _arrays_and_layout(
    conn: sqlite3.Connection, path: Path, meta: IndexMeta
) -> tuple[ShardArrays, CompressedLayout | None]:
    """The arrays of the index at ``path``, and a compressed shard's frames or seek points."""
    arrays = arrays_from(conn, path, meta.num_samples, meta.num_members)
    return arrays, layout_from(conn, path, meta) if meta.compression else None


def _index_there(
    entry: ManifestShard, location: ShardLocation, options: OpenOptions
) -> Path | None:
    """The index file of ``entry`` if it is there and read as it is (:func:`find_index`'s
    usual case): the one recorded, else a local shard's by ``options.index_dir``."""
    if entry.index is not None:
        path = Path(entry.index)
    elif location.remote:  # in index_dir or beside the object: checked by a request
        return None
    else:
        path = location.index_path(options.index_dir)
    return path if path.exists() else None


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
    layout: CompressedLayout | None = None,
) -> ByteSource:
    """The uncompressed tar bytes of the shard ``index`` describes (a local file or a
    remote object, ``location`` if known), every read checked against the version the
    index recorded. A compressed shard's ``layout`` is read from the index unless given."""
    location = location or index.location
    meta = index.meta
    raw = location.open_raw(meta, options)
    if not meta.compression:  # plain shards keep their raw source
        return raw
    local_path = None if location.remote else location.name
    layout = layout or read_layout(index.path, meta)
    return decompressed(raw, layout, local_path=local_path)


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
    with _named_as_entry(entry, number):
        index = find_index(location or ShardLocation.of(entry.url), options, recorded=entry.index)
    check_entry(entry, index, manifest=manifest)
    return index


@contextlib.contextmanager
def _named_as_entry(entry: ManifestShard, number: int) -> Iterator[None]:
    """A :class:`ShardNotFoundError` raised inside, naming the shard's number too."""
    try:
        yield
    except ShardNotFoundError as e:
        raise ShardNotFoundError(
            f"shard {entry.url!r} (number {number} of the dataset) no longer exists: {e}"
        ) from e


def check_entry(entry: ManifestShard, index: ShardIndex, *, manifest: PathLike | None) -> None:
    """Refuse ``index`` if it disagrees with the dataset's ``entry`` (of ``manifest``)
    on the shard's sample count or fingerprint (:class:`StaleIndexError`)."""
    if index.meta.num_samples != entry.nsamples or (
        entry.fingerprint is not None and entry.fingerprint != index.meta.fingerprint
    ):
        raise StaleIndexError(
            f"manifest {str(manifest)!r} lists shard {entry.url!r} with {entry.nsamples} "
            f"samples and fingerprint {entry.fingerprint}; its index {str(index.path)!r} has "
            f"{index.meta.num_samples} samples and fingerprint {index.meta.fingerprint}; "
            "rewrite the manifest with write_manifest()"
        )


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
