"""PackedDataset's plans cached on disk: the next open loads them, a changed index or
other arguments make another key, and a file that is not whole is never taken."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from packcorpus import dataset, write_corpus

from indextar import PackedDataset


def same_plan(a: PackedDataset, b: PackedDataset) -> bool:
    arrays = ("offsets", "documents", "lengths", "starts")
    return (
        np.array_equal(a.lengths, b.lengths)
        and all(
            np.array_equal(getattr(a.plan, f), getattr(b.plan, f))
            if getattr(a.plan, f) is not None
            else getattr(b.plan, f) is None
            for f in arrays
        )
        and (a.plan.overlong, a.plan.empty, a.selection)
        == (b.plan.overlong, b.plan.empty, b.selection)
    )


def corpus(folder: Path, seed: int = 0) -> str:
    folder.mkdir(exist_ok=True)
    return write_corpus(folder, seed=seed)


def from_cache(caplog: pytest.LogCaptureFixture) -> bool:
    return any("from the cache" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("strategy", ["best-fit", "concat-split"])
def test_the_next_open_loads_the_plan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, strategy: str
) -> None:
    ds = dataset(corpus(tmp_path / "corpus"))
    cache = tmp_path / "cache"
    args = {"max_length": 64, "lengths": "size(tokens) / 2", "strategy": strategy, "seed": 3}
    with caplog.at_level(logging.DEBUG, logger="indextar.read.packed"):
        first = PackedDataset(ds, cache_dir=cache, **args)  # type: ignore[arg-type]
        assert not from_cache(caplog)
        assert len(list((cache / "packs").glob("*.npz"))) == 1
        again = PackedDataset(ds, cache_dir=cache, **args)  # type: ignore[arg-type]
        assert from_cache(caplog)
    assert same_plan(first, again)
    assert same_plan(first, PackedDataset(ds, cache_dir=False, **args))  # type: ignore[arg-type]
    # every argument of the plan is in the key: each makes its own file
    PackedDataset(ds, cache_dir=cache, **{**args, "seed": 4})  # type: ignore[arg-type]
    PackedDataset(ds, cache_dir=cache, **{**args, "max_length": 65})  # type: ignore[arg-type]
    PackedDataset(ds, cache_dir=cache, **{**args, "lengths": "num_tokens"})  # type: ignore[arg-type]
    PackedDataset(ds, cache_dir=cache, **{**args, "strategy": "first-fit"})  # type: ignore[arg-type]
    assert len(list((cache / "packs").glob("*.npz"))) == 5
    # a later epoch's plan is made, not cached: one file a dataset, not one an epoch
    first.set_epoch(1)
    assert len(list((cache / "packs").glob("*.npz"))) == 5
    uncached = PackedDataset(ds, cache_dir=False, **args)  # type: ignore[arg-type]
    uncached.set_epoch(1)
    assert np.array_equal(first.plan.documents, uncached.plan.documents)


def test_views_and_arrays_have_their_own_keys(tmp_path: Path) -> None:
    ds = dataset(corpus(tmp_path / "corpus"))
    cache = tmp_path / "cache"
    view = ds.where("num_tokens < 40", cache_dir=tmp_path / "selections")
    whole = PackedDataset(ds, max_length=64, lengths="num_tokens", cache_dir=cache)
    part = PackedDataset(view, max_length=64, lengths="num_tokens", cache_dir=cache)
    assert len(part.lengths) == len(view) < len(whole.lengths)
    assert same_plan(
        part, PackedDataset(view, max_length=64, lengths="num_tokens", cache_dir=cache)
    )
    given = PackedDataset(ds, max_length=64, lengths=whole.lengths, cache_dir=cache)
    assert same_plan(whole, given)
    assert len(list((cache / "packs").glob("*.npz"))) == 3
    PackedDataset(
        ds, max_length=64, lengths=lambda arrays: np.ones(len(arrays.samples)), cache_dir=cache
    )
    assert len(list((cache / "packs").glob("*.npz"))) == 3  # a callable has no key


def test_a_changed_index_plans_again(tmp_path: Path) -> None:
    folder = tmp_path / "corpus"
    cache = tmp_path / "cache"
    ds = dataset(corpus(folder))
    before = PackedDataset(ds, max_length=64, lengths="num_tokens", cache_dir=cache)
    ds.close()
    ds = dataset(corpus(folder, seed=1))  # the same paths, new shards and indexes
    after = PackedDataset(ds, max_length=64, lengths="num_tokens", cache_dir=cache)
    truth = np.array([len(ds[i]) for i in range(len(ds))])
    assert np.array_equal(after.lengths, truth) and not np.array_equal(before.lengths, truth)
    assert same_plan(after, PackedDataset(ds, max_length=64, lengths="num_tokens", cache_dir=False))
    assert len(list((cache / "packs").glob("*.npz"))) == 2


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_file_not_whole_is_planned_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    ds = dataset(corpus(tmp_path / "corpus"))
    cache = tmp_path / "cache"
    first = PackedDataset(ds, max_length=64, lengths="num_tokens", cache_dir=cache)
    (path,) = (cache / "packs").glob("*.npz")
    whole = path.read_bytes()
    if damage == "truncated":  # what a writer killed mid-write would leave, unrenamed
        path.write_bytes(whole[: len(whole) // 2])
    else:  # a flipped bit inside an array: the member's CRC no longer matches
        at = whole.index(b"piece_lengths.npy") + 200
        path.write_bytes(whole[:at] + bytes([whole[at] ^ 1]) + whole[at + 1 :])
    with caplog.at_level(logging.DEBUG, logger="indextar.read"):
        again = PackedDataset(ds, max_length=64, lengths="num_tokens", cache_dir=cache)
    assert not from_cache(caplog)
    assert any("planning again" in r.getMessage() for r in caplog.records)
    assert same_plan(first, again)
    assert path.read_bytes() == whole  # rewritten whole
    assert [p.name for p in (cache / "packs").iterdir()] == [path.name]  # no temporary left
