"""Mixture sampling (issue 14): exact counts, interleaving, passes, resume, weights in the state.

The sampler sees a mixture through ``cumulative_sizes`` and ``datasets``, as
``MixtureDataset`` and torch's ``ConcatDataset`` have them; ``Parts`` fakes that with
``range`` objects, so these tests need no shards.
"""

from __future__ import annotations

import collections
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import indextar.order.mixture as mixture
from indextar.errors import SamplerStateError
from indextar.order.permutation import KeyedPermutation, derive_round_keys, permute_grouped
from indextar.order.sampler import ResumableSampler
from indextar.order.weights import part_counts


class Parts:
    """A mixture's shape without data: parts of the given sizes, optionally named."""

    def __init__(self, sizes: Sequence[int], names: Sequence[str] | None = None) -> None:
        self.cumulative_sizes = np.cumsum(sizes).tolist()
        self.datasets = [range(n) for n in sizes]
        if names is not None:
            self.names = tuple(names)

    def __len__(self) -> int:
        return int(self.cumulative_sizes[-1])

    def part(self, index: int) -> int:
        return int(np.searchsorted(self.cumulative_sizes, index, side="right"))

    def start(self, part: int) -> int:
        return int(([0, *self.cumulative_sizes])[part])


@pytest.fixture(params=[mixture.WINDOW, 7], ids=["window", "tiny-windows"])
def window(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The real window size, and windows of 7 positions: every window then holds pass
    ends and starts, and parts have fewer draws than windows."""
    monkeypatch.setattr(mixture, "WINDOW", request.param)
    return int(request.param)


def epochs(sampler: ResumableSampler, count: int) -> list[list[int]]:
    out = []
    for epoch in range(count):
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_part_counts_are_largest_remainders() -> None:
    assert part_counts([0.8, 0.2], 10).tolist() == [8, 2]
    assert part_counts([1, 1, 1], 10).tolist() == [4, 3, 3]  # tie: the lower part number
    assert part_counts([2, 1, 1], 5).tolist() == [3, 1, 1]
    assert part_counts([1, 0], 7).tolist() == [7, 0]
    counts = part_counts([0.1] * 7 + [0.3], 10**10 + 1)
    assert int(counts.sum()) == 10**10 + 1 and counts.max() - counts[-1] == 0


@pytest.mark.parametrize("order", ["global", "blocks"])
def test_every_epoch_has_exact_counts_and_no_repeat_before_a_pass_ends(
    window: int, order: Any
) -> None:
    parts = Parts([10, 1000, 37, 3])
    weights = [0.5, 0.25, 0.2, 0.05]  # part 0 upsampled 45x, part 1 downsampled
    sampler = ResumableSampler(parts, weights=weights, epoch_length=900, seed=5, order=order,
                               block_size=8)  # fmt: skip
    streams: dict[int, list[int]] = collections.defaultdict(list)
    for drawn in epochs(sampler, 4):
        assert len(drawn) == 900
        per_part = collections.Counter(parts.part(i) for i in drawn)
        assert [per_part[p] for p in range(4)] == part_counts(weights, 900).tolist()
        for index in drawn:
            streams[parts.part(index)].append(index)
    for part, stream in streams.items():
        size = len(parts.datasets[part])
        everything = list(range(parts.start(part), parts.start(part) + size))
        for begin in range(0, len(stream), size):  # each pass, in the order drawn
            this_pass = stream[begin : begin + size]
            assert len(set(this_pass)) == len(this_pass), (part, begin)
            if len(this_pass) == size:
                assert sorted(this_pass) == everything
    # Part 1 (1000 samples, 225 a epoch) continued across epochs: 900 distinct in 4.
    assert len(set(streams[1])) == 900


def test_draws_are_interleaved_at_random_not_in_runs() -> None:
    parts = Parts([10**6, 10**6])
    sampler = ResumableSampler(parts, weights=[0.5, 0.5], epoch_length=200_000, seed=1)
    which = (sampler.indices(0, 200_000) >= 10**6).astype(np.int64)
    runs = np.diff(np.flatnonzero(np.diff(which)))
    assert runs.max() < 40  # a fair coin's longest run in 2e5 tosses is about 17
    # Run lengths are geometric, as for independent draws: half the runs have length 1.
    assert 0.45 < np.mean(runs == 1) < 0.55
    # Every window of 10,000 positions has its share to within a few draws.
    per_block = which.reshape(20, 10_000).sum(axis=1)
    assert np.all(np.abs(per_block - 5000) < 150)


def test_the_same_seed_gives_the_same_order_and_another_seed_another() -> None:
    parts = Parts([100, 250])

    def order(seed: int) -> list[list[int]]:
        return epochs(ResumableSampler(parts, weights=[1, 3], epoch_length=500, seed=seed), 2)

    assert order(3) == order(3)
    assert order(3) != order(4)
    first, second = order(3)
    assert first != second  # each epoch its own interleaving


@pytest.mark.parametrize("new_world", [3, 1])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_on_another_world_gives_exactly_the_remaining_draws(
    window: int, new_world: int, drop_last: bool
) -> None:
    parts, weights, length, epoch = Parts([40, 7, 300]), {"0": 1.0}, 301, 2
    del weights
    make = dict(weights=[0.6, 0.1, 0.3], epoch_length=length, seed=9, drop_last=drop_last)
    old = [ResumableSampler(parts, num_replicas=2, rank=r, **make) for r in range(2)]  # type: ignore[arg-type]
    for sampler in old:
        sampler.set_epoch(epoch)
    steps = 37
    seen = collections.Counter()
    for sampler in old:
        iterator = iter(sampler)
        seen.update(next(iterator) for _ in range(steps))
    state = json.loads(json.dumps(old[0].state_dict()))
    assert state["consumed"] == 2 * steps

    new = [
        ResumableSampler(parts, num_replicas=new_world, rank=r, **make) for r in range(new_world)
    ]  # type: ignore[arg-type]
    for sampler in new:
        sampler.load_state_dict(state)
        sampler.set_epoch(epoch)  # keeps the restored position
    rest = [list(sampler) for sampler in new]
    assert len({len(r) for r in rest}) == 1  # every rank the same count
    whole = ResumableSampler(parts, **make)  # type: ignore[arg-type]
    whole.set_epoch(epoch)
    everything = whole.indices(0, length).tolist()
    remaining = length - 2 * steps
    if drop_last:
        kept = remaining - remaining % new_world
        expected = collections.Counter(everything[2 * steps : 2 * steps + kept])
    else:
        padding = -remaining % new_world
        expected = collections.Counter(everything[2 * steps :] + everything[:padding])
    assert seen == collections.Counter(everything[: 2 * steps])
    assert collections.Counter(i for r in rest for i in r) == expected


def test_weights_and_part_sizes_are_part_of_the_state(caplog: pytest.LogCaptureFixture) -> None:
    parts = Parts([50, 50], names=["laion", "cc12m"])
    saved = ResumableSampler(parts, weights={"laion": 0.8, "cc12m": 0.2}, epoch_length=60)
    state = json.loads(json.dumps(saved.state_dict(consumed=12)))
    assert state["weights"] == [{"epoch": 0, "weights": {"laion": 0.8, "cc12m": 0.2}}]
    assert state["part_sizes"] == [50, 50] and state["num_samples"] == 60

    other = ResumableSampler(parts, weights={"laion": 0.5, "cc12m": 0.5}, epoch_length=60)
    with pytest.raises(SamplerStateError, match="saved with weights.*'laion': 0.8"):
        other.load_state_dict(state)
    with pytest.raises(SamplerStateError, match="num_samples=60"):
        ResumableSampler(parts, weights=[0.8, 0.2], epoch_length=61).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="part_sizes"):
        ResumableSampler(Parts([50, 51], ["laion", "cc12m"]), weights=[0.8, 0.2],
                         epoch_length=60).load_state_dict(state)  # fmt: skip
    with pytest.raises(SamplerStateError, match=r"part_sizes=\[50, 50\]; .* part_sizes=None"):
        ResumableSampler(60).load_state_dict(state)  # not a mixture
    lenient = ResumableSampler(parts, weights=[0.5, 0.5], epoch_length=60, strict=False)
    with caplog.at_level(logging.WARNING):
        lenient.load_state_dict(state)
    assert "saved with weights" in caplog.text and lenient.weights == (0.5, 0.5)
    same = ResumableSampler(parts, weights=[0.8, 0.2], epoch_length=60)  # a list equals by name
    same.load_state_dict(state)
    assert same.consumed == 12


def test_set_weights_takes_effect_at_the_next_epoch_and_resumes_exactly() -> None:
    parts = Parts([30, 30])
    first = ResumableSampler(parts, weights=[1, 1], epoch_length=40, seed=2)
    first.set_weights([1, 3])  # before epoch 0 began: epoch 0
    assert first.weights == (1.0, 3.0)
    first.set_weights([1, 1])
    iterator = iter(first)
    next(iterator)
    first.set_weights([3, 1])  # epoch 0 has begun: from epoch 1
    assert first.weights == (1.0, 1.0)
    rest = list(iterator)
    assert sum(i < 30 for i in rest) + 1 >= 19  # epoch 0 kept its 20/20 split
    with pytest.raises(ValueError, match="from epoch 1 on"):
        first.set_weights([1, 1], epoch=0)
    first.set_epoch(1)
    assert first.weights == (3.0, 1.0)
    assert sum(i < 30 for i in first.indices(0, 40).tolist()) == 30
    state = json.loads(json.dumps(first.state_dict(consumed=10)))
    assert [e["epoch"] for e in state["weights"]] == [0, 1]

    # A restarted job builds the sampler with its first weights; the history comes back.
    resumed = ResumableSampler(parts, weights=[1, 1], epoch_length=40, seed=2)
    resumed.load_state_dict(state)
    assert resumed.weights == (3.0, 1.0)
    assert np.array_equal(resumed.indices(0, 40), first.indices(0, 40))
    resumed.set_epoch(2)
    first.set_epoch(2)
    assert np.array_equal(resumed.indices(0, 40), first.indices(0, 40))  # passes continue


def test_a_weight_schedule_is_a_callable_of_the_epoch() -> None:
    parts = Parts([100, 100], names=["a", "b"])

    def curriculum(epoch: int) -> dict[str, float]:
        return {"a": 1.0, "b": float(epoch)}

    sampler = ResumableSampler(parts, weights=curriculum, epoch_length=90, seed=0)
    counts = [sum(i >= 100 for i in drawn) for drawn in epochs(sampler, 3)]
    assert counts == [0, 45, 60]
    state = sampler.state_dict()
    assert state["weights"] == [{"epoch": 2, "weights": {"a": 1.0, "b": 2.0}}]
    with pytest.raises(SamplerStateError, match="weights"):
        ResumableSampler(parts, weights=lambda e: [1, 1], epoch_length=90).load_state_dict(state)
    with pytest.raises(ValueError, match="schedule"):
        sampler.set_weights([1, 1])


@pytest.mark.parametrize(
    ("weights", "error"),
    [
        ({"a": 1.0}, "must name every part"),
        ([1, 2, 3], "3 entries; the dataset has 2 parts"),
        ([0, 0], "not all 0"),
        ([1, float("nan")], "finite"),
        ([-1, 2], ">= 0"),
    ],
)
def test_bad_weights_are_refused(weights: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ResumableSampler(Parts([3, 4], ["a", "b"]), weights=weights)


def test_an_empty_part_with_weight_is_refused_and_without_is_skipped() -> None:
    with pytest.raises(ValueError, match="empty"):
        ResumableSampler(Parts([0, 4]), weights=[1, 1])
    sampler = ResumableSampler(Parts([0, 4]), weights=[0, 1], epoch_length=9)
    assert sorted(set(sampler)) == [0, 1, 2, 3]


def test_a_plain_dataset_with_an_epoch_length_walks_its_passes() -> None:
    sampler = ResumableSampler(10, epoch_length=4, seed=1)  # one part: epochs of 4 draws
    drawn = [i for drawn in epochs(sampler, 5) for i in drawn]
    assert sorted(drawn[:10]) == list(range(10)) and sorted(drawn[10:20]) == list(range(10))


def test_ten_billion_draws_over_a_hundred_parts_start_and_resume_in_constant_time() -> None:
    parts = Parts([10**8] * 100)
    weights = list(range(1, 101))
    started = time.perf_counter()
    sampler = ResumableSampler(parts, weights=weights, epoch_length=10**10, num_replicas=8, rank=3)
    sampler.load_state_dict({"epoch": 7, "consumed": 9 * 10**9})
    first = list(zip(range(1000), sampler))
    elapsed = time.perf_counter() - started
    assert elapsed < 2  # the benchmark measures milliseconds; this only rules out O(N)
    indices = np.array([i for _, i in first])
    assert indices.min() >= 0 and indices.max() < 10**10 and np.unique(indices).size == 1000


def test_grouped_permutations_equal_one_permutation_per_group() -> None:
    rng = np.random.default_rng(0)
    sizes = np.array([1, 2, 5, 64, 1000, 2**33 + 5], dtype=np.int64)
    keys = np.array([derive_round_keys(7, g) for g in range(sizes.size)], dtype=np.uint64)
    group = rng.integers(0, sizes.size, 20_000)
    positions = (rng.random(20_000) * sizes[group]).astype(np.int64)
    result = permute_grouped(positions, group, sizes, keys)
    for g, size in enumerate(sizes.tolist()):
        mine = group == g
        single = KeyedPermutation(size, tuple(int(k) for k in keys[g]))
        assert np.array_equal(result[mine], single.permute(positions[mine]))
        assert np.array_equal(single.unpermute(result[mine]), positions[mine])
