"""Attributes that once came out wrong without an error (issue 26, 1a, 1b and 1f):
a JSON member with a byte order mark, reserved and too many field names, an import
that replaces a column, and a selection over a shard indexed without attributes."""

from __future__ import annotations

import codecs
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

import indextar
from indextar.index.attribute_json import MAX_COLUMNS
from indextar.index.attributes import attribute_errors
from indextar.read.selection import where_rows


def _rows(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-32"])
def test_json_members_are_read_as_json_loads_reads_bytes(
    make_tar: Callable[..., Path], encoding: str
) -> None:
    text = '{"caption": "caf\u00e9", "w": 3}'.encode(encoding)
    assert json.loads(text) == {"caption": "caf\u00e9", "w": 3}  # what webdataset reads
    shard = make_tar({"a.json": text, "b.json": codecs.BOM_UTF8 + b'{"w": 4}'})
    ix = indextar.build_index(shard, meta="json")
    rows = _rows(ix.path, "SELECT caption, w FROM attributes ORDER BY __sample__")
    assert rows == [("caf\u00e9", 3), (None, 4)]


@pytest.mark.parametrize("name", ["__shard__", "__index__", "__KEY__", "__Sample__"])
def test_fields_named_as_query_output_fields_are_refused(
    make_tar: Callable[..., Path], name: str
) -> None:
    shard = make_tar({"a.json": b'{"w": 1}', "b.json": json.dumps({name: 1}).encode()})
    with pytest.raises(indextar.SampleAttributeError, match="reserved") as info:
        indextar.build_index(shard, meta="json")
    assert info.value.key == "b"


def _wide(fields: range) -> bytes:
    return json.dumps({f"f{i}": i for i in fields}).encode()


def test_json_wider_than_an_index_holds_is_a_sample_error(make_tar: Callable[..., Path]) -> None:
    shard = make_tar({"a.json": _wide(range(10)), "b.json": _wide(range(2100)), "c.json": b"{}"})
    with pytest.raises(indextar.SampleAttributeError, match=f"at most {MAX_COLUMNS:,}") as info:
        indextar.build_index(shard, meta="json")
    assert info.value.key == "b" and info.value.shard == str(shard)
    # on_error="skip": the sample is logged and recorded, the build goes on.
    ix = indextar.build_index(shard, meta="json", on_error="skip")
    assert len(ix) == 3
    with sqlite3.connect(ix.path) as conn:
        errors = attribute_errors(conn)
    assert [sample for sample, _ in errors] == [1] and "at most" in errors[0][1]
    assert _rows(ix.path, "SELECT f9 FROM attributes ORDER BY __sample__") == [(9,), (None,), (None,)]


def test_the_widest_json_an_index_holds_is_selectable(make_tar: Callable[..., Path]) -> None:
    shard = make_tar({"a.json": _wide(range(MAX_COLUMNS)), "b.json": b'{"f0": 5}'})
    indextar.build_index(shard, meta="json")
    ds = indextar.IndexedTarDataset([shard])
    assert len(ds.where("f0 = 5", cache_dir=False)) == 1
    rows = list(where_rows(ds, "f1 IS NOT NULL"))
    assert len(rows) == 1 and rows[0][f"f{MAX_COLUMNS - 1}"] == MAX_COLUMNS - 1
