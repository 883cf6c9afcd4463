"""What every source format of ``convert`` gives: pieces of rows, typed columns, rows.

A source dataset (a parquet folder, a saved Hugging Face dataset, Mosaic MDS, LitData)
is read as a list of :class:`SourcePiece`: runs of rows whose count is known without
reading them (a parquet row group, an arrow file, an MDS shard, a LitData chunk), so
that the conversion plans its shards before reading any sample. Each column has a
:data:`ColumnKind`: ``"binary"`` columns become members of each sample, ``"value"``
columns (numbers, text, booleans, and nested lists or structs of them) become its
attributes. A reader yields a :class:`SourceRow` per row: the members' bytes and the
attribute values, in the column order of a :class:`ColumnPlan`.

The format modules (``convert_arrow``, ``convert_mds``, ``convert_litdata``) each
provide ``scan(path) -> Source`` and ``read(source, piece, plan, start, stop)``.
"""

from __future__ import annotations

import datetime
import decimal
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ConvertError
from ..index.attributes import RESERVED_NAMES
from ..index.naming import split_name
from .sample import Buffer

__all__ = [
    "ColumnKind",
    "ColumnPlan",
    "Source",
    "SourcePiece",
    "SourceRow",
    "plan_columns",
    "plain_value",
    "record_spans",
    "source_files",
]

ColumnKind = Literal["binary", "value"]
"""``"binary"``: bytes, stored as a member; ``"value"``: stored as an attribute."""


@dataclass(frozen=True, slots=True)
class SourcePiece:
    """A run of rows of a source read as one: ``rows`` rows of ``path`` at ``part``
    (a parquet row group, an arrow record batch run, an MDS shard, a LitData chunk)."""

    path: str
    part: int
    rows: int


@dataclass(frozen=True, slots=True)
class Source:
    """A scanned source dataset: its format, pieces in row order, and columns.

    Attributes
    ----------
    format
        ``"parquet"``, ``"hf"``, ``"mds"`` or ``"litdata"``.
    root
        The path given (a folder, or a parquet file).
    pieces
        Every run of rows, in the dataset's row order.
    columns
        Each column's kind, in the dataset's column order.
    files
        ``(path, size, mtime_ns)`` of every file read: what a resumed conversion checks.
    """

    format: str
    root: str
    pieces: tuple[SourcePiece, ...]
    columns: Mapping[str, ColumnKind]
    files: tuple[tuple[str, int, int], ...]

    @property
    def rows(self) -> int:
        """Rows of the whole dataset."""
        return sum(piece.rows for piece in self.pieces)


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """Which columns a conversion reads, and as what.

    Attributes
    ----------
    members
        ``(extension, column)`` of each member, sorted by extension.
    attributes
        Columns stored as attributes (and in each sample's ``json`` member), in order.
    key
        The column holding each sample's key, or ``None`` for keys from row numbers.
    """

    members: tuple[tuple[str, str], ...]
    attributes: tuple[str, ...]
    key: str | None

    @property
    def columns(self) -> list[str]:
        """Every column read, without repeats."""
        names = [column for _, column in self.members] + list(self.attributes)
        if self.key is not None:
            names.append(self.key)
        return list(dict.fromkeys(names))


@dataclass(frozen=True, slots=True)
class SourceRow:
    """One row read from a source: its key (``None``: named from its row number), each
    member's bytes (``None``: null in the source) and its attribute values."""

    key: object
    members: tuple[Buffer | None, ...]
    attributes: tuple[object, ...]


JSON_EXT = "json"


def plan_columns(
    source: Source,
    *,
    members: Mapping[str, str] | None,
    attributes: Sequence[str] | None,
    key: str | None,
) -> ColumnPlan:
    """Choose the members and attributes of a conversion from a source's columns.

    ``members`` maps extensions to columns (default: every binary column, under its
    own name, lowercased); ``attributes`` lists value columns (default: every value
    column that is neither the key nor a member).

    Raises
    ------
    ConvertError
        For a column the source does not have, a member that is not binary, an
        attribute that is, or names a sample cannot hold.
    """
    where = source.root

    def known(column: str, role: str) -> None:
        if column not in source.columns:
            raise ConvertError(
                f"no column {column!r} (for {role}); it has {list(source.columns)}", source=where
            )

    if key is not None:
        known(key, "the key")
    if members is None:
        chosen = {name.lower(): name for name, kind in source.columns.items() if kind == "binary"}
    else:
        chosen = dict(members)
    for ext, column in chosen.items():
        known(column, f"the member {ext!r}")
        if source.columns[column] != "binary":
            raise ConvertError(
                f"column {column!r} holds values, not bytes: it cannot be "
                f"the member {ext!r}; store it as an attribute",
                source=where,
            )
        if split_name(f"k.{ext}") != ("k", ext) or ext.startswith("_") or ext == JSON_EXT:
            raise ConvertError(
                f"member extension {ext!r} (column {column!r}) must be lowercase, without "
                f"'/', NUL or newline, not start with '_', and not be {JSON_EXT!r} (each "
                "sample's attributes go there); name it with members=",
                source=where,
            )
    taken = {column for column in chosen.values()} | {key}
    if attributes is None:
        wanted = [
            name for name, kind in source.columns.items() if kind == "value" and name not in taken
        ]
    else:
        wanted = list(attributes)
    for column in wanted:
        known(column, "an attribute")
        if source.columns[column] != "value":
            raise ConvertError(
                f"column {column!r} holds bytes: it cannot be an attribute; store it as a member",
                source=where,
            )
        if column.lower() in RESERVED_NAMES:
            raise ConvertError(
                f"column {column!r} is named as a selection's own field; "
                "leave it out of the attributes",
                source=where,
            )
    folded: dict[str, str] = {}
    for column in wanted:  # SQLite column names ignore ASCII case
        other = folded.setdefault(column.lower(), column)
        if other != column:
            raise ConvertError(
                f"columns {other!r} and {column!r} differ only in case: they cannot both be "
                "attributes; leave one out with attributes=",
                source=where,
            )
    return ColumnPlan(members=tuple(sorted(chosen.items())), attributes=tuple(wanted), key=key)


def plain_value(value: object) -> object:
    """A column value as JSON holds it: dates, times and decimals as their text (which
    compares in order), anything nested converted all the way down."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, (datetime.date, datetime.time, decimal.Decimal, datetime.timedelta)):
        return str(value)
    if hasattr(value, "tolist"):  # a numpy scalar or array
        return plain_value(value.tolist())
    return str(value)


def record_spans(
    view: memoryview, at: int, lengths: Sequence[int], end: int, *, what: str, source: str
) -> list[memoryview]:
    """The fields of a record of ``lengths`` bytes each, laid end to end from ``at``; a
    record that does not end at ``end`` (its file's offsets table) is an error naming
    ``what`` (``"sample 3 of 'shard.00000.mds'"``)."""
    spans = []
    for length in lengths:
        spans.append(view[at : at + length])
        at += length
    if at != end:
        raise ConvertError(f"{what} ends at byte {at}; the file's offsets say {end}", source=source)
    return spans


def source_files(paths: Sequence[Path]) -> tuple[tuple[str, int, int], ...]:
    """``(path, size, mtime_ns)`` of each file."""
    out = []
    for path in paths:
        st = os.stat(path)
        out.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(out)
