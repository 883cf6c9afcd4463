"""Join an external table (parquet) into the shards' indexes by key: ``import_attributes``.

LAION and its kin ship per-sample scores in a parquet file beside the shards, keyed by
the sample's key. Each shard's samples are matched to the table's rows by key, in
Arrow (``pyarrow.compute.index_in``), and the chosen columns are written into the
shard index's ``attributes`` table (:mod:`indextar.index.attributes`), replacing
columns of the same name, which take the new values and their type. A name that
differs from an index's column only in case is refused (SQLite would take it for the
same column), as are the names a selection gives its own fields.

An index is never modified in place: each is copied to a temporary file next to it,
changed there and renamed over the original (:func:`indextar.atomic.atomic_path`), so a
reader sees the old index or the new one, and a crash leaves the old one. A sidecar
file would avoid the copy (indexes are small: about 100 bytes a sample), but every
reader of attributes would then have to find, validate and join a second file; one
file keeps a query a single SQLite statement. The copy is taken and renamed under the
index's lock (:func:`indextar.index.tables.index_lock`), so imports into one index at
once, or an import and a build, wait for each other and neither loses its columns.

A key the table holds twice is an error (which row would win?), as is a NULL key. A
sample the table has no row for gets NULL (or, with ``missing="fail"``, is an error);
rows that match no sample are counted and logged. pyarrow is an optional dependency
(``pip install 'indextar[meta]'``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..atomic import atomic_path
from ..errors import IndexWriteError, SampleAttributeError
from .attributes import (
    MAX_COLUMNS,
    RESERVED_NAMES,
    AttributeTable,
    attribute_columns,
    sql_value,
    write_attributes,
)
from .meta import IndexMeta, read_meta
from .opener import open_shard_index
from .shard import PathLike, ShardIndex
from .tables import index_lock

__all__ = ["import_attributes", "ImportReport"]

log = logging.getLogger(__name__)

_SHOWN = 5


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What :func:`import_attributes` did.

    Attributes
    ----------
    shards
        Indexes rewritten.
    samples
        Samples in those shards.
    matched
        Samples that got a row of the table.
    missing
        Samples the table has no row for (their columns are NULL).
    unused
        Rows of the table that match no sample of these shards.
    columns
        The columns imported.
    """

    shards: int
    samples: int
    matched: int
    missing: int
    unused: int
    columns: tuple[str, ...]


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError as e:  # pragma: no cover - pyarrow is in the test extra
        raise ImportError(
            "importing a parquet table needs pyarrow: pip install 'indextar[meta]'"
        ) from e
    return pyarrow


def _read_table(path: PathLike, key: str, columns: Sequence[str] | None) -> Any:
    pa = _pyarrow()
    schema = pa.parquet.read_schema(path)
    if key not in schema.names:
        raise SampleAttributeError(
            f"the table {os.fspath(path)!r} has no key column {key!r}; it has {schema.names}"
        )
    wanted = [name for name in schema.names if name != key] if columns is None else list(columns)
    unknown = [name for name in wanted if name not in schema.names]
    if unknown:
        raise SampleAttributeError(
            f"the table {os.fspath(path)!r} has no columns {unknown}; it has {schema.names}"
        )
    _check_names(path, wanted)
    table = pa.parquet.read_table(path, columns=[key, *wanted])
    keys = table.column(key)
    if not pa.types.is_string(keys.type) and not pa.types.is_large_string(keys.type):
        try:
            keys = keys.cast(pa.string())
        except pa.ArrowException as e:  # a list, a struct: no key a sample could have
            raise SampleAttributeError(
                f"the table {os.fspath(path)!r} has a key column {key!r} of type {keys.type}, "
                f"which is not text ({e})"
            ) from e
    if keys.null_count:
        row = int(np.flatnonzero(keys.is_null().to_numpy(zero_copy_only=False))[0])
        raise SampleAttributeError(
            f"the table {os.fspath(path)!r} has {keys.null_count} rows without a key "
            f"(the first: row {row})"
        )
    counts = pa.compute.value_counts(keys)
    repeated = counts.filter(pa.compute.greater(counts.field("counts"), 1))
    if len(repeated):
        shown = ", ".join(repr(k) for k in repeated.field("values")[:_SHOWN].to_pylist())
        raise SampleAttributeError(
            f"the table {os.fspath(path)!r} has {len(repeated)} keys on more than one row "
            f"(which should a sample take?): {shown}{', ...' if len(repeated) > _SHOWN else ''}"
        )
    return keys.combine_chunks(), {name: table.column(name) for name in wanted}


def _check_names(table: PathLike, names: Sequence[str]) -> None:
    """Refuse columns that would shadow a selection's own fields, or each other."""
    reserved = [name for name in names if name.lower() in RESERVED_NAMES]
    if reserved:
        raise SampleAttributeError(
            f"the table {os.fspath(table)!r} has columns named as a selection's own fields "
            f"{reserved} (reserved: {sorted(RESERVED_NAMES)}); rename them, or leave them out "
            "with columns="
        )
    folded: dict[str, str] = {}
    for name in names:
        other = folded.setdefault(name.lower(), name)
        if other != name:
            raise SampleAttributeError(
                f"the table {os.fspath(table)!r} has the columns {other!r} and {name!r}, which "
                "differ only in case (SQLite column names ignore it); import one of them"
            )


def _check_fits(index: ShardIndex, table: PathLike, names: Sequence[str]) -> None:
    """Refuse columns whose names differ only in case from one the index has (one would
    silently replace the other), or more columns than an index holds."""
    with contextlib.closing(index.connect()) as conn:
        have = {name.lower(): name for name in attribute_columns(conn)}
    for name in names:
        other = have.get(name.lower(), name)
        if other != name:
            raise SampleAttributeError(
                f"the table {os.fspath(table)!r} has the column {name!r}, and the index "
                f"{str(index.path)!r} has {other!r}: they differ only in case (SQLite column "
                f"names ignore it), so the one would replace the other; rename the table's "
                f"column, or to replace {other!r} name it so",
                shard=index.shard,
            )
    total = len(have.keys() | {name.lower() for name in names})
    if total > MAX_COLUMNS:
        raise SampleAttributeError(
            f"importing {len(names)} columns from {os.fspath(table)!r} would give the index "
            f"{str(index.path)!r} {total:,} attribute columns; an index holds at most "
            f"{MAX_COLUMNS:,}",
            shard=index.shard,
        )


def import_attributes(
    shards: Sequence[PathLike],
    table: PathLike,
    *,
    key: str = "key",
    columns: Sequence[str] | None = None,
    index_dir: PathLike | None = None,
    missing: Literal["null", "fail"] = "null",
) -> ImportReport:
    """Join the parquet ``table`` into the indexes of ``shards`` by sample key.

    Parameters
    ----------
    shards
        Shard paths or URLs; each must have a valid index. A URL's is its local copy
        (:func:`~indextar.index.opener.open_shard_index`), which a changed object no
        longer silently rebuilds (a rebuild would drop the columns: ``StaleIndexError``);
        ``upload_index`` puts it beside the object.
    table
        A parquet file with a key column and the columns to import.
    key
        The table's column holding each sample's ``__key__`` (cast to a string).
    columns
        The columns to import; default every column but ``key``.
    index_dir
        Folder of the indexes, when they are not next to their shards.
    missing
        A sample the table has no row for: ``"null"`` (its columns are NULL, counted in
        the report and logged) or ``"fail"`` (an error naming it; no index changes).

    Raises
    ------
    SampleAttributeError
        A key on two rows or a NULL key, an unknown column, a column named as a
        selection's own fields (``__key__``, ``__shard__``, ``__index__``, ...), one whose
        name differs only in case from another's or from a column of an index, more
        columns than an index holds, or (``missing="fail"``) a sample without a row;
        nothing is written.
    StaleIndexError, MissingIndexError
        As :func:`~indextar.index.opener.open_shard_index`.
    """
    if missing not in ("null", "fail"):
        raise ValueError(f"missing must be 'null' or 'fail'; got {missing!r}")
    pa = _pyarrow()
    keys, values = _read_table(table, key, columns)
    source = f"import:{Path(table).name}"
    used = np.zeros(len(keys), dtype=bool)
    plans: list[tuple[ShardIndex, AttributeTable]] = []
    total = matched = 0
    for shard in shards:  # every shard is matched before any index is written
        index = open_shard_index(shard, index_dir=index_dir)
        _check_fits(index, table, list(values))
        shard_keys = index.keys()
        found = pa.compute.index_in(pa.array(shard_keys, pa.string()), value_set=keys)
        rows = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        hit = rows >= 0
        absent = np.flatnonzero(~hit)
        if absent.size and missing == "fail":
            raise SampleAttributeError(
                f"{absent.size} of {len(rows)} samples have no row in {os.fspath(table)!r}",
                shard=str(shard),
                key=shard_keys[int(absent[0])],
            )
        used[rows[hit]] = True
        imported = {  # a null index takes a null: a sample without a row gets NULL
            name: [sql_value(v) for v in column.take(found).to_pylist()]
            for name, column in values.items()
        }
        plans.append((index, AttributeTable(len(rows), imported, source, [])))
        total += len(rows)
        matched += int(hit.sum())
    for index, attributes in plans:
        _rewrite(index, attributes)
    report = ImportReport(
        shards=len(plans),
        samples=total,
        matched=matched,
        missing=total - matched,
        unused=int((~used).sum()),
        columns=tuple(values),
    )
    if report.missing or report.unused:
        log.warning(
            "%s: %d of %d samples have no row (their columns are NULL); %d of %d rows "
            "match no sample",
            os.fspath(table),
            report.missing,
            report.samples,
            report.unused,
            len(keys),
        )
    return report


def _rewrite(index: ShardIndex, attributes: AttributeTable) -> None:
    """Add ``attributes`` to a copy of the index and rename the copy over it."""
    try:
        with index_lock(index.path), atomic_path(index.path) as tmp:
            shutil.copyfile(index.path, tmp)  # as the last writer left it
            if not _same_build(read_meta(tmp), index.meta):  # rebuilt since it was opened
                raise IndexWriteError(f"the index {str(index.path)!r} changed during the import")
            with contextlib.closing(sqlite3.connect(tmp, isolation_level=None)) as conn:
                # No journal: the copy is renamed in only once complete, and is deleted
                # otherwise; a journal would be a file that a killed import leaves behind.
                conn.execute("PRAGMA journal_mode = OFF")
                write_attributes(conn, attributes, path=tmp)  # one transaction, or two
    except IndexWriteError:  # an OSError too, already naming the index
        raise
    except (OSError, sqlite3.Error) as e:
        raise IndexWriteError(f"cannot rewrite the index {str(index.path)!r}: {e}") from e


def _same_build(found: IndexMeta, opened: IndexMeta) -> bool:
    """Whether the index as found describes the samples it had when opened: a rebuild of
    the unchanged shard with the same options (only ``created`` differs) has them all, in
    the same order, so the matched rows still fit."""
    return replace(found, created=opened.created) == opened
