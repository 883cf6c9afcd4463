"""ShardWriter(..., attributes_from="json") stores each sample's attributes as it writes
(issue 16)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import indextar


def _table(index: Path) -> tuple[list[tuple], list[tuple], list[tuple]]:
    with sqlite3.connect(index) as conn:
        return (
            conn.execute("SELECT * FROM attributes ORDER BY __sample__").fetchall(),
            conn.execute("SELECT * FROM attribute_columns ORDER BY name").fetchall(),
            conn.execute("SELECT * FROM attribute_errors ORDER BY sample_id").fetchall(),
        )


def _sample(i: int) -> dict[str, object]:
    record = {"score": i / 4, "w": 64 * (i % 5), "lang": "en" if i % 2 else "de"}
    if i % 3 == 0:
        record["extra"] = [i, {"deep": True}]
    return {"__key__": f"k{i:04d}", "txt": f"text {i}", "json": record}


def test_the_writer_stores_what_a_build_reads(tmp_path: Path) -> None:
    with indextar.ShardWriter(
        str(tmp_path / "w-%03d.tar"), maxcount=7, attributes_from="json"
    ) as sink:
        for i in range(20):
            sink.write(_sample(i))
    assert len(sink.shards) == 3
    written = [_table(ix.path) for ix in sink.indexes]
    for shard, tables in zip(sink.shards, written):
        # read from the tar
        rebuilt = indextar.build_index(shard, attributes_from="json", force=True)
        assert _table(rebuilt.path) == tables
    ds = indextar.IndexedTarDataset(sink.shards)
    view = ds.where("score >= 2 AND extra IS NOT NULL", cache_dir=False)
    assert [s["__key__"] for s in view] == ["k0009", "k0012", "k0015", "k0018"]


def test_a_bad_sample_is_refused_before_it_is_written(tmp_path: Path) -> None:
    shard = tmp_path / "one.tar"
    with indextar.TarWriter(shard, attributes_from="json") as sink:
        sink.write(_sample(0))
        with pytest.raises(indextar.SampleAttributeError, match="not valid JSON") as info:
            sink.write({"__key__": "bad", "txt": "x", "json": b"{nope"})
        assert info.value.key == "bad" and info.value.shard == str(shard)
        with pytest.raises(indextar.SampleAttributeError, match="has no 'json' member"):
            sink.write({"__key__": "bare", "txt": "x"})
        sink.write(_sample(1))  # the writer stays usable
    ix = indextar.open_index(shard)
    assert ix.keys() == ["k0000", "k0001"]
    rows, _, errors = _table(ix.path)
    assert [r[0] for r in rows] == [0, 1] and errors == []


def test_skip_records_the_sample(tmp_path: Path) -> None:
    shard = tmp_path / "skip.tar"
    with indextar.TarWriter(shard, attributes_from="json", on_error="skip") as sink:
        sink.write(_sample(0))
        sink.write({"__key__": "bad", "txt": "x", "json": b"[1]"})
        sink.write(_sample(3))
    rows, _, errors = _table(indextar.index_path(shard))
    assert rows[1] == (1, None, None, None, None)
    assert errors == [(1, "json:json: its 'json' member is a JSON list, not an object")]
    assert json.loads(rows[2][4]) == [3, {"deep": True}]


def test_compressed_shards_get_attributes_too(tmp_path: Path) -> None:
    with indextar.ShardWriter(
        str(tmp_path / "z-%03d.tar.zst"), maxcount=50, attributes_from="json", compress="zstd"
    ) as sink:
        for i in range(12):
            sink.write(_sample(i))
    ds = indextar.IndexedTarDataset(sink.shards)
    view = ds.where("w = 0", cache_dir=False)
    assert [s["txt"] for s in view] == [b"text 0", b"text 5", b"text 10"]
    with pytest.raises(indextar.IndextarError, match="compressed"):
        indextar.build_index(sink.shards[0], attributes_from="json", force=True)


def test_meta_needs_an_index(tmp_path: Path) -> None:
    with pytest.raises(indextar.WriterError, match="needs index=True"):
        indextar.ShardWriter(str(tmp_path / "n-%03d.tar"), index=False, attributes_from="json")
