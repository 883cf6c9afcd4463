"""Compressed shards under real DataLoader workers (issue 15): a gzip shard read through
seek points, opened in the parent and then in forked and spawned workers, and
per-sample zstd shards; every sample once, each as written. A shard's first read
opens its index once."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import tar_bytes
from tarcraft import GNU_TAR, write_tree
from torch.utils.data import DataLoader

import indextar

N = 240


def payload(i: int) -> bytes:
    return (f"{i:05d}".encode() * 400)[: 1500 + i * 7 % 900]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("compressed-loader")
    half = N // 2
    write_tree(folder / "tree", {f"s{i:05d}.txt": payload(i) for i in range(half)})
    gz = folder / "a.tar.gz"
    subprocess.run(
        [GNU_TAR, "--sort=name", "-czf", str(gz), "-C", str(folder / "tree"), "."], check=True
    )
    indextar.build_index(gz, seek_spacing=65536)
    with indextar.ShardWriter(str(folder / "b-%02d.tar.zst"), compress="zstd") as sink:
        for i in range(half, N):
            sink.write({"__key__": f"s{i:05d}", "txt": payload(i)})
    return [str(gz), *sink.shards]


def check(batch: list[dict[str, object]]) -> list[int]:
    """Each sample's number, after checking its bytes."""
    found = []
    for sample in batch:
        i = int(str(sample["__key__"]).rsplit("s", 1)[-1])
        assert sample["txt"] == payload(i), sample["__key__"]
        found.append(i)
    return found


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_read_every_sample_once(shards: list[str], method: str) -> None:
    ds = indextar.IndexedTarDataset(shards)
    assert len(ds) == N
    check([ds[0], ds[N - 1]])  # opened in the parent before the workers start
    loader = DataLoader(
        ds,
        batch_size=16,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
        num_workers=2,
        multiprocessing_context=method,
        collate_fn=check,
    )
    seen = [i for batch in loader for i in batch]
    assert sorted(seen) == list(range(N))


def test_shards_of_every_kind_in_one_dataset(shards: list[str], tmp_path: Path) -> None:
    ds = indextar.IndexedTarDataset(shards)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(1)).tolist()
    assert check(ds.__getitems__(order)) == order


def test_streaming_reads_zstd_of_one_frame_and_of_many(shards: list[str], tmp_path: Path) -> None:
    write_tree(tmp_path / "tree", {f"s{i:05d}.txt": payload(i) for i in range(30)})
    one_frame = tmp_path / "one.tar.zst"
    subprocess.run(
        [GNU_TAR, "--sort=name", "--zstd", "-cf", str(one_frame), "-C", str(tmp_path / "tree"),
         "."],
        check=True,
    )  # fmt: skip
    with pytest.raises(indextar.CompressedShardError, match="one zstd frame"):
        indextar.build_index(one_frame)  # random access refuses it; streaming reads it
    streamed = list(indextar.StreamingTarDataset([str(one_frame), *shards]))
    assert check(streamed[:30]) == list(range(30))
    assert sorted(check(streamed[30:])) == list(range(N))


def test_a_shards_first_read_opens_its_index_once(
    shards: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its meta, its arrays and a compressed shard's frames or seek points are read
    through one SQLite connection (a compressed shard's took three, a plain one's two)."""
    plain = tmp_path / "plain.tar"
    plain.write_bytes(tar_bytes({"p0.txt": b"plain"}))
    with indextar.ShardWriter(str(tmp_path / "c-%02d.tar.gz"), compress="gzip") as sink:
        sink.write({"__key__": "g0", "txt": b"gzip frames"})
    ds = indextar.IndexedTarDataset([*shards, str(plain), *sink.shards])
    opened: list[str] = []
    connect = sqlite3.connect

    def counted(database: str, *args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(database)
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counted)
    for shard_no, start in enumerate(ds.shard_starts[:-1].tolist()):
        ds[start]
        assert len(opened) == shard_no + 1, (ds.shards[shard_no], opened)
    for start in ds.shard_starts[:-1].tolist():  # open: no connection
        ds[start]
    assert len(opened) == len(ds.shards) == 4
