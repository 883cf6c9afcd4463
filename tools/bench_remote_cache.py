"""The shard-cache rows of tools/bench_remote.py: ``remote="cache"`` filled by whole-shard
downloads (``cache_fill="shards"``) against filled by the ranged reads and the
read-ahead (``cache_fill="ranges"``), each for a first epoch into an empty cache and a
second epoch from the filled one (which should fetch nothing). Same loader for both:
``ReadAheadBatches(ResumableSampler, 64)``, 2 DataLoader workers."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

Reader = Callable[[Any, Callable[[], None]], int]


def indextar_cache(fill: str, epoch: int, workers: int = 2) -> Reader:
    def read(store: Any, mark: Callable[[], None]) -> int:
        import torch.utils.data

        from indextar import IndexedTarDataset, ReadAheadBatches, ResumableSampler

        cache_dir = store.work / f"cache-{fill}"
        if epoch == 1:
            shutil.rmtree(cache_dir, ignore_errors=True)
        ds = IndexedTarDataset(
            store.urls, remote="cache", cache_fill=fill, cache_dir=cache_dir,
            index_dir=store.index_dir, storage_options=store.storage_options,
        )  # fmt: skip
        sampler = ResumableSampler(ds, seed=epoch)
        loader = torch.utils.data.DataLoader(
            ds, batch_sampler=ReadAheadBatches(sampler, 64), num_workers=workers, collate_fn=len
        )
        done = 0
        for batch in loader:
            mark()
            done += batch
        return done

    return read


def cache_rows() -> list[tuple[str, Reader]]:
    return [
        (f"indextar cache, {fill} fill, epoch {epoch} (2 workers)", indextar_cache(fill, epoch))
        for fill in ("shards", "ranges")
        for epoch in (1, 2)
    ]
