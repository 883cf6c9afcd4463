"""ResumableSampler in one process: splitting, orders, state dicts, DataLoader use."""

from __future__ import annotations

import collections
import itertools
import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from indextar.errors import SamplerStateError
from indextar.order.sampler import ResumableSampler
from indextar.order.state import sampler_state_from_loader


def ranks(size: int, world: int, **options: Any) -> list[ResumableSampler]:
    return [
        ResumableSampler(size, num_replicas=world, rank=rank, **options) for rank in range(world)
    ]


def run_epoch(samplers: list[ResumableSampler]) -> list[list[int]]:
    return [list(sampler) for sampler in samplers]


@pytest.mark.parametrize("size", [0, 1, 7, 100, 1001])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(
    "options",
    [{}, {"shuffle": False}, {"order": "blocks", "block_size": 10, "window_blocks": 3}],
    ids=["global", "sequential", "blocks"],
)
def test_ranks_split_the_epoch_evenly(
    size: int, world: int, drop_last: bool, options: dict[str, Any]
) -> None:
    samplers = ranks(size, world, drop_last=drop_last, seed=5, **options)
    per_rank = run_epoch(samplers)
    count = size // world if drop_last else -(-size // world)
    assert [len(s) for s in samplers] == [count] * world
    assert [len(indices) for indices in per_rank] == [count] * world
    seen = collections.Counter(i for indices in per_rank for i in indices)
    if drop_last:
        assert max(seen.values(), default=1) == 1 and set(seen) <= set(range(size))
        assert sum(seen.values()) == size - size % world
    else:
        padding = samplers[0].indices(0, count * world - size).tolist()
        assert seen == collections.Counter(range(size)) + collections.Counter(padding)


def test_ranks_interleave_over_the_global_order() -> None:
    samplers = ranks(50, 3, seed=2)
    per_rank = run_epoch(samplers)
    order = samplers[0].indices(0, 51).tolist()
    for rank, indices in enumerate(per_rank):
        assert indices == order[rank::3]


def test_orders_differ_per_epoch_and_repeat_per_seed() -> None:
    sampler = ResumableSampler(1000, seed=9)
    orders = []
    for epoch in range(5):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert len({tuple(o) for o in orders}) == 5
    again = ResumableSampler(1000, seed=9)
    again.set_epoch(3)
    assert list(again) == orders[3]
    assert list(ResumableSampler(1000, seed=10)) != orders[0]


def test_fixed_orders_are_bit_exact() -> None:
    assert list(ResumableSampler(10, seed=0)) == [7, 5, 0, 3, 8, 2, 4, 9, 6, 1]
    blocks = ResumableSampler(10, seed=0, order="blocks", block_size=3, window_blocks=1)
    assert list(blocks) == [8, 6, 7, 1, 0, 2, 9, 3, 4, 5]
    assert list(ResumableSampler(5, shuffle=False, seed=3)) == [0, 1, 2, 3, 4]


class ShardedSource:
    """Looks like a dataset that knows its shards."""

    shard_sizes = np.array([30, 0, 5, 40, 25])

    def __len__(self) -> int:
        return 100


def test_blocks_default_to_shards_and_windows_stay_local() -> None:
    sampler = ResumableSampler(ShardedSource(), seed=4, order="blocks", window_blocks=2)
    order = list(sampler)
    assert sorted(order) == list(range(100))
    bounds = np.concatenate(([0], np.cumsum(ShardedSource.shard_sizes))).tolist()
    shard = {s: set(range(bounds[s], bounds[s + 1])) for s in (0, 2, 3, 4)}  # 1 is empty
    # The first window is exactly two whole shards; the second, the other two.
    first_windows = [
        (a, b) for a, b in itertools.combinations(shard, 2)
        if set(order[: len(shard[a]) + len(shard[b])]) == shard[a] | shard[b]
    ]  # fmt: skip
    assert len(first_windows) == 1
    assert not sampler.indices(0, 100).tolist() == sorted(order)


def test_blocks_with_a_block_size_shuffle_within_windows() -> None:
    sampler = ResumableSampler(1000, seed=1, order="blocks", block_size=100, window_blocks=2)
    order = np.array(list(sampler))
    assert sorted(order.tolist()) == list(range(1000))
    for window in order.reshape(5, 200):  # every window is two whole blocks
        blocks = np.unique(window // 100)
        assert blocks.size == 2 and np.array_equal(
            np.sort(window),
            np.sort(np.concatenate([np.arange(b * 100, b * 100 + 100) for b in blocks])),
        )
    assert not np.array_equal(order[:100], np.sort(order[:100]))  # shuffled inside


def test_bad_shard_sizes_are_refused() -> None:
    class Wrong(ShardedSource):
        shard_sizes = np.array([1, 2])

    with pytest.raises(ValueError, match="sum to its length 100; got 2 shards summing to 3"):
        ResumableSampler(Wrong(), order="blocks")


def test_consumed_counts_positions_handed_out_across_ranks() -> None:
    sampler = ResumableSampler(10, num_replicas=2, rank=1, seed=3)
    assert sampler.consumed == 0
    iterator = iter(sampler)
    assert sampler.consumed == 0
    next(iterator), next(iterator)
    assert sampler.consumed == 4
    assert sampler.state_dict()["consumed"] == 4
    list(iterator)
    assert sampler.consumed == 10
    next(iter(sampler))  # a new pass of the same epoch starts afresh
    assert sampler.consumed == 2


@pytest.mark.parametrize(("size", "old_world", "new_world", "steps"), [
    (101, 2, 3, 5), (101, 3, 1, 7), (10, 4, 3, 1), (1000, 8, 5, 40), (7, 1, 8, 3),
])  # fmt: skip
@pytest.mark.parametrize("order", ["global", "blocks"])
def test_resume_on_another_world_sees_the_rest_once(
    size: int, old_world: int, new_world: int, steps: int, order: str
) -> None:
    options: dict[str, Any] = {"seed": 8, "order": order, "block_size": 4}
    old = ranks(size, old_world, **options)
    iterators = [iter(s) for s in old]
    before = [next(it) for _ in range(steps) for it in iterators]
    state = json.loads(json.dumps(old[0].state_dict()))
    assert state["consumed"] == steps * old_world
    new = ranks(size, new_world, **options)
    for sampler in new:
        sampler.load_state_dict(state)
    after = [i for indices in run_epoch(new) for i in indices]
    padding = -(size - state["consumed"]) % new_world
    expected = collections.Counter(range(size)) + collections.Counter(
        new[0].indices(0, padding).tolist()
    )
    assert collections.Counter(before + after) == expected


def test_resume_far_into_a_huge_epoch_is_immediate() -> None:
    sampler = ResumableSampler(10**10, seed=1, num_replicas=4, rank=2)
    reference = sampler.indices(
        9 * 10**8 + 2,
        9 * 10**8 + 2 + 4 * 5,
    ).tolist()[::4]
    sampler.load_state_dict({"epoch": 0, "consumed": 9 * 10**8})
    iterator = iter(sampler)
    assert [next(iterator) for _ in range(5)] == reference
    assert len(sampler) == -(-(10**10 - 9 * 10**8) // 4)


def test_set_epoch_keeps_a_restored_position_only_for_its_epoch() -> None:
    sampler = ResumableSampler(20, seed=1)
    sampler.load_state_dict({"epoch": 2, "consumed": 15})
    sampler.set_epoch(2)
    assert sampler.consumed == 15 and len(sampler) == 5
    sampler.set_epoch(3)
    assert (sampler.epoch, sampler.consumed, len(sampler)) == (3, 0, 20)


def test_state_dict_is_json_and_complete() -> None:
    sampler = ResumableSampler(10, seed=2**70, num_replicas=2, rank=0, drop_last=True)
    state = sampler.state_dict(consumed=4)
    assert json.loads(json.dumps(state)) == state
    assert state == {
        "version": 1, "epoch": 0, "consumed": 4, "num_replicas": 2, "num_samples": 10,
        "seed": 2**70, "shuffle": True, "order": "global", "drop_last": True,
        "block_size": None, "window_blocks": 4,
    }  # fmt: skip


@pytest.mark.parametrize(("change", "field"), [
    ({"num_samples": 11}, "num_samples=11"),
    ({"seed": 3}, "seed=3"),
    ({"order": "blocks"}, "order='blocks'"),
    ({"shuffle": False}, "shuffle=False"),
    ({"drop_last": True}, "drop_last=True"),
    ({"block_size": 7}, "block_size=7"),
])  # fmt: skip
def test_config_drift_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    state = ResumableSampler(10, seed=1).state_dict() | change
    with pytest.raises(SamplerStateError, match=f"saved with {field}; this sampler has"):
        ResumableSampler(10, seed=1).load_state_dict(state)


def test_config_drift_is_accepted_with_strict_false(caplog: pytest.LogCaptureFixture) -> None:
    state = ResumableSampler(12, seed=1).state_dict(consumed=8)
    sampler = ResumableSampler(10, seed=1, strict=False)
    with caplog.at_level(logging.WARNING, logger="indextar.order.sampler"):
        sampler.load_state_dict(state)
    assert "num_samples=12" in caplog.text
    assert len(list(sampler)) == 2


@pytest.mark.parametrize(("state", "message"), [
    ({"consumed": 0}, r"missing \['epoch'\]"),
    ({"epoch": 0}, r"missing \['consumed'\]"),
    ({"epoch": 0, "consumed": 0, "step": 3}, r"unknown keys \['step'\]"),
    ({"epoch": 0, "consumed": -1}, "consumed=-1 is negative"),
    ({"epoch": 0, "consumed": 11}, "consumed=11 exceeds num_samples=10"),
    ({"epoch": 0, "consumed": 2.5}, "^sampler state: consumed must be an int; got 2.5$"),
    ({"epoch": 0, "consumed": True}, "consumed must be an int"),
    ({"epoch": -1, "consumed": 0}, "epoch=-1"),
    ({"epoch": "1", "consumed": 0}, "epoch must be an int"),
    ({"epoch": 0, "consumed": 0, "version": 2}, "version 2"),
    ([("epoch", 0)], "must be a mapping; got list"),
])  # fmt: skip
def test_bad_states_are_refused(state: Any, message: str) -> None:
    sampler = ResumableSampler(10, seed=1)
    sampler.load_state_dict({"epoch": 4, "consumed": 6})
    with pytest.raises(SamplerStateError, match=message):
        sampler.load_state_dict(state)
    assert (sampler.epoch, sampler.consumed) == (4, 6)  # nothing silently restarted


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_replicas": 0}, "num_replicas must be >= 1"),
    ({"num_replicas": 2, "rank": 2}, r"rank must be in \[0, 2\)"),
    ({"order": "shards"}, "order must be"),
    ({"block_size": 0}, "block_size must be >= 1"),
    ({"window_blocks": 0}, "window_blocks must be >= 1"),
    ({"seed": 1.5}, "seed must be an int"),
])  # fmt: skip
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        ResumableSampler(10, **kwargs)


def test_state_dict_refuses_a_bad_consumed() -> None:
    with pytest.raises(ValueError, match="consumed=11 exceeds"):
        ResumableSampler(10).state_dict(consumed=11)


def test_torch_dataloader_accepts_it() -> None:
    import torch
    from torch.utils.data import DataLoader

    sampler = ResumableSampler(list(range(10)), seed=1)
    batches = [b.tolist() for b in DataLoader(list(range(10)), batch_size=4, sampler=sampler)]
    assert [i for b in batches for i in b] == list(ResumableSampler(10, seed=1))
    unbatched = [int(x) for x in DataLoader(list(range(10)), batch_size=None, sampler=sampler)]
    assert unbatched == list(ResumableSampler(10, seed=1))
    assert isinstance(torch.utils.data.BatchSampler(sampler, 3, False), torch.utils.data.Sampler)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize(("workers_before", "workers_after"), [(0, 0), (2, 2), (2, 0), (0, 2)])
def test_torchdata_stateful_dataloader_resumes_exactly(
    workers_before: int, workers_after: int
) -> None:
    import torch  # noqa: F401
    import torchdata.stateful_dataloader as stateful

    def loader(workers: int) -> Any:
        return stateful.StatefulDataLoader(
            list(range(50)), batch_size=4, num_workers=workers,
            sampler=ResumableSampler(50, seed=1),
        )  # fmt: skip

    first, trained = loader(workers_before), []
    for step, batch in enumerate(first, start=1):
        trained += batch.tolist()
        if step == 3:
            state = json.loads(json.dumps(first.state_dict()))
            break
    second = loader(workers_after)
    if workers_after == workers_before:
        second.load_state_dict(state)  # torchdata's own path: same worker count only
    else:
        second.sampler.load_state_dict(sampler_state_from_loader(state))
    trained += [i for batch in second for i in batch.tolist()]
    assert trained == list(ResumableSampler(50, seed=1))


DOCS = Path(__file__).resolve().parents[2] / "docs" / "distributed.md"


@pytest.mark.parametrize(
    "block",
    re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S) if DOCS.exists() else [],
)
def test_docs_examples_run(block: str) -> None:
    exec(compile(block, str(DOCS), "exec"), {})


# -- blocks of block_size in O(1) memory --------------------------------------------------


@pytest.mark.parametrize("size", [1, 7, 100, 1000, 1023, 1025, 4099])
@pytest.mark.parametrize(("block_size", "window_blocks"), [(1, 1), (3, 2), (64, 4), (1024, 3)])
def test_uniform_blocks_in_o1_give_blockorders_indices(
    size: int, block_size: int, window_blocks: int
) -> None:
    from indextar.order.epoch import BlockOrder, UniformBlockOrder, uniform_blocks

    for seed, epoch in [(0, 0), (7, 3)]:
        reference = BlockOrder(uniform_blocks(size, block_size), seed, epoch, window_blocks)
        lazy = UniformBlockOrder(size, block_size, seed, epoch, window_blocks)
        positions = np.random.default_rng(seed).permutation(size)  # any order of asking
        assert np.array_equal(lazy.indices(positions), reference.indices(positions))


def test_blocks_at_1e10_samples_start_in_little_memory() -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        sampler = ResumableSampler(10**10, seed=3, order="blocks", block_size=1024)
        sampler.set_epoch(2)
        first = list(itertools.islice(iter(sampler), 4 * 1024))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB"  # was 547 MB: arrays per block
    assert len(set(first)) == 4096 and all(0 <= i < 10**10 for i in first)
    # The first window is 4 whole blocks (window_blocks=4), shuffled together.
    assert len({i // 1024 for i in first}) == 4
