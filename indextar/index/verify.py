"""Check an index against a fresh scan of its shard."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IndexFormatError
from ..source.location import SourceOptions
from ..tar.scan import TarScan
from .arrays import CompressedLayout, ShardArrays, read_arrays, read_layout
from .checksums import hasher
from .decompress import DEFAULT_SEEK_SPACING, CompressedScan
from .keyblob import read_keys
from .localscan import scan_local_shard
from .meta import IndexMeta, connect_readonly
from .naming import Grouping, from_sql, sql_text
from .opener import open_shard_index, shard_source
from .remote import expected_stat, scan_object
from .shard import PathLike, ShardIndex
from .tables import scan_arrays

__all__ = ["VerifyReport", "verify_index", "rescan"]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of :func:`verify_index`.

    ``problems`` lists where the index disagrees with the shard (an index with
    problems must not be used); ``warnings`` lists things that are legal but
    probably unintended, such as a key whose members are not adjacent.
    """

    shard: str
    index: str
    samples: int
    members: int
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_index(
    shard: PathLike,
    *,
    index_dir: PathLike | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> VerifyReport:
    """Re-scan ``shard`` (a local path or a URL) and compare every row of its index with
    the scan.

    A remote shard's index is found as :func:`~.opener.open_shard_index` finds it, and
    the object is read again (a ``.tar.gz`` or ``.tar.zst`` through a temporary copy, as
    its index was built), every read conditional on the version the index recorded.

    Raises the same errors as :func:`~.opener.open_shard_index` (missing, stale or
    corrupt index) and as the scanner (malformed shard).
    """
    ix = open_shard_index(shard, index_dir=index_dir, storage_options=storage_options)
    scanned = rescan(ix, storage_options=storage_options)
    scan, grouping, layout = scanned.scan, scanned.grouping, scanned.layout
    changed = []  # the shard's first and last 64 KiB against the fingerprint
    if scanned.fingerprint != ix.meta.fingerprint:
        changed.append(
            f"content fingerprint: index has {ix.meta.fingerprint}, shard has {scanned.fingerprint}"
        )
    arrays = scan_arrays(scan, grouping)
    problems: list[str] = []
    warnings: list[str] = []
    try:
        with contextlib.closing(connect_readonly(ix.path)) as conn:
            for what, got, expected in zip(
                ("member", "sample", "skipped entry"),
                _stored_rows(conn),
                _expected_rows(scan, grouping, arrays),
            ):
                problems += _compare(what, got, expected)
            if not problems:  # the tables are the scan's: the arrays must be the scan's too
                problems += _check_arrays(conn, ix.path, arrays, ix.meta, warnings)
            if not problems and ix.meta.checksum:
                problems += _check_checksums(ix, conn, storage_options)
    except sqlite3.DatabaseError as e:
        problems.append(f"index cannot be read: {e}")
    if layout is not None and not problems:
        problems += _compare_layout(read_layout(ix.path, ix.meta), layout)
    if ix.meta.end_offset != scan.end_offset:
        problems.append(f"end offset: index says {ix.meta.end_offset}, shard has {scan.end_offset}")
    problems += changed
    # Sample spans past the archive's end need no check of their own: the samples
    # table equals the scan's, whose spans end within the archive.
    warnings += [
        f"key {key!r} occurs in several samples: its members are not adjacent in the tar"
        for key in grouping.scattered_keys
    ]
    return VerifyReport(
        shard=ix.shard,
        index=str(ix.path),
        samples=len(grouping.keys),
        members=len(grouping.entries),
        problems=problems,
        warnings=warnings,
    )


Rows = list[tuple[Any, ...]]


def _expected_rows(
    scan: TarScan, grouping: Grouping, arrays: ShardArrays
) -> tuple[Rows, Rows, Rows]:
    """The ``members``, ``samples`` and ``skipped`` rows an index of the scan holds."""
    rows = grouping.entries
    members = list(
        zip(
            range(len(rows)),
            grouping.sample_of_member.tolist(),
            [scan.names[i] for i in rows.tolist()],
            [sql_text(ext) for ext in grouping.exts],  # the exact ones are in the arrays
            scan.header_offsets[rows].tolist(),
            scan.data_offsets[rows].tolist(),
            scan.sizes[rows].tolist(),
        )
    )
    samples = list(
        zip(
            range(len(grouping.keys)),
            grouping.keys,
            grouping.first_member.tolist(),
            grouping.member_count.tolist(),
            arrays.samples[:, 0].tolist(),  # start_offset
            arrays.samples[:, 1].tolist(),  # end_offset
        )
    )
    skipped = sorted(
        (int(scan.header_offsets[row]), scan.names[row], kind) for row, kind in grouping.skipped
    )
    return members, samples, skipped


def _stored_rows(conn: sqlite3.Connection) -> tuple[Rows, Rows, Rows]:
    """The ``members``, ``samples`` and ``skipped`` rows of the index, as
    :func:`_expected_rows` gives them."""
    members = [
        (*row[:2], from_sql(row[2], row[-1]), *row[3:-1])
        for row in conn.execute(
            "SELECT member_id, sample_id, name, ext, header_offset, data_offset, size, "
            "raw_name FROM members ORDER BY member_id"
        )
    ]
    samples = [
        (row[0], from_sql(row[1], row[-1]), *row[2:-1])
        for row in conn.execute(
            "SELECT sample_id, key, first_member, member_count, start_offset, end_offset, "
            "raw_key FROM samples ORDER BY sample_id"
        )
    ]
    skipped = [
        (row[0], from_sql(row[1], row[3]), row[2])
        for row in conn.execute(
            "SELECT header_offset, name, kind, raw_name FROM skipped ORDER BY header_offset"
        )
    ]
    return members, samples, skipped


def rescan(
    index: ShardIndex, *, storage_options: Mapping[str, Any] | None = None
) -> CompressedScan:
    """A fresh scan of the shard ``index`` describes, made as its build made it: a remote
    object in one read (a ``.tar.gz`` or ``.tar.zst`` through a temporary copy beside the
    index), every read conditional on the version the index recorded; a local shard
    from its file, its frames or seek points found again."""
    meta = index.meta
    spacing = meta.seek_spacing or DEFAULT_SEEK_SPACING
    location = index.location
    if location.remote:
        return scan_object(
            location.name,
            expected_stat(meta),
            scratch=index.path,
            storage_options=storage_options,
            seek_spacing=spacing,
        ).scanned
    return scan_local_shard(
        Path(location.name),
        meta.compression or None,
        ignore_zeros=meta.ignore_zeros,
        seek_spacing=spacing,
    )


def _check_arrays(
    conn: sqlite3.Connection,
    path: Path,
    expected: ShardArrays,
    meta: IndexMeta,
    warnings: list[str],
) -> list[str]:
    """Problems with the ``arrays`` blobs, which must say what the (checked) tables say."""
    try:
        stored = read_arrays(conn, path, meta.num_samples, meta.num_members)
    except (IndexFormatError, sqlite3.DatabaseError, ValueError) as e:
        return [f"arrays: {e}"]
    if stored is None:
        warnings.append(
            "index has no arrays table (written by an older indextar): opening the shard reads "
            "its tables, which is slower; rebuild it with build_index(shard, force=True)"
        )
        return []
    if not stored.equals(expected):
        return ["arrays: the packed arrays disagree with the samples and members tables"]
    try:
        keys = read_keys(conn, path, meta.num_samples, meta.num_members)
    except IndexFormatError as e:
        return [f"arrays: {e}"]
    bounds = expected.samples[:, 4:6]
    if keys is not None and not np.array_equal(np.stack([keys.starts, keys.ends], 1), bounds):
        return ["arrays: the key lengths disagree with the samples table"]
    return []


def _check_checksums(
    ix: ShardIndex, conn: sqlite3.Connection, storage_options: Mapping[str, Any] | None
) -> list[str]:
    """Problems with the samples' checksums: every span read again (its uncompressed
    bytes, a batch of samples at a time) and hashed."""
    stored = read_arrays(conn, ix.path, ix.meta.num_samples, ix.meta.num_members)
    if stored is None or stored.checksums is None:
        return [f"checksums: the index says {ix.meta.checksum} but has none"]
    hash_ = hasher(ix.meta.checksum)
    starts, ends = stored.samples[:, 0].tolist(), stored.samples[:, 1].tolist()
    bad: list[int] = []
    with shard_source(ix, SourceOptions(dict(storage_options or {}))) as source:
        for at in range(0, len(starts), _CHECK_BATCH):
            offsets = starts[at : at + _CHECK_BATCH]
            lengths = [e - s for s, e in zip(offsets, ends[at : at + _CHECK_BATCH])]
            for n, span in enumerate(source.read_many(offsets, lengths), at):
                if hash_(span) != int(stored.checksums[n]):
                    bad.append(n)
    if not bad:
        return []
    first = bad[0]
    key = stored.key_blob[stored.samples[first, 4] : stored.samples[first, 5]]
    return [
        f"checksums: {len(bad)} of {len(starts)} samples do not match their {ix.meta.checksum}"
        f" checksum, the first {key.decode('utf-8', 'surrogateescape')!r} at byte offset "
        f"{starts[first]}"
    ]


_CHECK_BATCH = 256


def _compare_layout(stored: CompressedLayout, scanned: CompressedLayout) -> list[str]:
    """Problems with a compressed shard's frames or seek points, against a fresh pass."""
    if stored.frames is not None and scanned.frames is not None:
        return _compare("frame", stored.frames.tolist(), scanned.frames.tolist())
    if stored.seek_points is not None and scanned.seek_points is not None:
        got, expected = stored.seek_points, scanned.seek_points
        problems = _compare("seek point", got.points.tolist(), expected.points.tolist())
        if not problems and not got.windows_agree(expected):
            problems.append("seek points: their windows differ from the shard's data")
        return problems
    index_has, shard_has = (
        "frames" if x.frames is not None else "seek points" for x in (stored, scanned)
    )
    return [f"compressed layout: index has {index_has}, shard has {shard_has}"]


def _compare(
    what: str, got: Sequence[tuple[Any, ...]], expected: Sequence[tuple[Any, ...]]
) -> list[str]:
    if got == expected:
        return []
    if len(got) != len(expected):
        return [f"{what} count: index has {len(got)}, shard has {len(expected)}"]
    first = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
    return [f"{what} {first}: index has {got[first]!r}, shard has {expected[first]!r}"]
