"""encoded_collate's reused shared-memory blocks (read/shmblocks.py), through real fork
and spawn DataLoader workers: a block is filled again only once every tensor over it
is gone in the training process, so batches and views a caller keeps never change."""

from __future__ import annotations

import dataclasses
import gc
import io
import os
import pickle
import tarfile
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import numpy as np
import pytest
import torch
from procstats import mapping_of
from torch.utils.data import DataLoader

from indextar import IndexedTarDataset, IndextarError, encoded_collate
from indextar.read import shmblocks

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

COUNT = 96


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Samples of different sizes (1-30 KB), each a byte pattern of its own."""
    path = tmp_path_factory.mktemp("shm") / "blobs-000000.tar"
    rng = np.random.default_rng(0)
    with tarfile.open(path, "w") as tar:
        for i in range(COUNT):
            blob = rng.integers(0, 256, int(rng.integers(1_000, 30_000)), np.uint8).tobytes()
            for ext, data in (("jpg", blob), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def loader(
    path: Path,
    method: str = "fork",
    workers: int = 2,
    *,
    reuse: bool = True,
    persistent_workers: bool = False,
) -> DataLoader:
    ds = IndexedTarDataset(str(path), keys=("jpg", "cls"), decode=[])
    return DataLoader(
        ds,
        batch_size=5,
        num_workers=workers,
        multiprocessing_context=method,
        collate_fn=encoded_collate(reuse=reuse),
        shuffle=True,
        generator=torch.Generator().manual_seed(1),
        persistent_workers=persistent_workers,
    )


def check(batch, ds: IndexedTarDataset) -> None:  # type: ignore[no-untyped-def]
    labels = batch.rest[0].tolist()
    assert [bytes(b.numpy()) for b in batch.images()] == [ds[i][0] for i in labels]


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("reuse", [True, False])
def test_workers_reuse_a_few_blocks(shard: Path, method: str, reuse: bool) -> None:
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    blocks, seen = set(), 0
    for batch in loader(shard, method, reuse=reuse):
        check(batch, ds)
        where = mapping_of(batch.data.data_ptr())
        assert "/dev/shm/" in where, where
        blocks.add(where)  # torch names each shared-memory block anew
        seen += len(batch)
        del batch
    assert seen == COUNT
    batches = -(-COUNT // 5)
    if reuse:  # 2 workers, each as many blocks as were held at once
        assert len(blocks) <= 2 * 4, blocks
    else:
        assert len(blocks) == batches


def edit_in_worker(samples: list[tuple[bytes, int]]) -> object:
    """A collate_fn around encoded_collate that changes the batch in the worker."""
    batch = encoded_collate()(samples)
    (labels,) = batch.rest
    return dataclasses.replace(batch, rest=(labels * 10, "edited"))


def test_a_batch_changed_in_the_worker_crosses_as_changed(shard: Path) -> None:
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    loader = DataLoader(ds, batch_size=5, num_workers=1, collate_fn=edit_in_worker)
    for batch in loader:
        labels, note = batch.rest
        assert note == "edited"
        assert [bytes(b.numpy()) for b in batch.images()] == [ds[i // 10][0] for i in labels]


def test_batches_kept_are_never_overwritten(shard: Path) -> None:
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    kept = list(loader(shard, workers=1))  # far more batches than one worker's blocks
    assert len(kept) == -(-COUNT // 5)
    for batch in kept:
        check(batch, ds)


def test_a_view_keeps_its_block(shard: Path) -> None:
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    views: list[tuple[torch.Tensor, int]] = []
    batches = loader(shard, workers=1, persistent_workers=True)  # the same pool throughout
    for epoch in range(3):
        for batch in batches:
            if epoch == 0 and len(views) < 4:
                views.append((batch.images()[0], batch.rest[0][0].item()))
            check(batch, ds)
            del batch  # only the view stays
    for view, label in views:
        assert bytes(view.numpy()) == ds[label][0]


def test_without_reuse_every_batch_has_its_own_block(shard: Path) -> None:
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    for batch in loader(shard, reuse=False):
        assert batch.data.is_shared() and batch.offsets.is_shared()
        check(batch, ds)


def crossed(value: object) -> object:
    """``value`` sent as a DataLoader worker sends it (torch's reductions: tensors by
    shared memory) and received in this process."""
    return pickle.loads(ForkingPickler.dumps(value))


def test_a_block_is_reused_once_its_tensors_are_gone() -> None:
    pool = shmblocks.BlockPool(slots=2)
    first = pool.take(100)
    assert first is not None and first.flags is not None and first.new_block is not None
    first.tensor[:] = torch.arange(100, dtype=torch.uint8)
    got = crossed(first)  # the first batch brings the block and the flags
    assert torch.equal(got, torch.arange(100, dtype=torch.uint8))
    view = got[10:20]
    del got
    second = pool.take(50)  # block 0 is held by the view: a new block
    assert second is not None and second.slot == 1 and second.flags is None
    held = crossed(second)
    assert pool.take(10) is None  # both held: the worker makes a one-off block
    del view
    third = pool.take(80)  # block 0 is free again, and big enough: nothing new crosses
    assert third is not None and third.slot == 0 and third.new_block is None
    again = crossed(third)
    assert again.numel() == 80 and again[79].item() == 79
    assert held.numel() == 50


def test_a_block_never_sent_is_refused() -> None:
    unsent = shmblocks.BlockPool(slots=2)
    assert unsent.take(10) is not None  # its first batch never reaches this process
    later = unsent.take(10)
    with pytest.raises(IndextarError, match="never sent"):
        crossed(later)


def test_what_a_failed_batch_would_have_brought_goes_with_the_next() -> None:
    pool = shmblocks.BlockPool(slots=2)
    failed = pool.take(100)  # its batch fails in the worker: never sent
    assert failed is not None and failed.new_block is not None and failed.flags is not None
    pool.give_back(failed)
    retry = pool.take(100)
    assert retry is not None and retry.slot == failed.slot
    assert retry.new_block is not None and retry.flags is not None
    retry.tensor[:] = 7
    assert crossed(retry).tolist() == [7] * 100


def test_a_grown_block_crosses_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shmblocks, "_MIN_BLOCK", 16)
    pool = shmblocks.BlockPool(slots=2)
    small = pool.take(100)
    assert small is not None and small.new_block is not None
    small.tensor[:] = 1
    assert crossed(small).sum().item() == 100  # sent, then let go
    big = pool.take(1000)  # block 0 is free but too small: it is grown, and sent again
    assert big is not None and big.slot == small.slot and big.new_block is not None
    big.tensor[:] = 2
    got = crossed(big)
    assert got.numel() == 1000 and got.sum().item() == 2000


def test_a_forked_child_letting_go_frees_nothing() -> None:
    pool = shmblocks.BlockPool(slots=2)
    taken = pool.take(100)
    assert taken is not None
    got = crossed(taken)
    pid = os.fork()
    if pid == 0:  # the child drops its copy of the batch
        del got
        gc.collect()
        os._exit(0)
    os.waitpid(pid, 0)
    again = pool.take(100)  # block 0 is still the parent's: another block
    assert again is not None and again.slot != taken.slot
    assert got.numel() == 100


def test_an_exited_workers_blocks_are_let_go_with_its_last_batch(shard: Path) -> None:
    """Once a loader's workers have exited and its batches are gone, their blocks are
    unmapped: not kept until another loader's pool attaches (there may be none)."""
    gc.collect()
    before = set(shmblocks._attached)
    kept, blocks = [], set()
    for n, batch in enumerate(loader(shard)):  # workers exit at the loader's end
        blocks.add(mapping_of(batch.data.data_ptr()))
        if n < 2:
            kept.append(batch)  # one of each worker's
        del batch
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    for held in kept:  # held batches keep their blocks, exited workers or not
        check(held, ds)
    del held

    def mapped() -> set[str]:
        with open("/proc/self/maps") as maps:
            return {line.split(maxsplit=5)[-1].strip() for line in maps} & blocks

    assert {mapping_of(held.data.data_ptr()) for held in kept} <= mapped()
    kept.clear()  # the last leases go: the exited workers' blocks with them
    gc.collect()
    assert not mapped(), mapped()
    assert not set(shmblocks._attached) - before


def test_a_loops_last_batch_lets_every_exited_workers_blocks_go(shard: Path) -> None:
    """A plain loop drops each batch while the workers run, but for the last one, which
    its variable holds past the loader's end: its release unmaps both workers' blocks,
    the other worker's too (its last lease went while it still ran)."""
    gc.collect()
    before = set(shmblocks._attached)
    blocks = set()
    for batch in loader(shard):
        blocks.add(mapping_of(batch.data.data_ptr()))
    assert len(set(shmblocks._attached) - before) == 2  # the workers have exited by now
    del batch
    gc.collect()
    with open("/proc/self/maps") as maps:
        assert not {line.split(maxsplit=5)[-1].strip() for line in maps} & blocks
    assert not set(shmblocks._attached) - before


def test_a_worker_says_once_when_its_blocks_stay_held(caplog: pytest.LogCaptureFixture) -> None:
    """Every block held for HELD_TOO_LONG takes in a row is logged once, naming the fix;
    a block coming free starts the count again."""
    pool = shmblocks.BlockPool(slots=2)
    held = [pool.take(100), pool.take(100)]
    with caplog.at_level("WARNING", logger="indextar.read.shmblocks"):
        for _ in range(shmblocks.HELD_TOO_LONG - 1):
            assert pool.take(10) is None
        assert not caplog.records
        for _ in range(5):
            assert pool.take(10) is None
        assert len(caplog.records) == 1
        message = caplog.records[0].getMessage()
        assert f"pid {os.getpid()}" in message and "2 reusable" in message
        assert "reuse=False" in message and f"last {shmblocks.HELD_TOO_LONG} batches" in message
        first = held[0]
        assert first is not None
        pool.give_back(first)
        assert pool.take(10) is not None  # free again: the count starts again
        for _ in range(shmblocks.HELD_TOO_LONG - 1):
            assert pool.take(10) is None
        assert len(caplog.records) == 1
        assert pool.take(10) is None
        assert len(caplog.records) == 2


class _Copied:
    """A collate_fn around encoded_collate that returns a copy of its batch's bytes: the
    block is never sent, so it is never given back."""

    def __init__(self) -> None:
        self.inner = encoded_collate()

    def __call__(self, samples: list[tuple[bytes, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.inner(samples)
        return batch.data.clone(), batch.rest[0]


def test_a_collate_fn_that_drops_the_block_is_named_by_the_worker(
    shard: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Through a real spawn worker (its log on the stderr it shares): a wrapper that
    replaces the block's tensors is named once the worker's blocks have all been taken;
    the batches are still right."""
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    batches = shmblocks.SLOTS + shmblocks.HELD_TOO_LONG
    wrapped = DataLoader(
        torch.utils.data.Subset(ds, range(batches)),
        batch_size=1,
        num_workers=1,
        multiprocessing_context="spawn",
        collate_fn=_Copied(),
    )
    for data, labels in wrapped:
        assert bytes(data.numpy()) == ds[int(labels)][0]
    err = capfd.readouterr().err
    assert err.count("reusable shared-memory blocks have been held") == 1
    assert "collate_fn that wraps encoded_collate" in err
