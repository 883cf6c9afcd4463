"""Joining a parquet table into the indexes by key: import_attributes (issue 16)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import indextar
from indextar.index.attribute_import import import_attributes
from indextar.index.attributes import attribute_sources


def _shard(make_tar: Callable[..., Path], name: str, keys: list[str], *, meta: bool) -> Path:
    members: dict[str, bytes] = {}
    for i, key in enumerate(keys):
        members[f"{key}.txt"] = key.encode()
        members[f"{key}.json"] = json.dumps({"score": i, "clip": -1.0}).encode()
    path = make_tar(members, name=name)
    indextar.build_index(path, attributes_from="json" if meta else None)
    return path


def _column(shard: Path, name: str) -> list[object]:
    with sqlite3.connect(indextar.index_path(shard)) as conn:
        return [v for (v,) in conn.execute(f'SELECT "{name}" FROM attributes ORDER BY __sample__')]


@pytest.fixture
def two_shards(make_tar: Callable[..., Path]) -> list[Path]:
    return [
        _shard(make_tar, "a.tar", [f"a{i}" for i in range(6)], meta=False),
        _shard(make_tar, "b.tar", [f"b{i}" for i in range(5)], meta=True),
    ]


def test_rows_join_by_key_missing_ones_are_null(two_shards: list[Path], tmp_path: Path) -> None:
    a, b = two_shards
    table = tmp_path / "scores.parquet"
    keys = ["b3", "a0", "a2", "zz", "b0", "a5"]  # any order; "zz" matches no sample
    pq.write_table(
        pa.table(
            {
                "key": keys,
                "clip": [0.3, 0.1, 0.2, 9.9, 0.4, 0.5],
                "caption": ["x", "y", None, "w", "v", "u"],
                "boxes": [[1], [2, 3], [], [4], [5], [6]],
            }
        ),
        table,
    )
    before = [indextar.index_path(s).stat().st_ino for s in two_shards]
    report = import_attributes([str(a), str(b)], table)
    assert (report.shards, report.samples, report.matched) == (2, 11, 5)
    assert (report.missing, report.unused, report.columns) == (6, 1, ("clip", "caption", "boxes"))
    assert _column(a, "clip") == [0.1, None, 0.2, None, None, 0.5]
    assert _column(a, "caption") == ["y", None, None, None, None, "u"]
    assert _column(a, "boxes") == ["[2,3]", None, "[]", None, None, "[6]"]
    # b had "clip" from its JSON: replaced by the table's; its "score" stays.
    assert _column(b, "clip") == [0.4, None, None, 0.3, None]
    assert _column(b, "score") == [0, 1, 2, 3, 4]
    with sqlite3.connect(indextar.index_path(b)) as conn:
        sources = attribute_sources(conn)
    assert sources == {
        "boxes": "import:scores.parquet",
        "caption": "import:scores.parquet",
        "clip": "import:scores.parquet",
        "score": "json:json",
    }
    # Each index was replaced by a new file (renamed into place), and still verifies.
    after = [indextar.index_path(s).stat().st_ino for s in two_shards]
    assert all(x != y for x, y in zip(before, after))
    assert not list(tmp_path.glob(".*.tmp"))
    indextar.open_index(a)
    ds = indextar.IndexedTarDataset([str(a), str(b)])
    assert [s["__key__"] for s in ds.where("clip > 0.15", cache_dir=False)] == [
        "a2",
        "a5",
        "b0",
        "b3",
    ]


def _untouched(shards: list[Path]) -> Callable[[], bool]:
    inodes = [indextar.index_path(s).stat().st_ino for s in shards]
    return lambda: [indextar.index_path(s).stat().st_ino for s in shards] == inodes


def test_a_key_on_two_rows_is_refused(two_shards: list[Path], tmp_path: Path) -> None:
    table = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"key": ["a1", "b2", "a1"], "clip": [1.0, 2.0, 3.0]}), table)
    untouched = _untouched(two_shards)
    with pytest.raises(indextar.SampleAttributeError, match=r"1 keys on more than one row.*'a1'"):
        import_attributes(two_shards, table)
    assert untouched()


def test_missing_fail_names_the_sample_and_writes_nothing(
    two_shards: list[Path], tmp_path: Path
) -> None:
    table = tmp_path / "partial.parquet"
    keys = [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(5) if i != 3]
    pq.write_table(pa.table({"key": keys, "clip": [1.0] * len(keys)}), table)
    untouched = _untouched(two_shards)
    with pytest.raises(indextar.SampleAttributeError, match="1 of 5 samples have no row") as info:
        import_attributes(two_shards, table, missing="fail")
    assert info.value.key == "b3" and info.value.shard == str(two_shards[1])
    assert untouched()  # not even the first shard, which matched fully


def test_bad_tables_are_refused(two_shards: list[Path], tmp_path: Path) -> None:
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [1, 2], "clip": [1.0, None]}), table)
    with pytest.raises(indextar.SampleAttributeError, match="no key column 'key'"):
        import_attributes(two_shards, table)
    with pytest.raises(indextar.SampleAttributeError, match=r"no columns \['nope'\]"):
        import_attributes(two_shards, table, key="id", columns=["nope"])
    pq.write_table(pa.table({"key": ["a1", None], "clip": [1.0, 2.0]}), table)
    with pytest.raises(indextar.SampleAttributeError, match="1 rows without a key"):
        import_attributes(two_shards, table)


def test_integer_keys_and_a_stale_shard(make_tar: Callable[..., Path], tmp_path: Path) -> None:
    shard = _shard(make_tar, "n.tar", ["0001", "0002", "17"], meta=False)
    table = tmp_path / "n.parquet"
    pq.write_table(pa.table({"key": [17, 2], "w": [5, 6]}), table)
    report = import_attributes([shard], table, columns=["w"])
    assert report.matched == 1 and _column(shard, "w") == [None, None, 5]  # "17" only
    with open(shard, "r+b") as f:
        f.seek(700)
        f.write(b"!")
    with pytest.raises(indextar.StaleIndexError):
        import_attributes([shard], table)


def test_binary_and_date_columns(make_tar: Callable[..., Path], tmp_path: Path) -> None:
    import datetime

    shard = _shard(make_tar, "d.tar", ["x", "y"], meta=False)
    table = tmp_path / "d.parquet"
    day = datetime.date(2024, 2, 29)
    pq.write_table(
        pa.table({"key": ["x", "y"], "hash": [b"\x00\xff", None], "day": [day, None]}), table
    )
    import_attributes([shard], table)
    assert _column(shard, "hash") == [b"\x00\xff", None]
    assert _column(shard, "day") == ["2024-02-29", None]  # ISO text: compares in order


def test_an_empty_table_leaves_every_sample_null(two_shards: list[Path], tmp_path: Path) -> None:
    a, _ = two_shards
    table = tmp_path / "empty.parquet"
    pq.write_table(
        pa.table({"key": pa.array([], pa.string()), "clip": pa.array([], pa.float64())}), table
    )
    report = import_attributes([str(a)], table)
    assert (report.samples, report.matched, report.missing, report.unused) == (6, 0, 6, 0)
    assert _column(a, "clip") == [None] * 6


def test_meta_refuses_to_drop_imported_columns(two_shards: list[Path], tmp_path: Path) -> None:
    a, b = two_shards  # a: built without meta; b: with attributes_from="json"
    table = tmp_path / "clip.parquet"
    pq.write_table(pa.table({"key": ["a1", "b1"], "clip": [0.5, 0.6]}), table)
    import_attributes([str(a), str(b)], table)
    untouched = _untouched([a, b])
    # a's attributes are all imported: a rebuild for its JSON members would drop them.
    with pytest.raises(indextar.IndextarError, match=r"imported from 'clip.parquet'.*force=True"):
        indextar.build_index(a, attributes_from="json")
    assert indextar.build_index(b, attributes_from="json").has_attributes("json")  # reused as it is
    assert untouched()
    rebuilt = indextar.build_index(a, attributes_from="json", force=True)
    assert rebuilt.has_attributes("json") and rebuilt.imported_from() == []
    assert _column(a, "score") == list(range(6))
