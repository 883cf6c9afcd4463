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
from indextar.index.attributes import MAX_COLUMNS, attribute_errors
from indextar.index.verify import verify_index
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
    ix = indextar.build_index(shard, attributes_from="json")
    rows = _rows(ix.path, "SELECT caption, w FROM attributes ORDER BY __sample__")
    assert rows == [("caf\u00e9", 3), (None, 4)]


@pytest.mark.parametrize("name", ["__shard__", "__index__", "__KEY__", "__Sample__"])
def test_fields_named_as_query_output_fields_are_refused(
    make_tar: Callable[..., Path], name: str
) -> None:
    shard = make_tar({"a.json": b'{"w": 1}', "b.json": json.dumps({name: 1}).encode()})
    with pytest.raises(indextar.SampleAttributeError, match="reserved") as info:
        indextar.build_index(shard, attributes_from="json")
    assert info.value.key == "b"


def _wide(fields: range) -> bytes:
    return json.dumps({f"f{i}": i for i in fields}).encode()


def test_json_wider_than_an_index_holds_is_a_sample_error(make_tar: Callable[..., Path]) -> None:
    shard = make_tar({"a.json": _wide(range(10)), "b.json": _wide(range(2100)), "c.json": b"{}"})
    with pytest.raises(indextar.SampleAttributeError, match=f"at most {MAX_COLUMNS:,}") as info:
        indextar.build_index(shard, attributes_from="json")
    assert info.value.key == "b" and info.value.shard == str(shard)
    # on_error="skip": the sample is logged and recorded, the build goes on.
    ix = indextar.build_index(shard, attributes_from="json", on_error="skip")
    assert len(ix) == 3
    with sqlite3.connect(ix.path) as conn:
        errors = attribute_errors(conn)
    assert [sample for sample, _ in errors] == [1] and "at most" in errors[0][1]
    assert _rows(ix.path, "SELECT f9 FROM attributes ORDER BY __sample__") == [
        (9,),
        (None,),
        (None,),
    ]


def test_the_widest_json_an_index_holds_is_selectable(make_tar: Callable[..., Path]) -> None:
    shard = make_tar({"a.json": _wide(range(MAX_COLUMNS)), "b.json": b'{"f0": 5}'})
    indextar.build_index(shard, attributes_from="json")
    ds = indextar.IndexedTarDataset([shard])
    assert len(ds.where("f0 = 5", cache_dir=False)) == 1
    rows = list(where_rows(ds, "f1 IS NOT NULL"))
    assert len(rows) == 1 and rows[0][f"f{MAX_COLUMNS - 1}"] == MAX_COLUMNS - 1


def _nsfw_shard(make_tar: Callable[..., Path]) -> Path:
    shard = make_tar({f"k{i}.json": b'{"NSFW": "UNLIKELY", "w": 1}' for i in range(3)})
    indextar.build_index(shard, attributes_from="json")
    return shard


def test_an_imported_column_replaces_one_of_another_type(
    make_tar: Callable[..., Path], tmp_path: Path
) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    shard = _nsfw_shard(make_tar)
    table = tmp_path / "s.parquet"
    pq.write_table(pa.table({"key": ["k0", "k1", "k2"], "NSFW": [0.9, 10.0, 2.5]}), table)
    indextar.import_attributes([shard], table)
    ds = indextar.IndexedTarDataset([shard])
    assert len(ds.where("NSFW > 5", cache_dir=False)) == 1
    path = indextar.index_path(shard)
    assert _rows(path, "SELECT NSFW, typeof(NSFW) FROM attributes ORDER BY __sample__") == [
        (0.9, "real"),
        (10.0, "real"),
        (2.5, "real"),
    ]
    assert _rows(path, "SELECT name, type, source FROM attribute_columns ORDER BY name") == [
        ("NSFW", "REAL", "import:s.parquet"),
        ("w", "INTEGER", "json:json"),
    ]
    verify_index(shard)


def test_an_imported_column_named_in_another_case_is_refused(
    make_tar: Callable[..., Path], tmp_path: Path
) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    shard = _nsfw_shard(make_tar)
    before = indextar.index_path(shard).read_bytes()
    table = tmp_path / "s.parquet"
    pq.write_table(pa.table({"key": ["k0", "k1", "k2"], "nsfw": [0.9, 10.0, 2.5]}), table)
    with pytest.raises(indextar.SampleAttributeError, match="only in case") as info:
        indextar.import_attributes([shard], table)
    assert info.value.shard == str(shard) and "'NSFW'" in str(info.value)
    assert indextar.index_path(shard).read_bytes() == before  # nothing written
    pq.write_table(pa.table({"key": ["k0"], "s": [1.0], "S": [2.0]}), table)
    with pytest.raises(indextar.SampleAttributeError, match="only in case"):
        indextar.import_attributes([shard], table)


@pytest.mark.parametrize("name", ["__key__", "__shard__", "__index__", "__Sample__"])
def test_imported_columns_named_as_query_fields_are_refused(
    make_tar: Callable[..., Path], tmp_path: Path, name: str
) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    shard = _nsfw_shard(make_tar)
    table = tmp_path / "s.parquet"
    pq.write_table(pa.table({"key": ["k0", "k1", "k2"], name: ["x", "y", "z"]}), table)
    with pytest.raises(indextar.SampleAttributeError, match="reserved"):
        indextar.import_attributes([shard], table)
    assert _rows(indextar.index_path(shard), "SELECT name FROM attribute_columns") == [
        ("NSFW",),
        ("w",),
    ]
