"""Selections by SQL over the indexes: ``ds.where(...)`` (issue 16, part 2)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import indextar
from indextar.read import selection as selection_module
from indextar.read.selection import attribute_values, bucket_ids

Record = dict[str, Any]


def _shard_records(seed: int, n: int, *, fields: tuple[str, ...]) -> list[Record]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        record: Record = {
            "aesthetic": round(rng.uniform(0, 10), 2),
            "width": rng.choice([256, 512, 768, 1024]),
            "height": rng.choice([256, 512, 768]),
            "lang": rng.choice(["en", "de", None]),
            "tags": {"watermark": rng.random()},
        }
        out.append(
            {k: v for k, v in record.items() if k in fields and not (k == "lang" and i % 11 == 0)}
        )
    return out


@pytest.fixture
def corpus(make_tar: Callable[..., Path]) -> tuple[list[str], list[Record], list[int]]:
    """Three shards: two with attributes (the second without ``height``), one whose
    samples' JSON has no fields (an index with attributes but no column: every one
    NULL); records per sample in dataset order, and each sample's jpg size."""
    all_fields = ("aesthetic", "width", "height", "lang", "tags")
    plans = [
        ("a.tar", _shard_records(1, 30, fields=all_fields), "json"),
        ("b.tar", _shard_records(2, 25, fields=all_fields[:2] + all_fields[3:]), "json"),
        ("c.tar", _shard_records(3, 10, fields=()), "json"),
    ]
    shards, records, sizes = [], [], []
    for name, recs, meta in plans:
        members: dict[str, bytes] = {}
        for i, record in enumerate(recs):
            members[f"{name[0]}{i:04d}.jpg"] = b"j" * ((i * 97) % 300)
            members[f"{name[0]}{i:04d}.json"] = json.dumps(record).encode()
            sizes.append((i * 97) % 300)
        path = make_tar(members, name=name)
        indextar.build_index(path, attributes_from=meta)
        shards.append(str(path))
        records += recs
    return shards, records, sizes


EXPRESSIONS: list[tuple[str, Callable[[Record, int], bool]]] = [
    ("aesthetic > 5", lambda r, s: r.get("aesthetic", -1) > 5),
    (
        "aesthetic > 5 AND width >= 512",
        lambda r, s: r.get("aesthetic", -1) > 5 and r.get("width", 0) >= 512,
    ),
    ("height IS NULL", lambda r, s: "height" not in r),
    ("lang = 'en' OR lang IS NULL", lambda r, s: r.get("lang") in ("en", None)),
    ("size(jpg) < 100", lambda r, s: s < 100),
    ("size('JPG') >= 100 AND width = 512", lambda r, s: s >= 100 and r.get("width") == 512),
    (
        "json_extract(tags, '$.watermark') < 0.5",
        lambda r, s: r.get("tags", {}).get("watermark", 1) < 0.5,
    ),
    ("__key__ LIKE 'b%' AND aesthetic < 3", lambda r, s: False),  # replaced below
    ("size(png) IS NULL", lambda r, s: True),
]


@pytest.mark.parametrize(("expression", "check"), EXPRESSIONS, ids=[e for e, _ in EXPRESSIONS])
def test_where_matches_a_brute_force_filter(corpus: Any, expression: str, check: Any) -> None:
    shards, records, sizes = corpus
    ds = indextar.IndexedTarDataset(shards)
    keys = [ds[i]["__key__"] for i in range(len(ds))]
    if expression.startswith("__key__"):
        check = lambda r, s: r.get("aesthetic", 99) < 3  # noqa: E731 - and the key's shard
        expected = [i for i in range(len(ds)) if keys[i].startswith("b") and check(records[i], 0)]
    else:
        expected = [i for i in range(len(ds)) if check(records[i], sizes[i])]
    view = ds.where(expression, cache_dir=False)
    assert len(view) == len(expected)
    assert view.base_indices(np.arange(len(view))).tolist() == expected
    assert [view[i]["__key__"] for i in range(len(view))] == [keys[i] for i in expected]


def test_where_is_cached_and_recomputed_when_an_index_changes(
    corpus: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards, records, _ = corpus
    cache = tmp_path / "selections"
    ds = indextar.IndexedTarDataset(shards)
    first = ds.where("aesthetic > 5", cache_dir=cache)
    assert len(list(cache.glob("*.npy"))) == 1

    def no_query(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached selection was queried again")

    with monkeypatch.context() as patch:
        patch.setattr(selection_module, "_shard_rows", no_query)
        again = indextar.IndexedTarDataset(shards).where("aesthetic > 5", cache_dir=cache)
        assert again.selection == first.selection
        with pytest.raises(AssertionError, match="queried again"):
            ds.where("aesthetic > 6", cache_dir=cache)  # another query: another key
    # A rebuilt index (a new file) is another key: queried again, same answer.
    indextar.build_index(shards[0], attributes_from="json", force=True)
    rebuilt = indextar.IndexedTarDataset(shards).where("aesthetic > 5", cache_dir=cache)
    assert rebuilt.selection == first.selection
    assert len(list(cache.glob("*.npy"))) == 2  # the failed query cached nothing
    expected = sum(1 for r in records if r.get("aesthetic", -1) > 5)
    assert len(rebuilt) == expected


def test_a_stale_index_is_refused(corpus: Any, tmp_path: Path) -> None:
    shards, _, _ = corpus
    ds = indextar.IndexedTarDataset(shards)
    with open(shards[1], "r+b") as f:  # same size, other content: the fingerprint changes
        f.seek(600)
        f.write(b"X")
    with pytest.raises(indextar.StaleIndexError, match="b.tar"):
        ds.where("aesthetic > 5", cache_dir=tmp_path / "cache")


def test_bad_sql_names_the_shard(corpus: Any) -> None:
    ds = indextar.IndexedTarDataset(corpus[0])
    with pytest.raises(indextar.SelectionError, match=r"a\.tar.*no such column: colour"):
        ds.where("colour = 'red'", cache_dir=False)
    with pytest.raises(indextar.SelectionError, match="syntax error"):
        ds.where("aesthetic >", cache_dir=False)
    with pytest.raises(indextar.SelectionError, match="changed the query"):
        ds.where("1) UNION ALL SELECT 0 --", cache_dir=False)
    with pytest.raises(indextar.SelectionError, match="needs an SQL expression"):
        ds.where("  ", cache_dir=False)


def test_where_composes_with_select_exclude_and_mixtures(corpus: Any) -> None:
    shards, records, _ = corpus
    ds = indextar.IndexedTarDataset(shards)
    keys = [ds[i]["__key__"] for i in range(len(ds))]
    good = [keys[i] for i, r in enumerate(records) if r.get("aesthetic", -1) > 5]
    view = ds.where("aesthetic > 5", cache_dir=False)
    assert [s["__key__"] for s in view.exclude(good[:3])] == good[3:]
    assert [
        s["__key__"]
        for s in ds.select(good[:4] + keys[-2:]).where("aesthetic > 5", cache_dir=False)
    ] == good[:4]
    both = view.where("width >= 512", cache_dir=False)
    assert both.selection is not None and both.selection["where"] == [
        "aesthetic > 5",
        "width >= 512",
    ]
    assert len(both) == sum(
        1 for r in records if r.get("aesthetic", -1) > 5 and r.get("width", 0) >= 512
    )
    mix = indextar.MixtureDataset({"good": view, "all": ds})
    assert len(mix) == len(view) + len(ds) and mix[0]["__key__"] == good[0]
    sampler = indextar.ResumableSampler(mix, weights={"good": 1, "all": 1}, seed=0)
    assert sampler.state_dict()["selection"] == [view.selection, None]


def test_the_sampler_records_the_selection_and_refuses_another(corpus: Any) -> None:
    ds = indextar.IndexedTarDataset(corpus[0])
    view = ds.where("aesthetic > 5", cache_dir=False)
    sampler = indextar.ResumableSampler(view, seed=3)
    order = list(sampler)
    state = json.loads(json.dumps(sampler.state_dict(consumed=7)))
    assert state["selection"] == view.selection
    resumed = indextar.ResumableSampler(ds.where("aesthetic > 5", cache_dir=False), seed=3)
    resumed.load_state_dict(state)
    assert list(resumed) == order[7:]
    # Same length by construction, other samples: refused by the digest.
    other = ds.where("aesthetic <= 5 OR aesthetic IS NULL", cache_dir=False)
    other = other.select([other[i]["__key__"] for i in range(len(view))])
    assert len(other) == len(view)
    with pytest.raises(indextar.SamplerStateError, match="selection"):
        indextar.ResumableSampler(other, seed=3).load_state_dict(state)
    # A plain dataset of the view's length would not do either, nor the reverse.
    with pytest.raises(indextar.SamplerStateError, match="selection"):
        indextar.ResumableSampler(len(view), seed=3).load_state_dict(state)
    plain = indextar.ResumableSampler(len(view), seed=3).state_dict()
    with pytest.raises(indextar.SamplerStateError, match="selection"):
        indextar.ResumableSampler(view, seed=3).load_state_dict(plain)


def _keys_of(batch: list[dict[str, Any]]) -> list[str]:
    return [sample["__key__"] for sample in batch]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_where_view_in_dataloader_workers(corpus: Any, context: str) -> None:
    from torch.utils.data import DataLoader

    shards, records, _ = corpus
    ds = indextar.IndexedTarDataset(shards)
    view = ds.where("aesthetic > 5 OR size(jpg) < 50", cache_dir=False)
    sampler = indextar.ResumableSampler(view, seed=1)
    loader = DataLoader(
        view,
        batch_size=4,
        sampler=sampler,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=_keys_of,
    )
    got = [key for batch in loader for key in batch]
    want = [view[i]["__key__"] for i in sampler.indices(0, len(view))]
    assert got == want and len(set(got)) == len(view)


def test_bucket_ids_and_values(corpus: Any) -> None:
    shards, records, sizes = corpus
    ds = indextar.IndexedTarDataset(shards)
    values = attribute_values(ds, "width * 1.0 / height")
    expected = [r["width"] / r["height"] if "height" in r else np.nan for r in records]
    np.testing.assert_array_equal(values, np.array(expected))
    with pytest.raises(indextar.SelectionError, match=r"35 of 65 samples have no value.*b0000"):
        bucket_ids(ds, "width * 1.0 / height", [1.0])
    view = ds.where("height IS NOT NULL", cache_dir=False)
    buckets = bucket_ids(view, "width * 1.0 / height", [0.9, 1.1])
    ratios = [r["width"] / r["height"] for r in records if "height" in r]
    assert buckets.tolist() == [0 if x < 0.9 else 1 if x < 1.1 else 2 for x in ratios]
    by_size = bucket_ids(ds, "size(jpg)", [100, 200])
    assert by_size.tolist() == [int(s >= 100) + int(s >= 200) for s in sizes]


def _plain_beside_meta(make_tar: Callable[..., Path], *, build_first: bool) -> list[str]:
    """Two shards of JSON ``{"a": i}``: the first indexed with attributes_from="json", the second
    indexed plain (``build_first``) or not at all."""
    shards = []
    for s in range(2):
        members = {f"s{s}k{i}.json": json.dumps({"a": i}).encode() for i in range(10)}
        shards.append(str(make_tar(members, name=f"s{s}.tar")))
    indextar.build_index(shards[0], attributes_from="json")
    if build_first:
        indextar.build_index(shards[1])
    return shards


def test_a_missing_index_is_built_with_the_others_attributes(
    make_tar: Callable[..., Path],
) -> None:
    shards = _plain_beside_meta(make_tar, build_first=False)
    ds = indextar.IndexedTarDataset(shards)  # builds the second index: with attributes_from="json"
    assert indextar.open_index(shards[1]).has_attributes("json")
    assert len(ds.where("a >= 0", cache_dir=False)) == 20
    assert len(ds.where("a IS NULL", cache_dir=False)) == 0


def test_a_shard_indexed_without_attributes_is_refused_not_null(
    make_tar: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from indextar.cli import main

    shards = _plain_beside_meta(make_tar, build_first=True)
    ds = indextar.IndexedTarDataset(shards)
    for call in (
        lambda: ds.where("a >= 0", cache_dir=False),
        lambda: ds.where("a IS NULL", cache_dir=False),
        lambda: list(selection_module.where_rows(ds, "A > 3")),
        lambda: bucket_ids(ds, "a * 2", [3.0]),
    ):
        with pytest.raises(indextar.MissingAttributesError, match="build_index") as info:
            call()
        assert info.value.shards == (shards[1],) and info.value.column == "a"
        assert repr(shards[1]) in str(info.value) and "attributes_from='json'" in str(info.value)
    # Conditions that name no attribute still select over every shard.
    assert len(ds.where("__key__ LIKE 's1%' AND size(json) > 0", cache_dir=False)) == 10
    assert main(["query", *shards, "--where", "a >= 0", "--count", "--no-cache"]) == 1
    err = capsys.readouterr().err
    assert f"indextar index {shards[1]} --meta json --force" in err and "build_index" not in err
    indextar.build_index(shards[1], attributes_from="json", force=True)  # what the message says
    assert len(ds.where("a >= 0", cache_dir=False)) == 20
