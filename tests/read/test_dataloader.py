"""IndexedTarDataset under real DataLoaders: fork and spawn, persistent workers,
DistributedSampler on every rank, nothing open across fork, flat worker memory."""

from __future__ import annotations

import gc
import io
import os
import tarfile
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402
from wds_shards import write_shards

from indextar import IndexedTarDataset, ResumableSampler, build_index

SHARDS, PER_SHARD = 3, 10
N = SHARDS * PER_SHARD


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    paths = write_shards(tmp_path_factory.mktemp("loader"), SHARDS, PER_SHARD)
    for path in paths:
        build_index(path)
    return [str(p) for p in paths]


def check_worker_has_nothing_open(worker_id: int) -> None:
    """worker_init_fn: no shard is mapped or open in a fresh worker."""
    info = torch.utils.data.get_worker_info()
    shard_paths = set(info.dataset.shards)
    with open("/proc/self/maps") as f:
        mapped = {line.split(maxsplit=5)[-1].strip() for line in f if len(line.split()) >= 6}
    assert not mapped & shard_paths, f"worker {worker_id} inherited mappings {mapped & shard_paths}"
    targets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    leaked = {t for t in targets if t in shard_paths or t.endswith(".idx.sqlite")}
    assert not leaked, f"worker {worker_id} inherited open files {leaked}"


def transpose(batch: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return list(zip(*batch))


def indices_of(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch[0]]


# Spawned workers import torch afresh (seconds each), so one spawn case covers
# persistent workers too; fork covers both separately.
@pytest.mark.parametrize(
    "workers,method,persistent",
    [(0, None, False), (2, "fork", False), (2, "fork", True), (2, "spawn", True)],
    ids=["in-process", "fork", "fork-persistent", "spawn-persistent"],
)
def test_every_epoch_sees_every_sample_once(
    shards: list[str], workers: int, method: str | None, persistent: bool
) -> None:
    ds = IndexedTarDataset(shards, keys=("__index__", "cls", "jpg;png"), decode="torchrgb8")
    ds[0]  # the parent has a shard open before the workers start
    loader = DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context=method,
        persistent_workers=persistent,
        worker_init_fn=check_worker_has_nothing_open if workers else None,
        collate_fn=transpose,
    )
    epochs = []
    for _ in range(2):
        seen = []
        for index, cls, image in loader:
            seen.extend(index)
            assert list(cls) == [i % 10 for i in index]
            assert all(img.dtype == torch.uint8 and img.shape == (3, 6, 8) for img in image)
        assert sorted(seen) == list(range(N))
        epochs.append(seen)
    assert epochs[0] != epochs[1]


@pytest.mark.parametrize("rank", [0, 1])
def test_distributed_sampler_every_rank(shards: list[str], rank: int) -> None:
    ds = IndexedTarDataset(shards, keys=("__index__", "__key__"))
    per_rank = {}
    for r in (0, 1):
        sampler = DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=7)
        sampler.set_epoch(1)
        expected = list(sampler)
        loader = DataLoader(
            ds,
            sampler=sampler,
            batch_size=4,
            num_workers=2 if r == rank else 0,
            collate_fn=lambda b: b,
        )
        got = [sample for batch in loader for sample in batch]
        assert [index for index, _ in got] == expected
        assert all(key == f"sample{index:06d}" for index, key in got)
        per_rank[r] = expected
    assert sorted(per_rank[0] + per_rank[1]) == list(range(N))
    assert not set(per_rank[0]) & set(per_rank[1])


def test_resumable_sampler_uses_shard_sizes(shards: list[str]) -> None:
    ds = IndexedTarDataset(shards, keys=("__index__",))
    sampler = ResumableSampler(ds, order="blocks", window_blocks=1, seed=3, num_replicas=1, rank=0)
    order = list(sampler)
    assert sorted(order) == list(range(N))
    # shards are the blocks: each run of PER_SHARD consecutive picks stays in one shard
    assert {
        tuple(sorted({i // PER_SHARD for i in order[k : k + PER_SHARD]}))
        for k in range(0, N, PER_SHARD)
    } <= {(s,) for s in range(SHARDS)}
    assert sorted(indices_of(DataLoader(ds, sampler=sampler, batch_size=8, num_workers=2))) == list(
        range(N)
    )


# -- memory -----------------------------------------------------------------------

RSS_SHARDS, RSS_PER_SHARD = 4, 10_000


def resident_memory() -> int:
    """This process's anonymous resident memory (``RssAnon``), in bytes.

    Copy-on-read refcounts and per-sample Python objects grow anonymous memory. The
    shards' mapped pages count in the total RSS too, but they are the page cache,
    shared, and their count depends on the kernel's fault-around, not on indextar.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


_reads = [0]


def with_memory(sample: tuple[int]) -> tuple[int, int, int]:
    """transform: the sample's index, the worker, and (every 500th read) its RSS."""
    worker = torch.utils.data.get_worker_info()
    _reads[0] += 1
    return sample[0], worker.id if worker else -1, resident_memory() if _reads[0] % 500 == 0 else -1


def reachable_objects(root: object) -> int:
    """How many Python objects ``root`` reaches (numpy arrays count as one each).

    Deprecation shims met on the way (``torch.distributed.reduce_op``, reached through
    a module's globals once some test has imported it) warn when asked their class: the
    walk only counts them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _reachable(root)


def _reachable(root: object) -> int:
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if (
            id(obj) in seen
            or isinstance(obj, (type, type(os)))
            or callable(obj)
            and not hasattr(obj, "__dict__")
        ):
            continue
        seen.add(id(obj))
        if not type(obj).__module__.startswith("numpy"):
            stack.extend(gc.get_referents(obj))
    return len(seen)


@pytest.fixture(scope="module")
def many_samples(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("rss")
    paths = []
    for n in range(RSS_SHARDS):
        path = folder / f"rss-{n}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(n * RSS_PER_SHARD, (n + 1) * RSS_PER_SHARD):
                data = str(i).encode()
                info = tarfile.TarInfo(f"key{i:07d}.cls")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        paths.append(str(path))
    return paths


def test_worker_memory_stays_flat_over_an_epoch(many_samples: list[str]) -> None:
    ds = IndexedTarDataset(many_samples, keys=("__index__",), transform=with_memory)
    loader = DataLoader(
        ds,
        batch_size=250,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=list,
    )
    readings: dict[int, list[int]] = {0: [], 1: []}
    seen = 0
    for batch in loader:
        readings[batch[0][1]].extend(memory for _, _, memory in batch if memory >= 0)
        seen += len(batch)
    assert seen == len(ds)
    for worker, memory in readings.items():
        # From the 5th reading (2,500 reads in, every shard's tables loaded: the order
        # is shuffled) to the end of the epoch, 17,500 more reads.
        grown = max(memory) - memory[4]
        assert grown < 1 * 2**20, f"worker {worker} grew by {grown / 2**20:.2f} MiB over an epoch"


def test_no_per_sample_python_objects(many_samples: list[str]) -> None:
    """What a worker would copy page by page on reading (copy-on-read refcounts) is
    O(shards): every per-sample value lives in a numpy array or a single bytes blob."""
    ds = IndexedTarDataset(many_samples, keys=("__key__",))
    empty = reachable_objects(ds)
    for i in range(0, len(ds), 7):
        ds[i]
    assert len(ds._open) == RSS_SHARDS
    assert reachable_objects(ds) - empty < 40 * RSS_SHARDS  # 40k samples read
