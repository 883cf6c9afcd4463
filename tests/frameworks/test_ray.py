"""indextar.ray.read_indextar on a local Ray: rows, columns, ``where`` read from the
indexes before any byte, and read tasks cut into ranges of samples."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

import indextar  # noqa: E402
import indextar.ray  # noqa: E402
from indextar.errors import SelectionError  # noqa: E402

SHARDS, PER_SHARD = 3, 40


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """One local Ray for the module: starting one takes seconds."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def write_shards(folder: Path, pad: int = 0) -> str:
    """Shards of samples with a ``bin`` member (``pad`` bytes longer), a ``json`` label
    (indexed as an attribute) and, in one sample in four, a ``txt``; their pattern."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(SHARDS):
        path = folder / f"part-{shard}.tar"
        with indextar.TarWriter(path, index=False) as sink:
            for i in range(PER_SHARD):
                sample = {
                    "__key__": f"s{shard}-{i:03d}",
                    "bin": f"{shard}/{i};".encode() * (1 + i % 7) + b"-" * pad,
                    "json": json.dumps({"label": i % 10}).encode(),
                }
                if i % 4 == 0:
                    sample["txt"] = b"note"
                sink.write(sample)
        indextar.build_index(path, attributes_from="json")
    return str(folder / f"part-{{0..{SHARDS - 1}}}.tar")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_shards(tmp_path_factory.mktemp("ray"))


def test_rows_are_the_datasets_samples_with_a_column_per_extension(
    ray_session: None, shards: str
) -> None:
    ds = indextar.IndexedTarDataset(shards)
    rows = sorted(indextar.ray.read_indextar(shards).take_all(), key=lambda r: r["__index__"])
    assert [r["__index__"] for r in rows] == list(range(len(ds)))
    for row in rows[:9]:
        sample = ds[row["__index__"]]
        assert row == {"txt": None, **sample}
    # keys= picks the columns; where= the rows, from the indexes.
    kept = indextar.ray.read_indextar(shards, where="label = 3", keys=["bin", "txt"])
    assert kept.columns() == ["__key__", "__shard__", "__index__", "bin", "txt"]
    got = sorted((r["__key__"], r["bin"]) for r in kept.take_all())
    view = ds.where("label = 3")
    assert got == sorted((view[i]["__key__"], view[i]["bin"]) for i in range(len(view)))
    assert len(got) == 12


def test_where_reads_no_byte_of_the_samples_it_drops(tmp_path: Path) -> None:
    pattern = write_shards(tmp_path, pad=8 << 10)
    overwritten = 0
    for shard in indextar.expand_shards(pattern):
        spans = indextar.open_index(shard).load_arrays().samples[:, :2]
        st = os.stat(shard)
        # The index's fingerprint is the first and last 64 KiB: what lies between may
        # change unseen, as bit rot would.
        middle = range(64 << 10, st.st_size - (64 << 10))
        with open(shard, "r+b") as f:
            for i, (start, end) in enumerate(spans.tolist()):
                if i % 10 != 3 and start in middle and end in middle:  # "label = 3" drops it
                    f.seek(start)
                    f.write(b"\xff" * (end - start))
                    overwritten += 1
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # its stat as indexed
    assert overwritten >= SHARDS * 10
    source = indextar.ray.IndextarDatasource(pattern, where="label = 3")
    tasks = source.get_read_tasks(4)
    assert sum(t.metadata.num_rows for t in tasks) == 12
    rows = [row for task in tasks for block in task() for row in block.to_pylist()]
    assert [r["__key__"][-3:] for r in rows] == ["003", "013", "023", "033"] * SHARDS
    assert all(r["bin"].startswith(b"%d/" % int(r["__key__"][1])) for r in rows)
    with pytest.raises(indextar.IndextarError):  # what a read of a dropped one would do
        [
            block
            for task in indextar.ray.IndextarDatasource(pattern).get_read_tasks(1)
            for block in task()
        ]


def test_read_tasks_are_ranges_of_samples_in_order(shards: str) -> None:
    source = indextar.ray.IndextarDatasource(shards, where="label != 0")
    assert source.positions.size == 108
    assert [t.metadata.num_rows for t in source.get_read_tasks(8)] == [108]  # too few to cut
    indextar.ray.datasource.MIN_TASK_ROWS = 20  # smaller tasks, to see them cut
    try:
        tasks = source.get_read_tasks(4)
    finally:
        indextar.ray.datasource.MIN_TASK_ROWS = 256
    assert [t.metadata.num_rows for t in tasks] == [27] * 4
    ranges = [[r["__index__"] for b in task() for r in b.to_pylist()] for task in tasks]
    assert sum(ranges, []) == source.positions.tolist()
    assert source.estimate_inmemory_data_size() == sum(t.metadata.size_bytes for t in tasks)


def test_a_bad_where_is_refused_before_ray_runs_anything(shards: str) -> None:
    with pytest.raises(SelectionError, match="no such column: nope"):
        indextar.ray.read_indextar(shards, where="nope > 1")
