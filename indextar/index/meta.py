"""An opened index: what it records about its shard, and the checks that it still
describes it.

:class:`IndexMeta` is the ``meta`` table: the shard's size, mtime and a content
fingerprint (:func:`fingerprint`, blake2b of the size and the first and last 64 KiB),
the format version and the options the index was built with. ``read_meta``
refuses a file that is not an index of this format, and ``check_fresh`` one whose
shard changed since (:class:`~indextar.errors.StaleIndexError`). :func:`open_index_at`
runs both and gives the :class:`ShardIndex`, which loads the reader's arrays
(:mod:`.arrays`) and answers queries. Opening a shard to read it crosses this module,
``arrays`` and its sources, and no other of this room but ``opener``
(``tests/test_shard_path.py``).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import mmap
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from .._version import __version__
from ..errors import IndexFormatError, MissingIndexError, ShardNotFoundError, StaleIndexError
from ..source.location import ShardLocation
from ..tar.scan import TarScan
from .arrays import ShardArrays, arrays_from, connect_readonly
from .attribute_json import attributes_member
from .attributes import attribute_sources, has_attribute_table, has_source, json_source
from .keyblob import ShardKeys, read_keys
from .naming import Grouping, from_sql, raw_name, sql_text

__all__ = [
    "FORMAT_VERSION",
    "CHECKSUM_FORMAT_VERSION",
    "READABLE_VERSIONS",
    "NAMING",
    "FINGERPRINT_SPAN",
    "IndexMeta",
    "fingerprint",
    "fingerprint_parts",
    "file_fingerprint",
    "connect_readonly",
    "stat_shard",
    "reading_index",
    "read_meta",
    "meta_from",
    "check_fresh",
    "PathLike",
    "ShardIndex",
    "open_index_at",
]

PathLike = Union[str, "os.PathLike[str]"]

FORMAT_VERSION = 3  # 2: raw_name and raw_key columns (names not UTF-8); 3: compressed shards
# 4: per-sample checksums. Only an index that records them is version 4, so that an
# older indextar refuses it rather than reading it without checking them; any other
# index stays version 3, which every indextar since compressed shards reads.
CHECKSUM_FORMAT_VERSION = 4
READABLE_VERSIONS = (2, 3, 4)  # a version-2 index describes a plain tar, as version 3 does
NAMING = "webdataset-1"
FINGERPRINT_SPAN = 64 * 1024
"""Bytes at each end of a shard that its fingerprint covers."""


@dataclass(frozen=True, slots=True)
class IndexMeta:
    """What an index records about its shard and its own build."""

    format_version: int
    indextar_version: str
    shard_name: str
    shard_size: int
    shard_mtime_ns: int
    fingerprint: str
    end_offset: int
    num_members: int
    num_samples: int
    num_skipped: int
    naming: str
    created: str
    etag: str = ""
    """The remote object's ETag when it was indexed; empty for local shards."""
    ignore_zeros: bool = False
    """Whether it was built with ``ignore_zeros`` (members after zero blocks indexed too)."""
    span_names: bool = True
    """Whether every sample's span names its key, so that reads can check the name
    (:mod:`indextar.index.spans`); else they check the headers' checksums only."""
    compression: str = ""
    """``"gzip"`` or ``"zstd"`` for a compressed shard (:mod:`indextar.index.arrays`)."""
    uncompressed_size: int = 0
    """The decompressed tar's size (0 for a plain tar)."""
    seek_spacing: int = 0
    """Bytes between seek points of a single-stream gzip shard; 0 when read by frames."""
    checksum: str = ""
    """The algorithm of the per-sample checksums (:mod:`indextar.index.checksums`), or
    ``""`` if the index records none."""

    @classmethod
    def describe(
        cls,
        scan: TarScan,
        grouping: Grouping,
        *,
        shard_name: str,
        shard_size: int,
        shard_mtime_ns: int,
        fingerprint: str,
        etag: str = "",
        ignore_zeros: bool = False,
        span_names: bool = True,
        compression: str = "",
        uncompressed_size: int = 0,
        seek_spacing: int = 0,
        checksum: str = "",
    ) -> IndexMeta:
        """The metadata of an index built now from ``scan`` and ``grouping``."""
        return cls(
            format_version=CHECKSUM_FORMAT_VERSION if checksum else FORMAT_VERSION,
            indextar_version=__version__,
            shard_name=shard_name,
            shard_size=shard_size,
            shard_mtime_ns=shard_mtime_ns,
            fingerprint=fingerprint,
            end_offset=scan.end_offset,
            num_members=len(grouping.entries),
            num_samples=len(grouping.keys),
            num_skipped=len(grouping.skipped),
            naming=NAMING,
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            etag=etag,
            ignore_zeros=ignore_zeros,
            span_names=span_names,
            compression=compression,
            uncompressed_size=uncompressed_size,
            seek_spacing=seek_spacing,
            checksum=checksum,
        )

    @classmethod
    def from_rows(cls, rows: dict[str, str], path: Path) -> IndexMeta:
        """The ``meta`` table's ``key``/``value`` rows of the index at ``path``, parsed."""
        try:
            return cls(
                format_version=int(rows["format_version"]),
                indextar_version=rows["indextar_version"],
                shard_name=rows["shard_name"],
                shard_size=int(rows["shard_size"]),
                shard_mtime_ns=int(rows["shard_mtime_ns"]),
                fingerprint=rows["fingerprint"],
                end_offset=int(rows["end_offset"]),
                num_members=int(rows["num_members"]),
                num_samples=int(rows["num_samples"]),
                num_skipped=int(rows["num_skipped"]),
                naming=rows["naming"],
                created=rows["created"],
                etag=rows.get("etag", ""),
                ignore_zeros=rows.get("ignore_zeros", "0") == "1",
                span_names=rows.get("span_names", "1") == "1",
                compression=rows.get("compression", ""),
                uncompressed_size=int(rows.get("uncompressed_size", "0")),
                seek_spacing=int(rows.get("seek_spacing", "0")),
                checksum=rows.get("checksum", ""),
            )
        except (KeyError, ValueError) as e:
            raise IndexFormatError(f"index {str(path)!r} has incomplete metadata ({e!r})") from e


def fingerprint(buf: mmap.mmap | bytes, size: int) -> str:
    """A cheap content fingerprint: blake2b-128 of the size, first and last 64 KiB."""
    return fingerprint_parts(
        size, buf[:FINGERPRINT_SPAN], buf[max(0, size - FINGERPRINT_SPAN) : size]
    )


def fingerprint_parts(size: int, head: bytes, tail: bytes) -> str:
    """:func:`fingerprint` from the size and the first and last 64 KiB, however read."""
    h = hashlib.blake2b(digest_size=16)
    h.update(size.to_bytes(8, "little"))
    h.update(head)
    h.update(tail)
    return h.hexdigest()


def file_fingerprint(path: Path, size: int) -> str:
    """:func:`fingerprint` of the local file at ``path``, ``size`` bytes long."""
    with open(path, "rb") as f:
        head = f.read(FINGERPRINT_SPAN)
        f.seek(max(0, size - FINGERPRINT_SPAN))
        tail = f.read(FINGERPRINT_SPAN)
    return fingerprint_parts(size, head, tail)


def stat_shard(shard: Path) -> os.stat_result:
    """The local ``shard``'s stat; :class:`~indextar.ShardNotFoundError` if it is gone."""
    try:
        return shard.stat()
    except FileNotFoundError:
        raise ShardNotFoundError(f"shard {str(shard)!r} does not exist") from None


@contextlib.contextmanager
def reading_index(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the index at ``path``, closed after; a file that SQLite
    cannot open or read as a database is an :class:`IndexFormatError`."""
    try:
        with contextlib.closing(connect_readonly(path)) as conn:
            yield conn
    except sqlite3.DatabaseError as e:
        raise IndexFormatError(
            f"{str(path)!r} is not an indextar index ({e}); delete it or rebuild it "
            "with build_index(..., force=True)"
        ) from e


def read_meta(path: Path) -> IndexMeta:
    """The metadata of the index at ``path``, checked to be one this version reads.

    Raises
    ------
    IndexFormatError
        If it is not an index, or one of another format version or naming rules.
    """
    with reading_index(path) as conn:
        return meta_from(conn, path)


def meta_from(conn: sqlite3.Connection, path: Path) -> IndexMeta:
    """:func:`read_meta` through ``conn``, a connection of :func:`reading_index`: what
    reads more of the index at its open asks first, on the same connection."""
    rows = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    for table in ("members", "samples", "skipped"):
        conn.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall()
    if "format_version" not in rows:
        raise IndexFormatError(f"{str(path)!r} is not an indextar index (no format_version)")
    try:
        version = int(rows["format_version"])
    except ValueError:
        raise IndexFormatError(
            f"{str(path)!r} is not an indextar index (format_version is "
            f"{rows['format_version']!r}, not a number)"
        ) from None
    if version not in READABLE_VERSIONS:
        newer = "a newer" if version > max(READABLE_VERSIONS) else "an older"
        raise IndexFormatError(
            f"index {str(path)!r} has format version {version}, written by {newer} indextar; "
            f"indextar {__version__} reads formats "
            f"{', '.join(map(str, READABLE_VERSIONS))} (rebuild with force=True)"
        )
    meta = IndexMeta.from_rows(rows, path)
    if meta.naming != NAMING:
        raise IndexFormatError(
            f"index {str(path)!r} uses naming rules {meta.naming!r}, not {NAMING!r}"
        )
    return meta


def check_fresh(shard: Path, meta: IndexMeta, path: Path) -> None:
    """Refuse the index at ``path`` (its ``meta``) if the local ``shard`` changed since:
    its size, mtime or content fingerprint (:class:`~indextar.StaleIndexError`)."""
    st = stat_shard(shard)
    problems = []
    if st.st_size != meta.shard_size:
        problems.append(f"its size changed from {meta.shard_size} to {st.st_size} bytes")
    if st.st_mtime_ns != meta.shard_mtime_ns:
        problems.append(f"its mtime changed from {meta.shard_mtime_ns} to {st.st_mtime_ns} ns")
    if not problems and file_fingerprint(shard, st.st_size) != meta.fingerprint:
        problems.append("its content fingerprint (first and last 64 KiB) changed")
    if problems:
        raise StaleIndexError(
            f"index {str(path)!r} does not match shard {str(shard)!r}: {'; '.join(problems)} "
            "since it was indexed; rebuild it with build_index(shard, force=True)"
        )


# -- the opened index ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ShardIndex:
    """An opened, validated index of one shard.

    Holds no open connection: each query opens the file read-only, so a
    ``ShardIndex`` can be pickled and sent to DataLoader workers.
    """

    shard: str
    path: Path
    meta: IndexMeta

    @classmethod
    def unchecked(cls, shard: str, path: Path) -> ShardIndex:
        """The index file ``path`` of ``shard``, its metadata read but not checked against
        the shard (its reads are: they are conditional on the version it records)."""
        return cls(shard=shard, path=path, meta=read_meta(path))

    @property
    def location(self) -> ShardLocation:
        """Where the shard is: a local file or a remote object."""
        return ShardLocation.of(self.shard)

    def __len__(self) -> int:
        return self.meta.num_samples

    def connect(self) -> sqlite3.Connection:
        """A new read-only connection to the index file, for bulk readers; close it after use."""
        return connect_readonly(self.path)

    def _query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with contextlib.closing(connect_readonly(self.path)) as conn:
            return conn.execute(sql, params).fetchall()

    def load_arrays(self) -> ShardArrays:
        """The arrays random access reads, in one query (from the tables if the index has none)."""
        with contextlib.closing(connect_readonly(self.path)) as conn:
            return arrays_from(conn, self.path, self.meta.num_samples, self.meta.num_members)

    def load_keys(self) -> ShardKeys:
        """Every sample's key, as bytes in one blob: the index's keys and their lengths
        alone, not the rest of its arrays (a join reads every key of a dataset)."""
        with contextlib.closing(connect_readonly(self.path)) as conn:
            keys = read_keys(conn, self.path, self.meta.num_samples, self.meta.num_members)
            return keys if keys is not None else ShardKeys.of(arrays_from_tables(conn))

    def has_attributes(
        self, attributes_from: str | None = None, *, meta: str | None = None
    ) -> bool:
        """Whether the index has the optional ``attributes`` table; with
        ``attributes_from``, whether it holds attributes read from each sample's member
        of that extension (``build_index(..., attributes_from="json")``), not only
        imported ones. ``meta=`` is the deprecated name of ``attributes_from=``."""
        member = attributes_member(attributes_from, meta, call="has_attributes")
        with contextlib.closing(connect_readonly(self.path)) as conn:
            if member is None:
                return has_attribute_table(conn)
            return has_source(conn, json_source(member))

    def imported_from(self) -> list[str]:
        """The file names of the tables whose columns were imported into the index
        (:func:`~indextar.import_attributes`), which only another import restores."""
        with contextlib.closing(connect_readonly(self.path)) as conn:
            sources = set(attribute_sources(conn).values())
        return sorted(s.removeprefix("import:") for s in sources if s.startswith("import:"))

    def json_members(self) -> list[str]:
        """The extensions of the members whose fields are the index's attribute columns
        (``build_index(..., attributes_from="json")``): ``["json"]``, or ``[]`` for none."""
        with contextlib.closing(connect_readonly(self.path)) as conn:
            sources = set(attribute_sources(conn).values())
        return sorted(s.removeprefix("json:") for s in sources if s.startswith("json:"))

    def keys(self) -> list[str]:
        """Every sample's key, in shard order."""
        rows = self._query("SELECT key, raw_key FROM samples ORDER BY sample_id")
        return [from_sql(text, raw) for text, raw in rows]

    def find_key(self, key: str) -> list[int]:
        """Sample numbers whose key is ``key`` (normally zero or one)."""
        raw = raw_name(key)
        rows = self._query(
            "SELECT sample_id FROM samples WHERE key = ? AND raw_key IS ? ORDER BY sample_id",
            (sql_text(key), raw),
        )
        return [int(r[0]) for r in rows]

    def extension_counts(self) -> dict[str, int]:
        """How many members have each extension."""
        rows = self._query("SELECT ext, COUNT(*) FROM members GROUP BY ext ORDER BY ext")
        return {str(ext): int(n) for ext, n in rows}

    def skipped_counts(self) -> dict[str, int]:
        """How many entries were skipped, by reason."""
        rows = self._query("SELECT kind, COUNT(*) FROM skipped GROUP BY kind ORDER BY kind")
        return {str(kind): int(n) for kind, n in rows}

    def data_bytes(self) -> int:
        """Total size of the indexed members' data."""
        rows = self._query("SELECT COALESCE(SUM(size), 0) FROM members")
        return int(rows[0][0])

    def scattered_keys(self) -> list[str]:
        """Keys that occur in more than one sample (members not adjacent in the tar)."""
        rows = self._query(
            "SELECT key, raw_key FROM samples GROUP BY key, raw_key HAVING COUNT(*) > 1 "
            "ORDER BY key"
        )
        return [from_sql(text, raw) for text, raw in rows]


def open_index_at(shard: PathLike, path: PathLike) -> ShardIndex:
    """Open and validate the index file ``path`` of a local ``shard``.

    For callers that recorded where the index is (dataset manifests), rather than
    deriving it from ``index_dir``. Raises as :func:`open_index` does.
    """
    shard_path, path = Path(shard), Path(path)
    if not path.exists():
        stat_shard(shard_path)
        raise MissingIndexError(
            f"shard {str(shard_path)!r} has no index (looked for {str(path)!r})",
            [str(shard_path)],
        )
    meta = read_meta(path)
    check_fresh(shard_path, meta, path)
    return ShardIndex(shard=str(shard_path), path=path, meta=meta)
