"""Concurrency: many processes indexing the same shards, and DataLoader workers reading
while another process rebuilds the indexes under them."""

from __future__ import annotations

import hashlib
import multiprocessing
import random
from pathlib import Path

import torch.utils.data
from conftest import sample_members, tar_bytes

from indextar import IndexedTarDataset, build_index, open_index
from indextar.index.shard import INDEX_SUFFIX

PROCESSES = 8
SHARDS = 20


def index_digest(shard: str) -> str:
    """What an index says about its shard: every member and sample row, and the metadata
    that does not depend on when it was built."""
    index = open_index(shard)
    h = hashlib.sha1()
    with index.connect() as conn:
        for table in ("members", "samples", "skipped"):
            for row in conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2"):
                h.update(repr(row).encode())
        for row in conn.execute(
            "SELECT key, value FROM meta WHERE key NOT IN ('created') ORDER BY key"
        ):
            h.update(repr(row).encode())
    conn.close()
    return h.hexdigest()


def _index_all(shards: list[str], barrier: object, seed: int) -> dict[str, str]:
    order = shards[:]
    random.Random(seed).shuffle(order)
    barrier.wait()  # type: ignore[attr-defined]
    digests = {}
    for shard in order:
        build_index(shard, force=True)  # every process really writes every index
        digests[shard] = index_digest(shard)
    return digests


def test_eight_processes_index_the_same_twenty_shards(tmp_path: Path) -> None:
    shards = []
    for n in range(SHARDS):
        path = tmp_path / f"shard-{n:02d}.tar"
        path.write_bytes(
            tar_bytes(sample_members(100, prefix=f"p{n}_"), ("ustar", "gnu", "pax")[n % 3])
        )
        shards.append(str(path))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["indextar"])
    with ctx.Manager() as manager, ctx.Pool(PROCESSES) as pool:
        barrier = manager.Barrier(PROCESSES)
        jobs = [pool.apply_async(_index_all, (shards, barrier, seed)) for seed in range(PROCESSES)]
        results = [job.get(timeout=120) for job in jobs]
    final = {shard: index_digest(shard) for shard in shards}
    assert all(result == final for result in results)  # all 8 x 20 builds identical
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(
        [Path(s).name for s in shards] + [Path(s).name + INDEX_SUFFIX for s in shards]
    )


def _rebuild_until_stopped(shards: list[str], stop: object, started: object) -> int:
    rounds = 0
    started.set()  # type: ignore[attr-defined]
    while not stop.is_set():  # type: ignore[attr-defined]
        for shard in shards:
            build_index(shard, force=True)
        rounds += 1
    return rounds


def test_dataloader_workers_read_correct_bytes_while_indexes_are_rebuilt(tmp_path: Path) -> None:
    expected: dict[str, bytes] = {}
    shards = []
    for n in range(4):
        members = sample_members(200, prefix=f"q{n}_")
        expected.update(members)
        path = tmp_path / f"busy-{n}.tar"
        path.write_bytes(tar_bytes(members))
        build_index(path)
        shards.append(str(path))
    # One open shard per worker: every switch of shard opens an index file again.
    dataset = IndexedTarDataset(shards, max_open_shards=1)
    sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(
        dataset, sampler=sampler, batch_size=16, num_workers=2, collate_fn=lambda batch: batch
    )
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(1) as pool:
        stop, started = manager.Event(), manager.Event()
        job = pool.apply_async(_rebuild_until_stopped, (shards, stop, started))
        assert started.wait(60)
        checked = 0
        for _ in range(2):
            for batch in loader:
                for sample in batch:
                    key = sample["__key__"]
                    assert (
                        sample["jpg"] == expected[key + ".jpg"]
                        and sample["cls"] == expected[key + ".cls"]
                    )
                    checked += 1
        stop.set()
        rebuilds = job.get(timeout=60)
    assert checked == 2 * len(dataset) and rebuilds >= 1
    print(f"{checked} samples read during {rebuilds} rounds of rebuilding {len(shards)} indexes")
