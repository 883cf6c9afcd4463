"""IndexedTarDataset read from many threads at once, past ``max_open_shards``: every
thread gets its own sample's bytes, while the open shards are evicted under it."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

import indextar

SHARDS, PER_SHARD = 12, 6


def content(shard: int, i: int) -> bytes:
    """A member that names its shard and sample in every byte range (no two alike)."""
    return f"shard {shard:02d} sample {i:02d} ".encode() * (97 + 13 * shard + i)


@pytest.fixture(scope="module")
def pattern(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("threads")
    for shard in range(SHARDS):
        with indextar.TarWriter(folder / f"part-{shard:02d}.tar", index=False) as sink:
            for i in range(PER_SHARD):
                sink.write({"__key__": f"s{shard:02d}-{i:02d}", "bin": content(shard, i)})
        indextar.build_index(folder / f"part-{shard:02d}.tar")
    return str(folder / f"part-{{00..{SHARDS - 1:02d}}}.tar")


def expected(position: int) -> tuple[str, bytes]:
    shard, i = divmod(position, PER_SHARD)
    return f"s{shard:02d}-{i:02d}", content(shard, i)


@pytest.fixture
def switching() -> Iterator[None]:
    """Threads switch every microsecond: the races show on every run."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


def test_threads_reading_past_max_open_shards_get_their_own_samples(
    pattern: str, switching: None
) -> None:
    ds = indextar.IndexedTarDataset(pattern, max_open_shards=2)
    total = SHARDS * PER_SHARD
    order = [(i * 7) % total for i in range(3000)]  # another shard at nearly every read

    def read(position: int) -> tuple[int, tuple[object, object]]:
        sample = ds[position]
        return position, (sample["__key__"], sample["bin"])

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(read, order))
    assert [p for p, sample in got if sample != expected(p)] == []
    assert len(ds._open) <= 2


def test_threads_reading_batches_past_max_open_shards_get_their_own_samples(
    pattern: str, switching: None
) -> None:
    ds = indextar.IndexedTarDataset(pattern, max_open_shards=1)
    total = SHARDS * PER_SHARD
    batches = [[(b * 5 + i * 11) % total for i in range(8)] for b in range(400)]

    def read(batch: list[int]) -> list[tuple[object, object]]:
        return [(s["__key__"], s["bin"]) for s in ds.__getitems__(batch)]

    with ThreadPoolExecutor(16) as pool:
        for batch, samples in zip(batches, pool.map(read, batches)):
            assert samples == [expected(p) for p in batch]
    ds.close()  # every shard closed, none leased any more
    assert len(ds._open) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_read_holds_the_cache_reads_on_its_own(pattern: str) -> None:
    # At the fork, a read holds a lease of shard 0 and another thread the cache's lock
    # (a DataLoader forking workers while a thread reads): the child must neither wait
    # for a lock that no thread of its own will release, nor keep shard 0's lease.
    ds = indextar.IndexedTarDataset(pattern, max_open_shards=2)
    ds[0]
    lease = ds._open.acquire(0)
    assert lease is not None
    with ds._open._lock:
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if it reads every sample right
            ok = all((ds[p]["__key__"], ds[p]["bin"]) == expected(p) for p in range(72))
            os._exit(0 if ok and lease.readers == 0 else 1)
    ds._open.release(lease)
    for _ in range(300):  # 30 s
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child waited for its parent's lock")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
