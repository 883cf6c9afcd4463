"""indextar.grain.source in real Grain pipelines: shuffled batches, Grain's reading
threads, its DataLoader's checkpoints, and a multiprocess pipeline killed and resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

grain = pytest.importorskip("grain")

import indextar  # noqa: E402
import indextar.grain  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def write_shards(folder: Path, shards: int, per_shard: int) -> str:
    """``shards`` shards of ``per_shard`` samples ``s<shard>-<i>``: a ``bin`` member
    that names the sample and a ``json`` label (an attribute in the index); their
    brace pattern."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        with indextar.TarWriter(folder / f"part-{shard}.tar", index=False) as sink:
            for i in range(per_shard):
                sink.write(
                    {
                        "__key__": f"s{shard}-{i:03d}",
                        "bin": f"sample {shard}/{i} ".encode() * 20,
                        "json": json.dumps({"label": i % 10}).encode(),
                    }
                )
        indextar.build_index(folder / f"part-{shard}.tar", attributes_from="json")
    return str(folder / f"part-{{0..{shards - 1}}}.tar")


def key(sample: dict[str, object]) -> object:
    return sample["__key__"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_shards(tmp_path_factory.mktemp("grain"), 3, 20)


def test_a_shuffled_batched_pipeline_reads_every_sample_once_as_grain_orders_them(
    shards: str,
) -> None:
    ds = indextar.IndexedTarDataset(shards)
    source = indextar.grain.source(ds)
    assert isinstance(source, grain.sources.RandomAccessDataSource)
    pipeline = grain.MapDataset.source(source).shuffle(seed=5).map(key).batch(8)
    # Grain's own order over the same keys held in a list: the source changes nothing.
    keys = [ds[i]["__key__"] for i in range(len(ds))]
    expected = grain.MapDataset.source(keys).shuffle(seed=5).batch(8)
    got = [batch.tolist() for batch in pipeline.to_iter_dataset()]
    assert got == [batch.tolist() for batch in expected]
    assert sorted(sum(got, [])) == sorted(keys)
    # Grain's batched read goes through the dataset's __getitems__, in the order asked.
    batch = grain.MapDataset.source(source)._getitems([7, 59, 0])
    assert [s["__key__"] for s in batch] == ["s0-007", "s2-019", "s0-000"]


def test_a_where_view_is_a_source_and_its_repr_names_its_samples(shards: str) -> None:
    ds = indextar.IndexedTarDataset(shards)
    view = ds.where("label = 3")
    source = indextar.grain.source(view)
    assert len(source) == 6 and source.paths == ds.shards
    assert {s["__key__"][-3:] for s in source._getitems(range(6))} == {"003", "013"}
    assert repr(source) != repr(indextar.grain.source(ds.where("label = 4")))
    assert repr(source) == repr(indextar.grain.source(ds.where("label = 3")))


def test_grains_reading_threads_get_the_right_samples_past_max_open_shards(
    tmp_path: Path,
) -> None:
    # 16 threads (Grain's default ReadOptions) over 8 shards with room for one open
    # shard: each read evicts the shard another thread is reading. Unlocked, the
    # dataset's cache of open shards raised KeyError or returned another shard's bytes.
    pattern = write_shards(tmp_path, 8, 4)
    ds = indextar.IndexedTarDataset(pattern, max_open_shards=1)
    source = indextar.grain.source(ds)
    expected = {i: (s["__key__"], s["bin"]) for i, s in enumerate(map(ds.__getitem__, range(32)))}
    order = [(i * 5) % 32 for i in range(2400)]  # another shard at every read

    def read(i: int) -> tuple[int, tuple[object, object]]:
        sample = source[i]
        return i, (sample["__key__"], sample["bin"])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: the race shows on every run
    try:
        with ThreadPoolExecutor(16) as pool:
            wrong = [i for i, got in pool.map(read, order) if got != expected[i]]
    finally:
        sys.setswitchinterval(interval)
    assert not wrong
    through_grain = (
        grain.MapDataset.source(source)
        .shuffle(seed=1)
        .to_iter_dataset(grain.ReadOptions(num_threads=16))
    )
    assert sorted(s["__index__"] for s in through_grain) == list(range(32))


def test_grains_dataloader_checkpoint_resumes_and_refuses_another_source(shards: str) -> None:
    ds = indextar.IndexedTarDataset(shards)

    def loader(source: indextar.grain.GrainSource) -> grain.DataLoader:
        sampler = grain.samplers.IndexSampler(
            len(source),
            shuffle=True,
            seed=3,
            num_epochs=1,
            shard_options=grain.sharding.NoSharding(),
        )
        return grain.DataLoader(data_source=source, sampler=sampler, worker_count=0)

    whole = [s["__key__"] for s in loader(indextar.grain.source(ds))]
    first = iter(loader(indextar.grain.source(ds)))
    head = [next(first)["__key__"] for _ in range(17)]
    state = first.get_state()
    resumed = iter(loader(indextar.grain.source(indextar.IndexedTarDataset(shards))))
    resumed.set_state(state)
    assert head + [s["__key__"] for s in resumed] == whole
    # As many samples (the sampler's repr is the same), but not the same ones.
    saved = iter(loader(indextar.grain.source(ds.exclude(["s0-000"]))))
    for _ in range(3):
        next(saved)
    other = iter(loader(indextar.grain.source(ds.exclude(["s0-001"]))))
    with pytest.raises(ValueError, match="DataSource in checkpoint does not match"):
        other.set_state(saved.get_state())


def test_source_refuses_what_is_not_map_style() -> None:
    with pytest.raises(TypeError, match=r"indextar.grain.source\(\) takes a map-style dataset"):
        indextar.grain.source(iter([1, 2]))  # type: ignore[arg-type]


@pytest.mark.slow  # two pipelines of three processes each, spawned
def test_a_multiprocess_pipeline_killed_resumes_exactly_from_its_checkpoint(
    shards: str, tmp_path: Path
) -> None:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}", OMP_NUM_THREADS="1")
    run = [sys.executable, str(HERE / "_grain_run.py"), shards, str(tmp_path)]
    killed = subprocess.run(
        [*run, "--kill-after", "4"], env=env, capture_output=True, text=True, timeout=240,
        start_new_session=True,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr
    assert len(list(tmp_path.glob("step-*.json"))) == 5  # steps 0..4, then killed
    resumed = subprocess.run(
        [*run, "--workers", "2"], env=env, capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr
    steps = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("step-*.json"))]
    assert [s["step"] for s in steps] == list(range(15))  # 60 samples in batches of 4
    sys.path.insert(0, str(HERE))
    try:
        from _grain_run import pipeline
    finally:
        sys.path.remove(str(HERE))
    expected = [batch.tolist() for batch in pipeline(shards)]
    assert [s["keys"] for s in steps] == expected


def test_import_indextar_imports_neither_grain_nor_ray() -> None:
    code = (
        "import sys, indextar\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('grain', 'ray', 'array_record')"
        " or m in ('indextar.grain', 'indextar.ray')]\n"
        "assert not loaded, loaded\n"
        "import indextar.grain\n"
        "assert 'grain' not in sys.modules, 'indextar.grain imports grain'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
