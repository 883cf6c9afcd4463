"""Build and find one shard's SQLite index (what an opened one is, and the checks on
opening it, are :mod:`.meta`'s: :class:`~.meta.ShardIndex`, :func:`~.meta.open_index_at`).

An index lives next to its shard as ``<shard>.idx.sqlite``, or in ``index_dir``
when given (read-only or remote shards). It is written to a temporary file and
renamed into place (``write``), so readers see either no index or a complete one,
and two processes indexing the same shard both end with a valid file.

An index records the shard's size, mtime and a content fingerprint (``meta``);
opening it against a shard that changed raises :class:`~indextar.errors.StaleIndexError`.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ..errors import IndexFormatError, IndextarError, MissingIndexError, ShardNotFoundError
from ..source.location import INDEX_SUFFIX, ShardLocation
from .attribute_json import OnError, attributes_member, read_json_attributes
from .checksums import ChecksumsArg, checksum_algorithm
from .decompress import DEFAULT_SEEK_SPACING
from .localscan import scan_local_shard
from .meta import IndexMeta, PathLike, ShardIndex, open_index_at, stat_shard
from .options import BuildOptions
from .tables import index_lock, write_index

__all__ = [
    "INDEX_SUFFIX",
    "PathLike",
    "ShardIndex",
    "build_index",
    "build_index_as",
    "open_index",
    "open_index_at",
    "index_path",
    "refuse_to_drop_imports",
]

log = logging.getLogger(__name__)

# -- locating and opening ----------------------------------------------------------


def index_path(shard: PathLike, *, index_dir: PathLike | None = None) -> Path:
    """Where the index of ``shard`` lives.

    Next to the shard by default. In ``index_dir`` the file name also carries a
    hash of the shard's absolute path, so that equally named shards from
    different folders do not collide.
    """
    return ShardLocation(os.fspath(shard)).index_path(index_dir)


def open_index(shard: PathLike, *, index_dir: PathLike | None = None) -> ShardIndex:
    """Open and validate the index of a local ``shard``.

    Raises
    ------
    MissingIndexError
        If the shard has no index.
    IndexFormatError
        If the index file is corrupt, foreign or of another format version.
    StaleIndexError
        If the shard changed since it was indexed.
    """
    return open_index_at(shard, index_path(Path(shard), index_dir=index_dir))


# -- building --------------------------------------------------------------------


def refuse_to_drop_imports(
    existing: ShardIndex,
    why: str,
    *,
    remedy: str = "force=True",
    error: type[IndextarError] = IndextarError,
) -> None:
    """Refuse the rebuild of ``existing`` that ``why`` asks for if it would drop imported
    columns (:func:`~indextar.import_attributes`): the shard cannot give them back."""
    imported = existing.imported_from()
    if imported:
        raise error(
            f"index {str(existing.path)!r} has attributes imported from "
            f"{', '.join(map(repr, imported))} but {why}; a rebuild would drop the imported "
            f"columns: rebuild it with {remedy}, then import them again"
        )


def build_index(
    shard: PathLike,
    *,
    index_dir: PathLike | None = None,
    force: bool = False,
    ignore_zeros: bool = False,
    attributes_from: str | None = None,
    on_error: OnError = "fail",
    seek_spacing: int = DEFAULT_SEEK_SPACING,
    checksums: ChecksumsArg = False,
    meta: str | None = None,
) -> ShardIndex:
    """Index ``shard`` unless it already has a valid index; return the opened index.

    Parameters
    ----------
    shard
        Path to a tar shard: uncompressed, or gzip- or zstd-compressed (read in place
        through frames or seek points: :mod:`indextar.index.arrays`).
    index_dir
        Folder for the index instead of next to the shard.
    force
        Rebuild even if a valid index exists, and replace a stale or corrupt one.
    ignore_zeros
        Read on past zero blocks, as GNU tar's ``--ignore-zeros``: every member of
        concatenated archives (``cat a.tar b.tar > c.tar``) is indexed. Recorded in the
        index; an index built so is rebuilt, not reused, by a call without it.
    attributes_from
        Also store each sample's attributes: the top-level fields of its member of this
        extension (``"json"``), as columns of the index's optional ``attributes`` table
        (:mod:`indextar.index.attributes`). An index without attributes from those
        members is rebuilt, or refused if it has imported ones a rebuild would drop.
    on_error
        A sample whose ``attributes_from`` member is missing or not a JSON object: ``"fail"``
        raises :class:`~indextar.SampleAttributeError` naming the shard and key;
        ``"skip"`` logs it and records it in the index's ``attribute_errors`` table.
    seek_spacing
        For a single-stream ``.tar.gz``: uncompressed bytes between seek points
        (default 128 KiB, at least 64 KiB; each costs a window of up to 32 KiB, sparse
        and compressed, in the index).
    checksums
        Also record a hash of each sample's bytes (its span: headers, data and
        padding), which every read then checks (:mod:`indextar.index.checksums`):
        ``True`` for ``"crc32"``, or ``"xxh3_64"`` (faster; needs the ``xxhash``
        package). An index without checksums is rebuilt, not reused, by a call with them.
    meta
        The deprecated name of ``attributes_from`` (a :class:`DeprecationWarning`; it
        goes in indextar 0.3).

    Raises
    ------
    ShardFormatError
        If the shard is not a well-formed uncompressed tar; no index is written.
    StaleIndexError
        If an index exists but the shard changed since (and ``force`` is false).
    IndextarError
        With ``attributes_from``, if the index has imported attributes but none from
        those members (and ``force`` is false): a rebuild would drop them.
    """
    options = BuildOptions(
        index_dir=None if index_dir is None else os.fspath(index_dir),
        force=force,
        ignore_zeros=ignore_zeros,
        meta=attributes_member(attributes_from, meta, call="build_index"),
        on_error=on_error,
        seek_spacing=seek_spacing,
        checksums=checksums,
    )
    return build_index_as(shard, options)


def build_index_as(shard: PathLike, options: BuildOptions) -> ShardIndex:
    """:func:`build_index` of the local ``shard`` as ``options`` say (what each build
    job of :func:`~indextar.build_indexes` runs); its remote options are not read."""
    shard_path = Path(shard)
    st = _regular_file(shard_path)
    path = index_path(shard_path, index_dir=options.index_dir)
    checksum = checksum_algorithm(options.checksums)
    found = None if options.force else _file_state(path)
    if found is not None:
        existing = _reusable(shard_path, path, options)
        if existing is not None:
            return existing
    member = options.meta
    codec = ShardLocation(str(shard_path)).codec()
    if member is not None and codec is not None:  # before decompressing: offsets are uncompressed
        raise IndextarError(
            f"attributes_from= reads members of uncompressed shards; {str(shard_path)!r} is "
            f"{codec}-compressed (write it with ShardWriter(..., attributes_from=...) to "
            "store attributes)"
        )
    scanned = scan_local_shard(
        shard_path,
        codec,
        ignore_zeros=options.ignore_zeros,
        seek_spacing=options.seek_spacing,
        checksum=checksum,
    )
    scan, grouping, layout = scanned.scan, scanned.grouping, scanned.layout
    after = stat_shard(shard_path)
    if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise IndextarError(f"shard {str(shard_path)!r} changed while it was being indexed")
    index_meta = IndexMeta.describe(
        scan,
        grouping,
        shard_name=shard_path.name,
        shard_size=st.st_size,
        shard_mtime_ns=st.st_mtime_ns,
        fingerprint=scanned.fingerprint,
        ignore_zeros=options.ignore_zeros,
        span_names=scanned.span_names,
        compression=codec or "",
        uncompressed_size=scanned.uncompressed_size,
        seek_spacing=layout.seek_spacing if layout is not None else 0,
        checksum=checksum,
    )
    attributes = None
    if member is not None:
        attributes = read_json_attributes(
            shard_path,
            scan.data_offsets,
            scan.sizes,
            grouping,
            ext=member,
            on_error=options.on_error,
        )
    with index_lock(path):
        # Another writer may have replaced the index since it was judged (an import
        # adding columns this build would drop, or a build like this one): judge again.
        if not options.force and _file_state(path) != found:
            existing = _reusable(shard_path, path, options)
            if existing is not None:
                return existing
        write_index(
            path,
            index_meta,
            scan,
            grouping,
            attributes=attributes,
            layout=layout,
            checksums=scanned.checksums,
        )
    return ShardIndex(shard=str(shard_path), path=path, meta=index_meta)


def _regular_file(shard: Path) -> os.stat_result:
    """The stat of ``shard``, which must be a regular file."""
    st = stat_shard(shard)
    if stat.S_ISDIR(st.st_mode):
        raise ShardNotFoundError(
            f"{str(shard)!r} is a folder, not a shard; give its shards (for example "
            f"{str(shard / '*.tar')!r} to the CLI, or expand_shards({str(shard)!r}))"
        )
    if not stat.S_ISREG(st.st_mode):
        raise ShardNotFoundError(f"shard {str(shard)!r} is not a regular file")
    return st


def _file_state(path: Path) -> tuple[int, int, int, int] | None:
    """What tells one version of the file at ``path`` from the next; ``None`` if absent."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):  # as Path.exists() is false
        return None
    return st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size


def _reusable(shard: Path, path: Path, options: BuildOptions) -> ShardIndex | None:
    """The index at ``path`` if a build with ``options`` keeps it, ``None`` if it
    rebuilds it (logged).

    Raises what :func:`open_index_at` raises but :class:`IndexFormatError`, and
    refuses a rebuild for attributes from a member that would drop imported columns."""
    member = options.meta
    try:
        existing = open_index_at(shard, path)
    except MissingIndexError:  # removed since it was seen
        return None
    except IndexFormatError as e:
        log.warning("replacing unusable index: %s", e)
        return None
    if member is not None and not existing.has_attributes(member):
        refuse_to_drop_imports(
            existing,
            f"none read from each sample's {member!r} member (attributes_from={member!r})",
        )
        log.info("rebuilding %s: it has no attributes from attributes_from=%r", path, member)
        return None
    checksum = checksum_algorithm(options.checksums)
    if checksum and existing.meta.checksum != checksum:
        refuse_to_drop_imports(existing, f"it has no {checksum} checksums")
        log.info("rebuilding %s: it has no %s checksums", path, checksum)
        return None
    if existing.meta.ignore_zeros and not options.ignore_zeros:
        log.info("rebuilding %s: it was built with ignore_zeros=True", path)
        return None
    return existing
