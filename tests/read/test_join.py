"""Joins of two shard sets by key (``IndexedTarDataset.join``): shards written by
tarfile on both sides, of other sizes and in another order, keys missing on either
side, an extension on both sides, a changed side, DataLoader workers and resume."""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loopback_servers import HttpServer

import indextar
import indextar.native
from indextar.read.keyjoin import KeyColumn, hash_keys, join_keys

Made = tuple[list[str], list[str], dict[str, dict[str, bytes]]]

LEFT_KEYS = [f"img/{i:04d}" for i in range(40)]
RIGHT_ONLY = ["img/9999", "other"]
MISSING = {"img/0003", "img/0017", "img/0039"}  # left keys without a right sample


def _write(
    make_tar: Callable[..., Path], prefix: str, groups: list[list[str]], members: Any
) -> list[str]:
    paths = []
    for n, keys in enumerate(groups):
        content = {f"{key}.{ext}": data for key in keys for ext, data in members(key).items()}
        paths.append(str(make_tar(content, name=f"{prefix}-{n}.tar")))
    return paths


def _left_members(key: str) -> dict[str, bytes]:
    number = int(key.split("/")[-1])
    return {
        "jpg": f"jpeg of {key}".encode() * (1 + number % 4),
        "json": json.dumps({"width": 100 + number}).encode(),
    }


def _right_members(key: str) -> dict[str, bytes]:
    digest = sum(key.encode())
    return {
        "npy": f"embedding of {key}".encode(),
        "json": json.dumps({"score": digest % 10}).encode(),
    }


@pytest.fixture
def sides(make_tar: Callable[..., Path]) -> Made:
    """Left: 40 samples in shards of 7, 13, 20. Right: 37 of them plus 2 others,
    shuffled, in shards of 5, 30, 4; both indexed with their JSON attributes."""
    left = _write(make_tar, "left", [LEFT_KEYS[:7], LEFT_KEYS[7:20], LEFT_KEYS[20:]], _left_members)
    right_keys = [k for k in LEFT_KEYS if k not in MISSING] + RIGHT_ONLY
    random.Random(5).shuffle(right_keys)
    right = _write(
        make_tar, "right", [right_keys[:5], right_keys[5:35], right_keys[35:]], _right_members
    )
    for shard in left + right:
        indextar.build_index(shard, attributes_from="json")
    expected = {}
    for key in LEFT_KEYS:
        sample = {**_left_members(key)}
        if key not in MISSING:
            sample |= {f"clip.{ext}": data for ext, data in _right_members(key).items()}
        expected[key] = sample
    return left, right, expected


def _members(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def _join(sides: Made, tmp_path: Path, **options: Any) -> indextar.JoinedDataset:
    left, right, _ = sides
    options = {"prefix": "clip.", "cache_dir": tmp_path / "cache", **options}
    return indextar.IndexedTarDataset(left).join(indextar.IndexedTarDataset(right), **options)


def test_an_inner_join_merges_members_by_key(sides: Made, tmp_path: Path) -> None:
    joined = _join(sides, tmp_path)
    _, _, expected = sides
    kept = [k for k in LEFT_KEYS if k not in MISSING]
    assert len(joined) == len(kept)
    assert [joined[i]["__key__"] for i in range(len(joined))] == kept
    for i, key in enumerate(kept):
        assert _members(joined[i]) == expected[key]
        assert joined[i]["__index__"] == i
    batch = joined.__getitems__([5, 0, -1, 5])
    assert [s["__key__"] for s in batch] == [kept[5], kept[0], kept[-1], kept[5]]
    assert joined.shard_sizes.tolist() == [6, 12, 19]
    with pytest.raises(indextar.SampleIndexError):
        joined[len(joined)]


def test_a_left_join_keeps_every_sample_without_the_missing_members(
    sides: Made, tmp_path: Path
) -> None:
    joined = _join(sides, tmp_path, how="left", keys=("jpg", "clip.npy;jpg"))
    _, _, expected = sides
    assert len(joined) == len(LEFT_KEYS)
    got = joined.__getitems__(range(len(joined)))
    for key, (jpg, npy) in zip(LEFT_KEYS, got):
        assert jpg == expected[key]["jpg"]
        assert npy == (jpg if key in MISSING else expected[key]["clip.npy"])
    plain = _join(sides, tmp_path, how="left", cache_dir=False)
    assert "clip.npy" not in plain[3] and plain[3]["__key__"] == "img/0003"


def test_an_extension_on_both_sides_is_refused_unless_renamed(sides: Made, tmp_path: Path) -> None:
    with pytest.raises(indextar.JoinError, match="'json'.*prefix="):
        _join(sides, tmp_path, prefix="")
    joined = _join(sides, tmp_path, prefix="", rename={"json": "clip.json"})
    _, _, expected = sides
    assert joined[0]["npy"] == expected["img/0000"]["clip.npy"]
    assert joined[0]["clip.json"] == expected["img/0000"]["clip.json"]
    with pytest.raises(indextar.JoinError, match="'txt'"):
        _join(sides, tmp_path, rename={"txt": "x"})


def test_a_key_twice_on_the_joined_side_is_refused(
    sides: Made, make_tar: Callable[..., Path], tmp_path: Path
) -> None:
    left, right, _ = sides
    again = str(make_tar({"img/0005.npy": b"again"}, name="right-again.tar"))
    with pytest.raises(indextar.JoinError, match="'img/0005'"):
        indextar.IndexedTarDataset(left).join(
            indextar.IndexedTarDataset([*right, again]), prefix="clip.", cache_dir=False
        )


def test_the_join_is_cached_and_refused_when_a_side_changed(sides: Made, tmp_path: Path) -> None:
    left, right, _ = sides
    first = _join(sides, tmp_path)
    cached = sorted(p.name for p in (tmp_path / "cache" / "joins").iterdir())
    assert len(cached) == 3  # left positions, right positions, extensions
    again = _join(sides, tmp_path)
    assert isinstance(again.plan.right, np.memmap)
    assert np.array_equal(again.plan.right, first.plan.right)
    left_ds, right_ds = indextar.IndexedTarDataset(left), indextar.IndexedTarDataset(right)
    with open(right[1], "r+b") as f:  # the sidecar rewritten in place after the indexes
        f.seek(600)
        f.write(b"X")
    os.utime(right[1], ns=(1, 1))
    with pytest.raises(indextar.StaleIndexError):
        left_ds.join(right_ds, prefix="clip.", cache_dir=tmp_path / "cache")


def test_where_select_and_exclude_on_either_side(sides: Made, tmp_path: Path) -> None:
    joined = _join(sides, tmp_path)
    kept = [k for k in LEFT_KEYS if k not in MISSING]
    wide = joined.where("width >= 120")  # a left attribute
    assert [s["__key__"] for s in wide] == [k for k in kept if int(k[-4:]) >= 20]
    scored = joined.where("score >= 5")  # a right attribute
    want = [k for k in kept if sum(k.encode()) % 10 >= 5]
    assert [s["__key__"] for s in scored] == want and want
    both = wide.where("score >= 5")
    assert [s["__key__"] for s in both] == [k for k in want if int(k[-4:]) >= 20]
    picked = joined.select(["img/0004", "img/0003", "img/0030"])
    assert [s["__key__"] for s in picked] == ["img/0004", "img/0030"]
    dropped = scored.exclude([want[0]])
    assert [s["__key__"] for s in dropped] == want[1:]
    with pytest.raises(indextar.SelectionError, match="both sides"):
        joined.where("no_such_column > 1")
    values = joined.attribute_values("score")
    assert values.tolist() == [sum(k.encode()) % 10 for k in kept]
    assert indextar.bucket_ids(scored, "score", [7]).tolist() == [
        int(sum(k.encode()) % 10 >= 7) for k in want
    ]


def test_mixtures_packing_and_the_sampler_take_a_joined_view(sides: Made, tmp_path: Path) -> None:
    joined = _join(sides, tmp_path)
    left, _, _ = sides
    mixture = indextar.MixtureDataset({"joined": joined, "plain": indextar.IndexedTarDataset(left)})
    sample = mixture[0]
    assert sample["__source__"] == "joined" and "clip.npy" in sample
    assert mixture.__getitems__([len(joined), 1])[1]["__source__"] == "joined"
    packed = indextar.PackedDataset(
        joined,
        max_length=64,
        lengths="size(jpg)",
        tokens=lambda s: np.frombuffer(s["jpg"], np.uint8),
    )
    packs = packed.__getitems__(range(len(packed)))
    assert sorted(i for p in packs for i in p.indices.tolist()) == list(range(len(joined)))
    assert sum(len(p) for p in packs) == sum(len(joined[i]["jpg"]) for i in range(len(joined)))
    sampler = indextar.ResumableSampler(joined, seed=2, order="blocks")
    order = list(sampler)
    state = json.loads(json.dumps(sampler.state_dict(consumed=9)))
    assert state["selection"]["join"] == "inner"
    resumed = indextar.ResumableSampler(_join(sides, tmp_path), seed=2, order="blocks")
    resumed.load_state_dict(state)
    assert list(resumed) == order[9:]
    with pytest.raises(indextar.SamplerStateError, match="selection"):
        indextar.ResumableSampler(len(joined), seed=2, order="blocks").load_state_dict(state)


def _keys_of(batch: list[dict[str, Any]]) -> list[str]:
    return [sample["__key__"] + ":" + sample["clip.npy"].decode() for sample in batch]


def test_a_joined_view_in_dataloader_workers(sides: Made, tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    joined = _join(sides, tmp_path)
    copied = pickle.loads(pickle.dumps(joined))  # what a spawned worker gets
    assert copied.__getitems__([0, 7]) == joined.__getitems__([0, 7])
    sampler = indextar.ResumableSampler(joined, seed=1)
    loader = DataLoader(
        joined,
        batch_size=4,
        sampler=sampler,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=_keys_of,
    )
    got = [key for batch in loader for key in batch]
    want = [
        f"{joined[i]['__key__']}:embedding of {joined[i]['__key__']}"
        for i in sampler.indices(0, len(joined))
    ]
    assert got == want


def _column(keys: list[bytes]) -> KeyColumn:
    ends = np.cumsum([len(k) for k in keys], dtype=np.int64)
    return KeyColumn(b"".join(keys), ends - [len(k) for k in keys], ends, frozenset())


def test_keys_of_any_length_and_colliding_hashes_join_exactly() -> None:
    assert indextar.native.built()["_keyjoin"]  # the C join is tested, not skipped
    rng = random.Random(3)
    right = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(300)]
    right = list(dict.fromkeys(right))
    left = right[::2] + [k + b"\0" for k in right[:20]] + [b"absent"]
    rng.shuffle(left)
    want = [right.index(k) if k in right else -1 for k in left]
    assert join_keys(_column(left), _column(right)).tolist() == want  # in C, where built
    assert join_keys(_column(left), _column(right), hashes=hash_keys).tolist() == want
    constant = lambda keys: np.zeros(len(keys), np.uint64)  # noqa: E731 (every hash collides)
    assert join_keys(_column(left), _column(right), hashes=constant).tolist() == want
    assert len(set(hash_keys(_column(right)).tolist())) == len(right)


def test_a_remote_side_is_read_with_its_batch_spans_in_flight_together(
    sides: Made, tmp_path: Path, http: HttpServer, http_root: Path
) -> None:
    left, right, expected = sides
    served = []
    for path in right:
        name = f"{tmp_path.name}-{Path(path).name}"
        shutil.copyfile(path, http_root / name)
        served.append(http.url(name))
    remote = indextar.IndexedTarDataset(served, index_dir=tmp_path / "ix")
    joined = indextar.IndexedTarDataset(left).join(remote, prefix="clip.", cache_dir=False)
    kept = [k for k in LEFT_KEYS if k not in MISSING]
    http.reset()
    batch = joined.__getitems__(range(0, 32, 4))
    assert [_members(s) for s in batch] == [expected[kept[i]] for i in range(0, 32, 4)]
    stats = http.stats()
    assert sum(entry["requests"] for entry in stats.values()) == 8  # one ranged GET a sample


def test_views_join_and_are_joined(sides: Made, tmp_path: Path) -> None:
    left, right, expected = sides
    options: dict[str, Any] = {"prefix": "clip.", "cache_dir": tmp_path / "cache"}
    left_ds, right_ds = indextar.IndexedTarDataset(left), indextar.IndexedTarDataset(right)
    wide = [k for k in LEFT_KEYS if int(k[-4:]) >= 20]  # width >= 120
    view = left_ds.where("width >= 120").join(right_ds, **options)
    assert [s["__key__"] for s in view] == [k for k in wide if k not in MISSING]
    assert all(_members(s) == expected[s["__key__"]] for s in view)
    kept = left_ds.where("width >= 120").join(right_ds, how="left", **options)
    assert [_members(s) for s in kept] == [expected[k] for k in wide]
    assert [s["__key__"] for s in view.where("score >= 5")] == [
        s["__key__"] for s in view if s["clip.json"] and json.loads(s["clip.json"])["score"] >= 5
    ]
    scored = {k for k in LEFT_KEYS if k not in MISSING and sum(k.encode()) % 10 >= 5}
    inner = left_ds.join(right_ds.where("score >= 5"), **options)
    assert [s["__key__"] for s in inner] == [k for k in LEFT_KEYS if k in scored]
    assert all(_members(s) == expected[s["__key__"]] for s in inner)
    outer = left_ds.join(right_ds.where("score >= 5"), how="left", **options)
    assert [_members(s) for s in outer] == [
        expected[k] if k in scored else _left_members(k) for k in LEFT_KEYS
    ]
    assert inner.selection != left_ds.join(right_ds, **options).selection
    joined = left_ds.join(right_ds, **options)
    with pytest.raises(indextar.JoinError, match="joined view"):
        left_ds.join(joined.where("score >= 5"), **options)
    with pytest.raises(indextar.JoinError, match="one after the other"):
        joined.where("score >= 5").join(right_ds, **options)


def test_read_ahead_reaches_both_remote_sides(
    sides: Made, tmp_path: Path, http: HttpServer, http_root: Path
) -> None:
    from torch.utils.data import DataLoader

    def served(paths: list[str]) -> indextar.IndexedTarDataset:
        urls = []
        for path in paths:
            name = f"{tmp_path.name}-ra-{Path(path).name}"
            shutil.copyfile(path, http_root / name)
            urls.append(http.url(name))
        return indextar.IndexedTarDataset(urls, index_dir=tmp_path / "ix")

    def join() -> indextar.JoinedDataset:
        return served(sides[0]).join(
            served(sides[1]), how="left", prefix="clip.", cache_dir=tmp_path / "cache"
        )

    def read(joined: indextar.JoinedDataset, batches: Any) -> list[str]:
        loader = DataLoader(joined, batch_sampler=batches, collate_fn=list)
        return [_keys_and_members(s) for batch in loader for s in batch]

    first = join()
    plain = read(first, [list(b) for b in indextar.ReadAheadBatches(
        indextar.ResumableSampler(first, seed=3), 4)])  # fmt: skip
    joined = join()
    http.reset()
    got = read(
        joined, indextar.ReadAheadBatches(indextar.ResumableSampler(joined, seed=3), 4, depth=3)
    )
    assert got == plain and len(got) == len(LEFT_KEYS)
    matched = len(LEFT_KEYS) - len(MISSING)
    assert sum(entry["requests"] for entry in http.stats().values()) == len(got) + matched
    for side in (joined.left, joined.right):
        stats = side.prefetch_stats()  # type: ignore[attr-defined]
        assert stats is not None and stats.taken > 0, side


def _keys_and_members(sample: dict[str, Any]) -> str:
    return json.dumps({k: v.hex() for k, v in _members(sample).items()} | {"k": sample["__key__"]})


def test_an_inner_join_that_keeps_every_left_sample(
    sides: Made, tmp_path: Path, make_tar: Callable[..., Path]
) -> None:
    _, right, expected = sides
    kept = [k for k in LEFT_KEYS if k not in MISSING][:12]
    left = str(make_tar({f"{k}.jpg": _left_members(k)["jpg"] for k in kept}, name="few.tar"))
    options: dict[str, Any] = {"prefix": "clip.", "cache_dir": tmp_path / "cache"}
    right_ds = indextar.IndexedTarDataset(right)
    for _ in range(2):  # computed, then from the cache (no left array stored)
        joined = indextar.IndexedTarDataset([left]).join(right_ds, **options)
        assert joined.plan.left is None
        assert [s["__key__"] for s in joined] == kept
        assert [_members(s)["clip.npy"] for s in joined] == [expected[k]["clip.npy"] for k in kept]
    scored = indextar.IndexedTarDataset([left]).join(right_ds.where("score >= 5"), **options)
    assert [s["__key__"] for s in scored] == [k for k in kept if sum(k.encode()) % 10 >= 5]
