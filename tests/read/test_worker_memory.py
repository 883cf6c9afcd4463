"""Memory of persistent DataLoader workers over many epochs: local, ``.tar.gz``,
``.tar.zst`` and remote (HTTP on 127.0.0.1) shards in one dataset, 2 workers, 10 epochs.

A worker's resident memory after epoch 10 must be within 5% of what it was after
epoch 2 (the first epoch maps and opens everything; the second settles the
allocator). Small shards keep it quick, but then 5% of a worker (about 185 MiB,
mostly torch and numpy) is 9 MiB, more than a sample's bytes leaked at every read
would grow it in 8 epochs (12 MiB; 3 MiB if only the remote shard's reads leaked).
So the growth is bounded too: under 1.5 MiB from epoch 2 to 10. It measured 0.1 MiB,
and 3.2 MiB with a leak of each remote sample's bytes put in to check the test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import tar_bytes
from procstats import rss_bytes
from torch.utils.data import DataLoader

from indextar import IndexedTarDataset
from indextar.write.recompress import recompress

SAMPLES = 48  # per shard: 4 shards, 192 samples an epoch
PAYLOAD = 16384
EPOCHS = 10


def _members(shard: int) -> dict[str, bytes]:
    return {
        f"s{shard}k{i:03d}.bin": bytes([(shard * 31 + i) % 256]) * (PAYLOAD + i)
        for i in range(SAMPLES)
    }


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("served")
    (folder / "remote.tar").write_bytes(tar_bytes(_members(3)))
    return folder


def _with_worker(sample: dict[str, object]) -> dict[str, object]:
    """Each sample says which worker process read it."""
    return {"pid": os.getpid(), "bin": sample["bin"]}


def _collate(samples: list[dict[str, object]]) -> list[dict[str, object]]:
    return samples


def test_persistent_workers_do_not_grow_over_ten_epochs(
    http: object, http_root: Path, tmp_path: Path
) -> None:
    for shard, name in enumerate(("plain.tar", "gz.tar", "zst.tar")):
        (tmp_path / name).write_bytes(tar_bytes(_members(shard)))
    recompress(tmp_path / "gz.tar", tmp_path / "data.tar.gz", compress="gzip")
    recompress(tmp_path / "zst.tar", tmp_path / "data.tar.zst", compress="zstd")
    shards = [
        str(tmp_path / "plain.tar"),
        str(tmp_path / "data.tar.gz"),
        str(tmp_path / "data.tar.zst"),
        http.url("remote.tar"),  # type: ignore[attr-defined]
    ]
    ds = IndexedTarDataset(shards, index_dir=tmp_path / "idx", transform=_with_worker)
    assert len(ds) == 4 * SAMPLES
    loader = DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        collate_fn=_collate,
        generator=torch.Generator().manual_seed(0),
    )
    rss: list[dict[int, int]] = []
    for _ in range(EPOCHS):
        pids = set()
        count = 0
        for batch in loader:
            pids.update(sample["pid"] for sample in batch)
            count += len(batch)
        assert count == len(ds) and len(pids) == 2
        rss.append({pid: rss_bytes(pid) for pid in pids})  # the workers wait for the next epoch
    assert rss[1].keys() == rss[-1].keys(), "the workers were not persistent"
    mib = {pid: [round(epoch[pid] / 2**20, 1) for epoch in rss] for pid in rss[1]}
    print(f"worker RSS (MiB) after each epoch: {mib}")
    for pid, after in mib.items():
        growth = after[-1] - after[1]
        assert after[-1] <= after[1] * 1.05, f"worker {pid} grew {growth:.1f} MiB: {after}"
        assert growth < 1.5, f"worker {pid} grew {growth:.1f} MiB from epoch 2: {after}"
