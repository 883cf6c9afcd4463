"""BucketBatchSampler: one bucket per batch, shuffled, equal per rank, resumable (issue 16)."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from indextar.errors import SamplerStateError
from indextar.order.buckets import BucketBatchSampler


def _buckets(n: int = 500, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.choice([3, 7, 8, 20], size=n, p=[0.5, 0.3, 0.15, 0.05])


def _epoch(sampler: BucketBatchSampler) -> list[list[int]]:
    return [sampler.batch(p) for p in range(sampler.num_batches)]


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_batch_is_one_bucket_and_every_sample_is_used(drop_last: bool) -> None:
    buckets = _buckets()
    sampler = BucketBatchSampler(buckets, batch_size=16, seed=5, drop_last=drop_last)
    batches = list(sampler)
    assert len(batches) == sampler.num_batches == len(sampler)
    assert all(len(b) == 16 and len(set(buckets[b].tolist())) == 1 for b in batches)
    counts = collections.Counter(buckets.tolist())
    expected = {k: (n // 16 if drop_last else -(-n // 16)) for k, n in counts.items()}
    assert collections.Counter(int(buckets[b[0]]) for b in batches) == expected
    seen = collections.Counter(i for b in batches for i in b)
    if drop_last:  # each sample at most once; only each bucket's remainder is left out
        assert max(seen.values()) == 1
        assert len(seen) == sum(n - n % 16 for n in counts.values())
    else:  # every sample, and a bucket's last batch completed with its first samples
        assert set(seen) == set(range(len(buckets)))
        assert sum(seen.values()) - len(buckets) == sum(-n % 16 for n in counts.values())
        assert max(seen.values()) <= 2


def test_orders_are_shuffled_per_epoch_and_buckets_mixed_uniformly() -> None:
    buckets = np.repeat([0, 1], [4000, 1000])  # 80% / 20%
    sampler = BucketBatchSampler(buckets, batch_size=10, seed=1)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first != second and sorted(map(sorted, first)) != sorted(map(sorted, second))
    # Batches are not bucket by bucket: within every tenth of the epoch, bucket 1 is
    # about a fifth of the batches (binomial, 50 batches each: 10 +- 3 sd).
    labels = [int(buckets[b[0]]) for b in first]
    for part in range(10):
        share = sum(labels[part * 50 : (part + 1) * 50])
        assert 1 <= share <= 22, (part, share)
    # Within a bucket, samples are shuffled: not in sample order.
    assert first[0] != sorted(first[0])
    assert [b for b in BucketBatchSampler(buckets, batch_size=10, seed=1)] == first
    assert list(BucketBatchSampler(buckets, batch_size=10, seed=2)) != first


def test_ranks_get_equal_counts_and_together_the_epoch() -> None:
    buckets = _buckets(333)
    whole = BucketBatchSampler(buckets, batch_size=8, seed=3, num_replicas=1, rank=0)
    order = _epoch(whole)
    for world in (2, 3, 5):
        for drop_last in (False, True):
            ranks = [
                list(
                    BucketBatchSampler(
                        buckets,
                        batch_size=8,
                        seed=3,
                        num_replicas=world,
                        rank=r,
                        drop_last=drop_last,
                    )
                )
                for r in range(world)
            ]
            assert len({len(r) for r in ranks}) == 1
            interleaved = [ranks[r][step] for step in range(len(ranks[0])) for r in range(world)]
            if drop_last:
                full = _epoch(BucketBatchSampler(buckets, batch_size=8, seed=3, drop_last=True))
                assert interleaved == full[: len(interleaved)]
                assert len(full) - len(interleaved) < world
            else:
                assert interleaved[: len(order)] == order
                assert interleaved[len(order) :] == order[: len(interleaved) - len(order)]


def test_resume_mid_epoch_on_another_world_size() -> None:
    buckets = _buckets(401)
    order = _epoch(BucketBatchSampler(buckets, batch_size=8, seed=9, num_replicas=1, rank=0))
    samplers = [
        BucketBatchSampler(buckets, batch_size=8, seed=9, num_replicas=2, rank=r) for r in range(2)
    ]
    steps = 7
    done = []
    iterators = [iter(s) for s in samplers]
    for _ in range(steps):
        done += [next(it) for it in iterators]
    state = json.loads(json.dumps(samplers[0].state_dict()))
    assert state["consumed"] == steps * 2 and samplers[1].consumed == steps * 2
    resumed = [
        BucketBatchSampler(buckets, batch_size=8, seed=9, num_replicas=3, rank=r) for r in range(3)
    ]
    rest = []
    for sampler in resumed:
        sampler.load_state_dict(state)
        sampler.set_epoch(0)  # the usual top-of-epoch call keeps the position
    ranks = [list(s) for s in resumed]
    assert len({len(r) for r in ranks}) == 1
    rest = [ranks[r][i] for i in range(len(ranks[0])) for r in range(3)]
    assert done == order[: steps * 2]
    assert rest[: len(order) - steps * 2] == order[steps * 2 :]
    assert all(consumed.consumed == len(order) for consumed in resumed)


def test_state_refuses_another_configuration() -> None:
    buckets = _buckets(100)
    sampler = BucketBatchSampler(buckets, batch_size=4, seed=0)
    state = sampler.state_dict(consumed=3)
    other_buckets = buckets.copy()
    other_buckets[0] = 99
    for changed, match in [
        (BucketBatchSampler(buckets, batch_size=5, seed=0), "batch_size"),
        (BucketBatchSampler(buckets, batch_size=4, seed=1), "seed"),
        (BucketBatchSampler(other_buckets, batch_size=4, seed=0), "bucket"),
    ]:
        with pytest.raises(SamplerStateError, match=match):
            changed.load_state_dict(state)
    with pytest.raises(SamplerStateError, match="unknown keys"):
        sampler.load_state_dict({**state, "colour": 1})
    with pytest.raises(SamplerStateError, match="exceeds"):
        sampler.load_state_dict({**state, "consumed": sampler.num_batches + 1})
    lenient = BucketBatchSampler(buckets, batch_size=4, seed=1, strict=False)
    lenient.load_state_dict(state)
    assert lenient.consumed == 3

    class View:
        selection = {"where": ["a > 1"], "samples": 100, "digest": "x"}

        def __len__(self) -> int:
            return 100

    selected = BucketBatchSampler(buckets, batch_size=4, seed=0, data=View())
    with pytest.raises(SamplerStateError, match="selection"):
        selected.load_state_dict(state)
    with pytest.raises(ValueError, match="bucket ids for a dataset of 3"):
        BucketBatchSampler(buckets, batch_size=4, data=[1, 2, 3])


def test_memory_is_one_array_of_sample_numbers() -> None:
    sampler = BucketBatchSampler(np.zeros(1000, dtype=np.int8), batch_size=10)
    assert sampler._members.dtype == np.uint32 and sampler._members.size == 1000
