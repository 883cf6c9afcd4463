"""pooled_collate through real fork and spawn DataLoader workers: every batch is what
default_collate makes (types, dtypes, values), its tensors in a few reused blocks;
batches it leaves to default_collate, and default_collate's errors, are the same."""

from __future__ import annotations

import functools

import pytest
import torch
from collatesamples import KINDS, Kinds, same
from procstats import mapping_of
from torch.utils.data import DataLoader, default_collate

from indextar import pooled_collate

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


def expected(dataset: Kinds, batch_size: int) -> list[object]:
    return [
        default_collate([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        for start in range(0, len(dataset), batch_size)
    ]


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "ragged"])
def test_batches_are_default_collates(kind: str) -> None:
    dataset = Kinds(kind)
    loader = DataLoader(dataset, batch_size=6, num_workers=2, collate_fn=pooled_collate)
    got = list(loader)
    want = expected(dataset, 6)
    assert len(got) == len(want) == 7
    assert all(same(a, b) for a, b in zip(got, want)), (got[0], want[0])
    if kind in ("tuple", "dict", "nested"):  # every tensor of a batch in one block
        for batch in got:
            storages = {t.untyped_storage().data_ptr() for t in tensors_of(batch)}
            assert len(storages) == 1 and "/dev/shm/" in mapping_of(storages.pop())


def tensors_of(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value
    if isinstance(items, (list, tuple)) or isinstance(value, dict):
        return [t for item in items for t in tensors_of(item)]
    return []


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_reuse_a_few_blocks_and_kept_batches_stay(method: str) -> None:
    dataset = Kinds("tuple", count=96)
    loader = DataLoader(
        dataset, batch_size=4, num_workers=2, collate_fn=pooled_collate,
        multiprocessing_context=method,
    )  # fmt: skip
    want = expected(dataset, 4)
    blocks, kept = set(), []
    for n, (batch, wanted) in enumerate(zip(loader, want, strict=True)):
        assert same(batch, wanted) and type(batch) is list
        tensors = [field for field in batch if isinstance(field, torch.Tensor)]
        assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1  # one block
        blocks.add(mapping_of(tensors[0].data_ptr()))
        if n < 2:
            kept.append((batch, wanted))
    assert 2 <= len(blocks) <= len(want) // 2, blocks  # a few a worker, not one a batch
    assert all(same(batch, wanted) for batch, wanted in kept)
    fresh = DataLoader(
        dataset, batch_size=4, num_workers=2, multiprocessing_context=method,
        collate_fn=functools.partial(pooled_collate, reuse=False),
    )  # fmt: skip
    apart = {mapping_of(b[0].data_ptr()) for b in fresh}
    assert len(apart) == len(want)  # reuse=False: default_collate, a new block a batch


def test_default_collates_errors_reach_the_caller() -> None:
    dataset = Kinds("ragged", count=8)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        default_collate([dataset[i] for i in range(4)])
    loader = DataLoader(dataset, batch_size=4, num_workers=1, collate_fn=pooled_collate)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        next(iter(loader))
    ok = DataLoader(Kinds("tuple", count=8), batch_size=4, num_workers=1, collate_fn=pooled_collate)
    assert [b[1].tolist() for b in ok] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # the pool recovers


def test_outside_a_worker_it_is_default_collate() -> None:
    for kind in ("tuple", "dict"):
        samples = [Kinds(kind)[i] for i in range(3)]
        got = pooled_collate(samples)
        assert type(got) in (list, dict)  # exactly: not a PooledList or PooledDict
        assert same(got, default_collate(samples))
