"""indextar.write.convert from parquet (written by pyarrow) and saved Hugging Face datasets
(written by ``datasets``): samples, keys, attributes in the index, skipped rows, byte for
byte determinism, and a conversion killed in a real process and resumed."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from readers import wds_read

from indextar import IndexedTarDataset, build_index
from indextar.errors import ConvertError
from indextar.write.convert import convert, state_path

ROOT = Path(__file__).resolve().parents[2]


def image(i: int) -> bytes:
    return b"\xff\xd8" + bytes([i % 251]) * (50 + i)


def write_parquet(folder: Path, rows: int, *, files: int = 2, group: int = 3) -> Path:
    """``rows`` rows over ``files`` files of row groups of ``group`` rows."""
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-rows // files)
    for f in range(files):
        numbers = range(f * per_file, min(rows, (f + 1) * per_file))
        table = pa.table(
            {
                "image": pa.array([image(i) for i in numbers], pa.binary()),
                "label": [i % 3 for i in numbers],
                "caption": [f"a photo {i}" for i in numbers],
                "tags": [[f"t{i}", "x"] for i in numbers],
                "id": [f"img{i:04d}" for i in numbers],
            }
        )
        pq.write_table(table, folder / f"train-{f:05d}.parquet", row_group_size=group)
    return folder


def attributes(index: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(index) as conn:
        return conn.execute("SELECT * FROM attributes ORDER BY __sample__").fetchall()


def test_parquet_rows_become_samples_and_attributes(tmp_path: Path) -> None:
    src = write_parquet(tmp_path / "src", 10)
    result = convert(src, str(tmp_path / "out" / "d-%04d.tar"), maxcount=4)
    assert (result.rows, result.samples, result.skipped) == (10, 10, {})
    assert [s.samples for s in result.shards] == [4, 4, 2]
    samples = wds_read([s.path for s in result.shards])
    assert [s["__key__"] for s in samples] == [f"{i:09d}" for i in range(10)]
    assert [s["image"] for s in samples] == [image(i) for i in range(10)]
    assert json.loads(samples[7]["json"]) == {
        "label": 1,
        "caption": "a photo 7",
        "tags": ["t7", "x"],
        "id": "img0007",
    }
    first = Path(result.shards[0].path)
    written = attributes(first.with_name(first.name + ".idx.sqlite"))
    assert written[1] == (1, 1, "a photo 1", '["t1","x"]', "img0001")
    # the index holds what a build reading each sample's json member finds
    rebuilt = build_index(first, index_dir=tmp_path / "re", force=True, attributes_from="json")
    assert attributes(rebuilt.path) == written
    ds = IndexedTarDataset([s.path for s in result.shards])
    assert len(ds.where("label = 1")) == 3


def test_key_column_members_and_attributes_chosen(tmp_path: Path) -> None:
    src = write_parquet(tmp_path / "src", 6)
    result = convert(
        src, str(tmp_path / "d-%04d.tar"), key="id", members={"jpg": "image"}, attributes=["label"]
    )
    samples = wds_read([s.path for s in result.shards])
    assert [s["__key__"] for s in samples] == [f"img{i:04d}" for i in range(6)]
    assert sorted(samples[2]) == ["__key__", "jpg", "json"]
    assert json.loads(samples[2]["json"]) == {"label": 2}


def test_skipped_rows_are_counted_by_reason(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": ["a", None, "b.c", "a", "d", "e"],
            "image": [b"1", b"2", b"3", b"4", None, b"6"],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    result = convert(tmp_path / "t.parquet", str(tmp_path / "d-%04d.tar"), key="id")
    assert result.skipped == {
        "duplicate-key": [3],
        "invalid-key": [2],
        "no-data": [4],
        "null-key": [1],
    }
    assert [s["__key__"] for s in wds_read([s.path for s in result.shards])] == ["a", "e"]


def test_bad_options_are_refused(tmp_path: Path) -> None:
    src = write_parquet(tmp_path / "src", 4)
    with pytest.raises(ConvertError, match="no column 'nope'"):
        convert(src, str(tmp_path / "d-%04d.tar"), key="nope")
    with pytest.raises(ConvertError, match="holds values, not bytes"):
        convert(src, str(tmp_path / "d-%04d.tar"), members={"txt": "caption"})
    with pytest.raises(ConvertError, match="member extension '_raw'"):
        convert(src, str(tmp_path / "d-%04d.tar"), members={"_raw": "image"})
    pq.write_table(pa.table({"Score": [1], "score": [2], "png": [b"x"]}), tmp_path / "c.parquet")
    with pytest.raises(ConvertError, match="'Score' and 'score' differ only in case"):
        convert(tmp_path / "c.parquet", str(tmp_path / "d-%04d.tar"))
    with pytest.raises(ConvertError, match="not a dataset of a known format"):
        convert(tmp_path / "d-%04d.tar", str(tmp_path / "x-%04d.tar"))


def test_output_is_the_same_bytes_however_many_processes(tmp_path: Path) -> None:
    src = write_parquet(tmp_path / "src", 11, files=3, group=2)
    one = convert(src, str(tmp_path / "a" / "d-%04d.tar"), maxcount=3, jobs=1)
    two = convert(src, str(tmp_path / "b" / "d-%04d.tar"), maxcount=3, jobs=2)
    assert len(one.shards) == len(two.shards) == 4
    for a, b in zip(one.shards, two.shards):
        assert Path(a.path).read_bytes() == Path(b.path).read_bytes()
        assert attributes(Path(a.path + ".idx.sqlite")) == attributes(Path(b.path + ".idx.sqlite"))


_CONVERT = """
import sys
from indextar.write.convert import convert
convert(sys.argv[1], sys.argv[2], maxcount=2)
"""


def test_a_killed_conversion_resumes_where_it_stopped(tmp_path: Path) -> None:
    src = write_parquet(tmp_path / "src", 100, files=2, group=10)
    pattern = str(tmp_path / "out" / "d-%04d.tar")
    state = state_path(pattern)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", _CONVERT, str(src), pattern], env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            if state.exists() and len(json.loads(state.read_text())["done"]) >= 3:
                break
            time.sleep(0.01)
        assert child.poll() is None, "the conversion finished before it could be killed"
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    done = len(json.loads(state.read_text())["done"])
    assert 3 <= done < 50
    resumed = convert(src, pattern, maxcount=2)
    assert resumed.resumed >= done and resumed.samples == 100
    fresh = convert(src, str(tmp_path / "fresh" / "d-%04d.tar"), maxcount=2, jobs=2)
    for a, b in zip(resumed.shards, fresh.shards, strict=True):
        assert Path(a.path).read_bytes() == Path(b.path).read_bytes()
    assert len(IndexedTarDataset([s.path for s in resumed.shards])) == 100
    with pytest.raises(ConvertError, match="another maxcount"):
        convert(src, pattern, maxcount=3)
    assert convert(src, pattern, maxcount=3, resume=False).resumed == 0


def test_saved_hugging_face_dataset(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    images = []
    for i in range(7):
        Image.new("RGB", (3, 2), (i * 30, 0, 0)).save(tmp_path / f"{i}.png")
        images.append(str(tmp_path / f"{i}.png"))
    data = datasets.Dataset.from_dict(
        {"image": images, "label": [i % 2 for i in range(7)], "text": [f"t{i}" for i in range(7)]}
    ).cast_column("image", datasets.Image())
    data.save_to_disk(str(tmp_path / "hf"), num_shards=2)
    result = convert(
        tmp_path / "hf", str(tmp_path / "d-%04d.tar"), members={"png": "image"}, maxcount=4
    )
    samples = wds_read([s.path for s in result.shards])
    assert [s["png"] for s in samples] == [Path(p).read_bytes() for p in images]
    assert [json.loads(s["json"]) for s in samples] == [
        {"label": i % 2, "text": f"t{i}"} for i in range(7)
    ]
    datasets.DatasetDict({"train": data}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(ConvertError, match="DatasetDict; convert one of its splits"):
        convert(tmp_path / "dict", str(tmp_path / "e-%04d.tar"))


def test_on_a_dask_cluster_the_same_shards(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    src = write_parquet(tmp_path / "src", 9)
    here = convert(src, str(tmp_path / "a" / "d-%04d.tar"), maxcount=4)
    with (
        distributed.LocalCluster(
            n_workers=1,  # in this process: the pool tests already pickle the tasks
            threads_per_worker=2,
            processes=False,
            dashboard_address=None,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        there = convert(
            src, str(tmp_path / "b" / "d-%04d.tar"), maxcount=4, executor=client.get_executor()
        )
    for a, b in zip(here.shards, there.shards, strict=True):
        assert Path(a.path).read_bytes() == Path(b.path).read_bytes()


def test_parquet_image_structs_as_the_hub_stores_them(tmp_path: Path) -> None:
    (tmp_path / "on-disk.jpg").write_bytes(b"from the file")
    images = pa.array(
        [{"bytes": b"embedded", "path": "a.jpg"}, {"bytes": None, "path": "on-disk.jpg"}, None],
        pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    pq.write_table(pa.table({"image": images, "n": [1, 2, 3]}), tmp_path / "hub.parquet")
    result = convert(tmp_path / "hub.parquet", str(tmp_path / "d-%04d.tar"))
    samples = wds_read([s.path for s in result.shards])
    assert [s["image"] for s in samples] == [b"embedded", b"from the file"]
    assert result.skipped == {"no-data": [2]}
