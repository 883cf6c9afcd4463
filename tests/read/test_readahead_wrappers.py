"""Read-ahead through the datasets built on ``IndexedTarDataset`` (issue 25): a
mixture's and a packed dataset's order is as pure a function of seed, epoch and
position as a plain dataset's, so their hints reach the parts' read-ahead.

Real aiohttp server on 127.0.0.1; each run is compared with the same run without
read-ahead: the same samples in the same order, each span fetched once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tar_bytes
from torch.utils.data import DataLoader

from indextar import (
    BucketBatchSampler,
    IndexedTarDataset,
    MixtureDataset,
    PackedDataset,
    ReadAheadBatches,
    ResumableSampler,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from loopback_servers import HttpServer  # noqa: E402

SAMPLES, BATCH = 30, 5


def members(shard: int) -> dict[str, bytes]:
    return {
        f"w{shard}_{i:04d}.bin": bytes([shard * 40 + i]) * (900 + 300 * (i % 4))
        for i in range(SAMPLES)
    }


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    folder = tmp_path_factory.mktemp("served")
    for shard in range(3):
        (folder / f"wr-{shard}.tar").write_bytes(tar_bytes(members(shard)))
    with HttpServer(folder) as server:
        yield server


def part(http: HttpServer, shards: list[int], folder: Path) -> IndexedTarDataset:
    urls = [http.url(f"wr-{shard}.tar") for shard in shards]
    return IndexedTarDataset(urls, index_dir=folder / "ix", keys=("__key__", "bin"))


def requests(http: HttpServer) -> int:
    return sum(entry["requests"] for entry in http.stats().values())


def read(data: Any, batches: Any) -> list[Any]:
    loader = DataLoader(data, batch_sampler=batches, collate_fn=list)
    return [sample for batch in loader for sample in batch]


def test_a_mixtures_parts_read_their_share_ahead(http: HttpServer, tmp_path: Path) -> None:
    parts = {"a": part(http, [0, 1], tmp_path), "b": part(http, [2], tmp_path)}
    mixture = MixtureDataset(parts)
    sampler = ResumableSampler(mixture, seed=5, weights={"a": 1.0, "b": 2.0})
    plain = read(mixture, [list(b) for b in ReadAheadBatches(sampler, BATCH)])
    http.reset()
    fresh = MixtureDataset(
        {name: part(http, s, tmp_path) for name, s in (("a", [0, 1]), ("b", [2]))}
    )
    got = read(
        fresh,
        ReadAheadBatches(
            ResumableSampler(fresh, seed=5, weights={"a": 1.0, "b": 2.0}), BATCH, depth=4
        ),
    )
    assert got == plain and len(got) == len(sampler)
    assert requests(http) <= len(got)  # none twice (weights may draw a sample twice)
    for dataset in fresh.datasets:
        stats = dataset.prefetch_stats()
        assert stats is not None and stats.taken > 0 and stats.peak_bytes <= stats.budget


def test_a_packed_dataset_reads_its_packs_documents_ahead(http: HttpServer, tmp_path: Path) -> None:
    data = part(http, [0, 1], tmp_path)
    lengths = np.array([len(data[i][1]) for i in range(len(data))])

    def packs(data: IndexedTarDataset) -> PackedDataset:
        return PackedDataset(
            data, max_length=3000, lengths=lengths, seed=1,
            tokens=lambda sample: np.frombuffer(sample[1], np.uint8),
        )  # fmt: skip

    plain = read(
        packs(data), [list(b) for b in ReadAheadBatches(ResumableSampler(packs(data), seed=2), 3)]
    )
    http.reset()
    fresh = part(http, [0, 1], tmp_path)
    packed = packs(fresh)
    got = read(packed, ReadAheadBatches(ResumableSampler(packed, seed=2), 3, depth=3))
    assert [p.indices.tolist() for p in got] == [p.indices.tolist() for p in plain]
    assert all(
        all(np.array_equal(x, y) for x, y in zip(g.tokens, p.tokens)) for g, p in zip(got, plain)
    )
    assert requests(http) == len(fresh)  # every document once
    stats = fresh.prefetch_stats()
    assert stats is not None and stats.taken >= len(fresh) // 2


def test_a_bucket_samplers_batches_are_read_ahead(http: HttpServer, tmp_path: Path) -> None:
    data = part(http, [0, 1, 2], tmp_path)
    buckets = np.arange(len(data)) % 3
    sampler = BucketBatchSampler(buckets, batch_size=BATCH, seed=4)
    plain = read(data, [list(b) for b in ReadAheadBatches(sampler, None)])
    http.reset()
    fresh = part(http, [0, 1, 2], tmp_path)
    got = read(fresh, ReadAheadBatches(BucketBatchSampler(buckets, batch_size=BATCH, seed=4), None))
    assert got == plain and len(got) == len(data)
    assert requests(http) == len(data)
    stats = fresh.prefetch_stats()
    assert stats is not None and stats.taken >= len(data) - 2 * BATCH
