"""remote="cache" with cache_fill="ranges": the ranged reads of an epoch fill the shard
cache (source/fillcache.py) against the loopback HTTP server, with DataLoader workers
and the read-ahead: every sample exact, each shard cached whole after the epoch and the
next epoch served locally; a changed object refused and never cached; a part of another boot never
trusted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.utils.data
from conftest import tar_bytes
from loopback_servers import HttpServer

import indextar
from indextar.errors import StaleIndexError
from indextar.source.cache import ShardCache
from indextar.source.conditional import RemoteStat

SHARDS, PER_SHARD, SIZE = 3, 24, 20_000


def members(shard: int) -> dict[str, bytes]:
    rng = np.random.default_rng(shard)
    return {
        f"s{shard}_{i:04d}.{ext}": rng.integers(0, 256, SIZE + 37 * i, np.uint8).tobytes()
        if ext == "bin" else f"{shard}/{i}".encode()
        for i in range(PER_SHARD)
        for ext in ("bin", "txt")
    }  # fmt: skip


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served")
    for n in range(SHARDS):
        (root / f"fill-{n}.tar").write_bytes(tar_bytes(members(n)))
    return root


def dataset(http: HttpServer, tmp_path: Path, **options: Any) -> indextar.IndexedTarDataset:
    return indextar.IndexedTarDataset(
        [http.url(f"fill-{n}.tar") for n in range(SHARDS)], remote="cache",
        cache_fill="ranges", index_dir=tmp_path / "ix", cache_dir=tmp_path / "cache",
        **options,
    )  # fmt: skip


def epoch(ds: indextar.IndexedTarDataset, workers: int, seed: int) -> dict[str, bytes]:
    batches = indextar.ReadAheadBatches(indextar.ResumableSampler(ds, seed=seed), 8)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=batches, num_workers=workers, collate_fn=list
    )  # the read-ahead fills the cache along with the batches
    return {s["__key__"]: s["bin"] for batch in loader for s in batch}


def expected() -> dict[str, bytes]:
    return {
        name.partition(".")[0]: data
        for n in range(SHARDS)
        for name, data in members(n).items()
        if name.endswith(".bin")
    }


def served(http: HttpServer) -> tuple[int, int]:
    stats = http.stats()
    names = [f"fill-{n}.tar" for n in range(SHARDS)]
    return sum(stats.get(n, {}).get("requests", 0) for n in names), sum(
        stats.get(n, {}).get("bytes", 0) for n in names
    )


def cached_files(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if p.name.endswith(".tar"))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_fills_the_cache_and_the_next_one_reads_it_locally(
    http: HttpServer, http_root: Path, tmp_path: Path, workers: int
) -> None:
    ds = dataset(http, tmp_path)  # indexes built here: their reads are not counted
    http.reset()
    assert epoch(ds, workers, seed=1) == expected()
    _, fetched = served(http)
    shard_bytes = sum((http_root / f"fill-{n}.tar").stat().st_size for n in range(SHARDS))
    assert fetched <= 1.1 * shard_bytes  # each byte about once (the last few samples twice)
    cache = tmp_path / "cache"
    files = cached_files(cache)
    assert len(files) == SHARDS and not list(cache.glob("*.part*"))
    assert sorted(f.read_bytes() for f in files) == sorted(
        (http_root / f"fill-{n}.tar").read_bytes() for n in range(SHARDS)
    )
    http.reset()
    assert epoch(ds, workers, seed=2) == expected()  # the same dataset object, its shards open
    assert epoch(dataset(http, tmp_path), workers, seed=3) == expected()  # a new one
    assert served(http) == (0, 0)


def test_a_filling_shard_is_read_ahead_on_the_event_loop(
    http: HttpServer, http_root: Path, tmp_path: Path
) -> None:
    # Before: FillingSource.range_coroutine returned None, so that its spans went to
    # the read-ahead's threads (through read(), which serves and fills the cache).
    ds = dataset(http, tmp_path)
    threads = {t for t in threading.enumerate() if t.name.startswith("indextar-prefetch")}
    assert epoch(ds, 0, seed=4) == expected()
    started = {t for t in threading.enumerate() if t.name.startswith("indextar-prefetch")}
    stats = ds.prefetch_stats()
    assert stats is not None and stats.taken > len(expected()) // 2
    assert started - threads == set()
    files = cached_files(tmp_path / "cache")
    assert sorted(f.read_bytes() for f in files) == sorted(
        (http_root / f"fill-{n}.tar").read_bytes() for n in range(SHARDS)
    )


def test_an_object_changed_mid_epoch_is_refused_and_never_cached(
    tmp_path: Path,
) -> None:
    root = tmp_path / "served"
    root.mkdir()
    old = tar_bytes(members(0))
    (root / "fill-0.tar").write_bytes(old)
    with HttpServer(root) as http:
        ds = indextar.IndexedTarDataset(
            http.url("fill-0.tar"), remote="cache", cache_fill="ranges",
            index_dir=tmp_path / "ix", cache_dir=tmp_path / "cache",
        )  # fmt: skip
        first = ds.__getitems__(list(range(0, PER_SHARD // 2)))
        assert [s["bin"] for s in first] == [members(0)[f"s0_{i:04d}.bin"] for i in range(12)]
        changed = tar_bytes(members(1)).replace(b"s1_", b"s0_")
        assert len(changed) == len(old)
        (root / "fill-0.tar").write_bytes(changed)  # same size, another ETag
        with pytest.raises(StaleIndexError):
            ds.__getitems__(list(range(PER_SHARD // 2, PER_SHARD)))
    assert cached_files(tmp_path / "cache") == []


def test_a_part_left_by_another_boot_is_not_trusted(
    http: HttpServer, http_root: Path, tmp_path: Path
) -> None:
    ds = dataset(http, tmp_path)
    cache = ShardCache(tmp_path / "cache", limit="1GB")
    # a part full of garbage whose log, of another boot, says it holds every byte
    shard = ds.shard_index(0).meta
    path = cache.path_for(http.url("fill-0.tar"), RemoteStat(shard.shard_size, shard.etag))
    path.parent.mkdir(parents=True, exist_ok=True)
    part = Path(f"{path}.part")
    part.write_bytes(b"\xff" * shard.shard_size)
    Path(f"{part}.ranges").write_bytes(
        b"00000000-dead-beef-0000-000000000000 %d\n" % part.stat().st_ino
        + np.array([0, shard.shard_size], "<u8").tobytes()
    )
    assert epoch(ds, 0, seed=4) == expected()
    assert path.read_bytes() == (http_root / "fill-0.tar").read_bytes()
