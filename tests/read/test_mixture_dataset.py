"""MixtureDataset and key subsets (issue 14) on real shards, in real DataLoader workers."""

from __future__ import annotations

import collections
import logging
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import tar_bytes
from torch.utils.data import ConcatDataset, DataLoader

import indextar
from indextar.order.weights import part_counts
from indextar.read.subset import KeySubset


def write_shards(folder: Path, name: str, shards: int, per_shard: int) -> str:
    for shard in range(shards):
        members = {
            f"{name}{shard}-{i:04d}.{ext}": f"{name} {shard} {i} {ext}".encode()
            for i in range(per_shard)
            for ext in ("cls", "txt")
        }
        (folder / f"{name}-{shard:02d}.tar").write_bytes(tar_bytes(members))
    return str(folder / f"{name}-{{00..{shards - 1:02d}}}.tar")


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("mixture")
    return {"big": write_shards(folder, "big", 3, 40), "small": write_shards(folder, "small", 2, 5)}


def test_a_mixture_indexes_as_concat_dataset_and_names_each_sample_source(
    parts: dict[str, str],
) -> None:
    big, small = (indextar.IndexedTarDataset(parts[n]) for n in ("big", "small"))
    data = indextar.MixtureDataset({"big": big, "small": small})
    concat = ConcatDataset([big, small])
    assert len(data) == len(concat) == 130 and data.cumulative_sizes == concat.cumulative_sizes
    for i in (0, 119, 120, 129, -1):
        sample = data[i]
        assert sample["__key__"] == concat[i]["__key__"]
        assert sample["__source__"] == ("big" if (i % 130) < 120 else "small")
    assert data.locate(125) == ("small", 5) and data.locate(-1) == ("small", 9)
    batch = data.__getitems__([125, 3, 121])
    assert [s["__key__"] for s in batch] == [data[i]["__key__"] for i in (125, 3, 121)]
    assert [s["__source__"] for s in batch] == ["small", "big", "small"]
    numbered = indextar.MixtureDataset([small, big])
    assert numbered[0]["__source__"] == 0 and numbered.names == (0, 1)
    with pytest.raises(indextar.SampleIndexError, match="out of range"):
        data[130]
    tuples = indextar.MixtureDataset([indextar.IndexedTarDataset(parts["small"], keys="cls txt")])
    assert tuples[0] == (b"small 0 0 cls", b"small 0 0 txt")  # not a dict: as the part gives it
    # Cheap to send to workers: the parts and a few numbers.
    assert len(pickle.dumps(data)) < len(pickle.dumps(big)) + len(pickle.dumps(small)) + 600


def test_torch_concat_dataset_takes_weights_as_a_list(parts: dict[str, str]) -> None:
    big, small = (indextar.IndexedTarDataset(parts[n]) for n in ("big", "small"))
    concat = ConcatDataset([big, small])
    sampler = indextar.ResumableSampler(concat, weights=[0.5, 0.5], epoch_length=40, seed=1)
    drawn = list(sampler)
    assert sum(i >= 120 for i in drawn) == 20  # small (10 samples) drawn twice over
    assert collections.Counter(i for i in drawn if i >= 120) == {i: 2 for i in range(120, 130)}
    with pytest.raises(ValueError, match="weights by name need a MixtureDataset"):
        indextar.ResumableSampler(concat, weights={"big": 1, "small": 1})


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_blended_deduplicated_dataloader_in_workers(
    parts: dict[str, str], context: str, tmp_path: Path
) -> None:
    big = indextar.IndexedTarDataset(parts["big"], keys=("__key__", "cls"))
    small = indextar.IndexedTarDataset(parts["small"])
    dropped = [f"big{s}-{i:04d}" for s in range(3) for i in range(0, 40, 4)]  # 30 of 120
    (tmp_path / "dups.txt").write_text("\n".join(dropped) + "\n")
    deduped = big.exclude(tmp_path / "dups.txt")
    data = indextar.MixtureDataset(
        {"big": deduped, "small": small.select(["small1-0002", "small0-0004"])}
    )
    weights = {"big": 0.7, "small": 0.3}
    sampler = indextar.ResumableSampler(data, weights=weights, epoch_length=50, seed=4)
    loader = DataLoader(data, batch_size=8, sampler=sampler, num_workers=2,
                        multiprocessing_context=context, collate_fn=list)  # fmt: skip
    keys = collections.Counter()
    for batch in loader:
        for sample in batch:
            keys[sample[0] if isinstance(sample, tuple) else sample["__key__"]] += 1
    big_keys = {k for k in keys if k.startswith("big")}
    assert sum(keys[k] for k in big_keys) == part_counts([0.7, 0.3], 50)[0] == 35
    assert not big_keys & set(dropped) and len(big_keys) == 35  # 90 kept: no repeats yet
    assert {k for k in keys if k.startswith("small")} == {"small1-0002", "small0-0004"}


def test_select_and_exclude_views(parts: dict[str, str], tmp_path: Path,
                                  caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    ds = indextar.IndexedTarDataset(parts["big"])
    chosen = ["big2-0001", "big0-0003", "big0-0003", "big1-0039"]
    view = ds.select(chosen)
    assert [view[i]["__key__"] for i in range(len(view))] == ["big0-0003", "big1-0039", "big2-0001"]
    assert view[-1]["__index__"] == 81 and view.shard_sizes.tolist() == [1, 1, 1]
    rest = ds.exclude(chosen)
    assert len(rest) == 117 and rest[3]["__key__"] == "big0-0004"
    assert rest.shard_sizes.tolist() == [39, 39, 39]
    assert {s["__key__"] for s in rest.__getitems__(list(range(117)))}.isdisjoint(chosen)
    narrower = rest.exclude(["big0-0000"]).select(["big0-0001", "big0-0003", "big0-0000"])
    assert [s["__key__"] for s in narrower] == ["big0-0001"]
    file = tmp_path / "keys.txt"
    file.write_text("big0-0005\n\nnot-a-key\nbig0-0006\nalso-missing\n")
    with caplog.at_level(logging.WARNING):
        from_file = ds.select(file)
    assert len(from_file) == 2
    assert (
        "2 of 4 keys match no sample" in caplog.text
        and "'not-a-key', 'also-missing'" in caplog.text
    )
    with pytest.raises(indextar.SampleKeyError, match="1 of 2 keys match no sample.*'nope'"):
        ds.exclude(["big0-0005", "nope"], strict=True)
    with pytest.raises(indextar.SampleIndexError):
        view[3]
    sampler = indextar.ResumableSampler(rest, order="blocks", seed=0)
    assert sorted(sampler) == list(range(117))  # shard_sizes of the view


def test_a_view_holds_the_shorter_of_kept_and_dropped() -> None:
    huge = range(10**9)  # a 1e9-sample base; the view never holds 1e9 numbers
    dropped = np.unique(np.random.default_rng(0).integers(0, 10**9, 10**6))
    view = KeySubset(huge, dropped, kept=False)
    assert len(view) == 10**9 - dropped.size
    assert view._kept is None and view._dropped is not None and view._dropped.size == dropped.size
    probe = np.array([0, 1, 12345, len(view) - 1])
    expected = []
    for i in probe.tolist():  # the i-th index not dropped, found by bisection
        low, high = i, i + dropped.size
        while low < high:
            middle = (low + high) // 2
            if middle - int(np.searchsorted(dropped, middle, side="right")) < i:
                low = middle + 1
            else:
                high = middle
        expected.append(low)
    assert view.base_indices(probe).tolist() == expected
    assert not np.isin(view.base_indices(probe), dropped).any()
    keep_most = KeySubset(range(1000), np.arange(1, 1000, dtype=np.int64), kept=True)
    assert keep_most._dropped is not None and keep_most._dropped.tolist() == [0]
    assert keep_most.base_indices([0, 998]).tolist() == [1, 999]


def test_the_sampler_reads_every_part_through_torch_datasets(parts: dict[str, str]) -> None:
    """A mixture of non-indextar datasets: any map-style dataset is a part."""

    class Numbers(torch.utils.data.Dataset[Any]):
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int) -> dict[str, int]:
            return {"i": i}

    data = indextar.MixtureDataset({"x": Numbers(3), "y": Numbers(5)})
    sampler = indextar.ResumableSampler(data, weights={"x": 1, "y": 1}, epoch_length=6)
    sources = collections.Counter(data[i]["__source__"] for i in sampler)
    assert sources == {"x": 3, "y": 3}


@pytest.mark.parametrize(
    "options",
    [
        {},  # every part read as one list of shards
        {"decode_threads": 2},  # a decode pool: each part's own batch read
        {"transform": lambda s: {"key": s["__key__"], "source": s["__source__"]}},
    ],
    ids=["direct", "pool", "transform"],
)
def test_a_batch_equals_its_samples_read_one_by_one(
    parts: dict[str, str], tmp_path: Path, options: dict[str, Any]
) -> None:
    empty = tmp_path / "empty-00.tar"
    empty.write_bytes(tar_bytes({}))
    shards = [str(empty), *indextar.expand_shards(parts["big"]), str(empty)]
    big = indextar.IndexedTarDataset(shards, **options)
    small = indextar.IndexedTarDataset(parts["small"], **options)
    # A part that is not an IndexedTarDataset sends every batch down the general path.
    for data in (
        indextar.MixtureDataset({"big": big, "small": small}),
        indextar.MixtureDataset({"big": big, "small": small, "list": [{"x": 1}, {"x": 2}]}),
    ):
        order = np.random.default_rng(0).permutation(len(data)).tolist()
        batch = data.__getitems__(order + [-1, 0])
        assert batch == [data[i] for i in order + [-1, 0]]
        sources = collections.Counter(
            sample.get("__source__", sample.get("source")) for sample in batch[:-2]
        )
        assert sources == {"big": 120, "small": 10, **({"list": 2} if len(data) == 132 else {})}
        only_small = data.__getitems__([125, 129])
        assert [s.get("__source__", s.get("source")) for s in only_small] == ["small"] * 2


def test_a_parts_samples_are_fresh_dicts_in_field_order_after_pickling(
    parts: dict[str, str],
) -> None:
    """Batch samples are copies of a per-part template: each its own dict, fields in
    order, no template keys left over; a pickled mixture (a spawn worker) rebuilds it."""
    data = indextar.MixtureDataset({"big": indextar.IndexedTarDataset(parts["big"])})
    for mixture in (data, pickle.loads(pickle.dumps(data))):
        first, second = mixture.__getitems__([0, 41])
        assert list(first) == ["__key__", "__shard__", "__index__", "__source__", "cls", "txt"]
        assert first is not second and second["__index__"] == 41
        assert second["__shard__"].endswith("big-01.tar") and first["__shard__"].endswith("00.tar")
        first["extra"] = 1
        assert "extra" not in mixture.__getitems__([1])[0]


def test_a_template_copy_takes_two_members_without_growing() -> None:
    """The point of the template: on CPython a copy has room for the members."""
    import platform
    import sys

    from indextar.read.sample import fields_template

    template = fields_template({"__key__": None, "__shard__": "s", "__index__": None, "x": 1})
    assert list(template) == ["__key__", "__shard__", "__index__", "x"]
    copy = template.copy()
    size = sys.getsizeof(copy)
    copy.update({"cls": b"1", "txt": b"2"})
    if platform.python_implementation() == "CPython":
        assert sys.getsizeof(copy) == size
    assert list(copy) == ["__key__", "__shard__", "__index__", "x", "cls", "txt"]
