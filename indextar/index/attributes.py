"""Per-sample attributes in a shard's index: optional tables, one column per field.

An index built with ``attributes_from="json"`` (:mod:`indextar.index.attribute_json`) or given
columns by ``import_attributes`` (:mod:`indextar.index.attribute_import`) has an
``attributes`` table, one row per sample, with the tables that say where each column
came from and which samples have none. This module writes those tables and reads what
they hold. They exist only in an index with attributes; the format version does not
change, and an index without them reads as before.

Fields become typed columns, not JSON text queried through ``json_extract``: measured
on 10,000 samples of five fields, a two-condition query took 1.3 ms against 7.1 ms,
the table was 2.5x smaller (0.51 MB against 1.29 MB) and written 3x faster. A nested
value (an object or a list) is stored as its JSON text, which SQLite's JSON functions
read (``json_extract(tags, '$[0]')``).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .extensions import sqlitebulk

__all__ = [
    "AttributeTable",
    "ATTRIBUTES_TABLE",
    "MAX_COLUMNS",
    "RESERVED_NAMES",
    "sql_value",
    "write_attributes",
    "has_attribute_table",
    "json_source",
    "has_source",
    "attribute_columns",
    "attribute_sources",
    "attribute_errors",
]

ATTRIBUTES_TABLE = "attributes"
SOURCES_TABLE = "attribute_columns"
ERRORS_TABLE = "attribute_errors"

# The optional tables' DDL, run only for an index with attributes (never by schema.sql).
_DDL = """
CREATE TABLE IF NOT EXISTS attribute_columns (
    name   TEXT PRIMARY KEY,  -- the column of attributes
    type   TEXT NOT NULL,     -- its declared SQLite type ("" when values are mixed)
    source TEXT NOT NULL      -- where it came from: "json:<ext>" or "import:<file name>"
);
CREATE TABLE IF NOT EXISTS attribute_errors (
    sample_id INTEGER PRIMARY KEY,  -- samples.sample_id of a sample with no attributes
    message   TEXT NOT NULL         -- why: a missing member, malformed JSON, ...
);
"""

Value = int | float | str | bytes | None

RESERVED_NAMES = frozenset(
    {"__sample__", "__key__", "__first__", "__count__", "__shard__", "__index__"}
)
"""Names a selection gives the index's own columns, or ``indextar query --json`` its
own fields; no attribute may take one (in any case: SQLite column names ignore it)."""

MAX_COLUMNS = 1996
"""The most attribute columns an index holds: SQLite's default limit of 2,000 columns
(a table's, and a query result's), less the 4 a selection's view of each sample adds
(``__sample__``, ``__key__``, ``__first__``, ``__count__``). Not SQLite's compiled limit
of this process: an index must open in any SQLite."""


@dataclass(frozen=True, slots=True)
class AttributeTable:
    """One shard's attributes, column by column, ready to be written into its index.

    Attributes
    ----------
    num_samples
        Samples of the shard; every column has this many values.
    columns
        Column name to one value per sample (``None``: NULL), in first-seen order.
    source
        Where the columns came from: ``"json:<ext>"`` or ``"import:<file name>"``.
    errors
        ``(sample number, message)`` of each sample that has no attributes.
    """

    num_samples: int
    columns: dict[str, list[Value]]
    source: str
    errors: list[tuple[int, str]]


def sql_value(value: object) -> Value:
    """A JSON (or imported) value as SQLite stores it: bools as 0/1, integers beyond 64
    bits as text, bytes as a BLOB, nested values as JSON text, anything else (an
    imported date) as its ``str``."""
    if value is None or isinstance(value, str | float):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 63) else str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    return str(value)  # an imported date or decimal: "2024-02-29" compares as text


def _declared_type(values: Iterable[Value]) -> str:
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if kinds <= {int}:
        return "INTEGER"
    if kinds <= {int, float}:
        return "REAL"
    if kinds == {str}:
        return "TEXT"
    return ""  # mixed: no affinity, each value keeps its own type


def quote(name: str) -> str:
    """``name`` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def write_attributes(
    conn: sqlite3.Connection, table: AttributeTable, *, path: Path | None = None
) -> None:
    """Create the attribute tables in an index being written and fill them.

    An index that already has attributes gets these columns added, or replaced where
    the names are taken (in any case, as SQLite compares them): a replaced column is
    dropped and added again, so that it takes the new values' type and name. ``conn``
    may be inside the caller's write transaction; if it is not, this call is one (or,
    for a fresh table and with ``path``, the index file's path, two: its rows go in
    through ``_sqlitebulk.c``'s own connection, where built).
    Field names reach the SQL only as quoted identifiers (:func:`quote`), types only
    from :func:`_declared_type`'s four; every value is a parameter.
    """
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    _run_ddl(conn)
    have = {name.lower(): name for name in attribute_columns(conn)}
    declared = {name: _declared_type(values) for name, values in table.columns.items()}
    if not _has_table(conn, ATTRIBUTES_TABLE):  # a fresh table: every row in one insert
        columns = "".join(f", {quote(name)} {declared[name]}" for name in table.columns)
        conn.execute(f"CREATE TABLE attributes (__sample__ INTEGER PRIMARY KEY{columns})")
        marks = ", ?" * len(table.columns)
        bulk = sqlitebulk() if own and path is not None else None
        if bulk is not None and path is not None:
            conn.execute("COMMIT")  # the C writer's connection writes next
            sql = f"INSERT INTO attributes VALUES (?{marks})"
            bulk.insert_values(
                os.fspath(path), sql, table.num_samples, list(table.columns.values())
            )
            conn.execute("BEGIN")
        else:
            conn.executemany(
                f"INSERT INTO attributes VALUES (?{marks})",
                zip(range(table.num_samples), *table.columns.values()),
            )
    else:  # columns added to an index's table, or replaced where the names are taken
        for name, values in table.columns.items():
            old = have.get(name.lower())
            if old is not None:  # dropped, so that the column takes the new type
                column = quote(old)
                conn.execute(f"ALTER TABLE attributes DROP COLUMN {column}")
                conn.execute("DELETE FROM attribute_columns WHERE name = ?", (old,))
            column = quote(name)
            conn.execute(f"ALTER TABLE attributes ADD COLUMN {column} {declared[name]}")
            conn.executemany(
                f"UPDATE attributes SET {column} = ? WHERE __sample__ = ?",
                ((value, row) for row, value in enumerate(values)),
            )
    conn.executemany(
        "INSERT OR REPLACE INTO attribute_columns VALUES (?, ?, ?)",
        ((name, declared[name], table.source) for name in table.columns),
    )
    conn.executemany(
        "INSERT OR REPLACE INTO attribute_errors VALUES (?, ?)",
        ((sample, f"{table.source}: {message}") for sample, message in table.errors),
    )
    if own:
        conn.execute("COMMIT")


def _run_ddl(conn: sqlite3.Connection) -> None:
    """The tables' DDL, a statement at a time (``executescript`` would commit)."""
    for sql in _DDL.split(";"):
        if sql.strip():
            conn.execute(sql)


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
    return row.fetchone() is not None


def has_attribute_table(conn: sqlite3.Connection) -> bool:
    """Whether an index has the optional ``attributes`` table."""
    return _has_table(conn, ATTRIBUTES_TABLE)


def json_source(ext: str) -> str:
    """The source recorded for attributes read from each sample's ``ext`` member."""
    return f"json:{ext}"


def has_source(conn: sqlite3.Connection, source: str) -> bool:
    """Whether some of an index's attributes came from ``source`` (``"json:json"``): a
    column does, or a sample it recorded in ``attribute_errors`` (a shard whose every
    member failed has no column)."""
    if _has_table(conn, SOURCES_TABLE):
        row = conn.execute("SELECT 1 FROM attribute_columns WHERE source = ? LIMIT 1", (source,))
        if row.fetchone() is not None:
            return True
    if not _has_table(conn, ERRORS_TABLE):
        return False
    prefix = f"{source}: "  # write_attributes' messages begin with their source
    row = conn.execute(
        "SELECT 1 FROM attribute_errors WHERE substr(message, 1, ?) = ? LIMIT 1",
        (len(prefix), prefix),
    )
    return row.fetchone() is not None


def attribute_columns(conn: sqlite3.Connection) -> list[str]:
    """The attribute columns of an index, in table order; empty if it has none."""
    if not _has_table(conn, ATTRIBUTES_TABLE):
        return []
    rows = conn.execute("SELECT name FROM pragma_table_info('attributes') ORDER BY cid")
    return [str(name) for (name,) in rows if name != "__sample__"]


def attribute_sources(conn: sqlite3.Connection) -> dict[str, str]:
    """Each attribute column's source (``"json:json"``, ``"import:scores.parquet"``)."""
    if not _has_table(conn, SOURCES_TABLE):
        return {}
    rows = conn.execute("SELECT name, source FROM attribute_columns ORDER BY name")
    return {str(name): str(source) for name, source in rows}


def attribute_errors(conn: sqlite3.Connection) -> list[tuple[int, str]]:
    """``(sample number, message)`` of every sample recorded without attributes."""
    if not _has_table(conn, ERRORS_TABLE):
        return []
    rows = conn.execute("SELECT sample_id, message FROM attribute_errors ORDER BY sample_id")
    return [(int(sample), str(message)) for sample, message in rows]
