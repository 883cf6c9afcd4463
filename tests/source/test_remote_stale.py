"""A remote shard replaced under an open dataset is never misread (issue 12, remote).

Real servers on 127.0.0.1: aiohttp (HTTP, which honours ``If-Match``, and a route that
ignores it) and SeaweedFS (S3). Every read after the object is replaced either raises
:class:`StaleIndexError` or returns exactly the bytes the index promised.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import sample_members, tar_bytes
from torch.utils.data import DataLoader

from indextar import IndexedTarDataset, StaleIndexError
from indextar.index.remote import expected_stat, open_remote_index
from indextar.source.remote import RangeSource

SAMPLES = 60


def original(shard: int) -> bytes:
    return tar_bytes(sample_members(SAMPLES, prefix=f"s{shard}_"))


def replacement() -> bytes:
    """Other samples, zero-padded to the original's size: only the version tells."""
    other = tar_bytes(sample_members(SAMPLES - 10, exts=("png", "txt"), prefix="zz"))
    size = len(original(0))
    assert len(other) <= size
    return other.ljust(size, b"\0")


class Served:
    """Two shards on one server, and a way to replace an object in place."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, name: str):
        self.kind = kind
        self.names = [f"{name}-{shard}.tar" for shard in range(2)]
        if kind == "s3":
            self.server: Any = request.getfixturevalue("s3")
            self.options = self.server.storage_options()
            self.urls = [f"s3://shards/{n}" for n in self.names]
        else:
            self.server = request.getfixturevalue("http")
            self.options = {}
            mode = "ignore-if-match" if kind == "http-ignoring-if-match" else "files"
            self.urls = [self.server.url(n, mode=mode) for n in self.names]
        for shard, name in enumerate(self.names):
            self.put(name, original(shard), version=1)

    def put(self, name: str, data: bytes, *, version: int) -> None:
        if self.kind == "s3":
            import s3fs

            fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.options)
            fs.mkdirs("shards", exist_ok=True)
            fs.pipe(f"shards/{name}", data)
        else:
            path = self.server.root / name
            path.write_bytes(data)
            os.utime(path, ns=(version, version * 10**9))  # aiohttp's ETag: mtime and size

    def replace_first(self) -> None:
        self.put(self.names[0], replacement(), version=2)


@pytest.fixture(params=["http", "http-ignoring-if-match", "s3"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def dataset(served: Served, folder: Path, **kwargs: Any) -> IndexedTarDataset:
    return IndexedTarDataset(
        served.urls,
        remote="ranges",
        index_dir=folder / "ix",
        storage_options=served.options,
        keys=("__key__", "jpg", "cls"),
        **kwargs,
    )


def test_an_object_replaced_mid_epoch_is_refused_on_every_read(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    served = Served(kind, request, f"mid-{kind}")
    ds = dataset(served, tmp_path)
    promised = [ds[i] for i in range(len(ds))]
    assert promised[0][0] == "s0_000000" and promised[SAMPLES][0] == "s1_000000"
    served.replace_first()
    refused = 0
    for i in range(SAMPLES):
        try:
            assert ds[i] == promised[i]
        except StaleIndexError as e:
            assert served.urls[0] in str(e)
            refused += 1
    for at in range(0, 2 * SAMPLES, 8):  # batches, mixing both shards
        batch = list(range(at, min(at + 8, 2 * SAMPLES)))
        try:
            assert ds.__getitems__(batch) == [promised[i] for i in batch]
        except StaleIndexError:
            refused += sum(1 for i in batch if i < SAMPLES)
    assert refused == 2 * SAMPLES
    assert ds[SAMPLES + 3] == promised[SAMPLES + 3]  # the other object is untouched
    with pytest.raises(StaleIndexError, match="412|answered a ranged read with ETag"):
        ds[0]


def test_a_server_ignoring_if_match_is_caught_by_the_answered_etag(
    request: pytest.FixtureRequest,
) -> None:
    served = Served("http-ignoring-if-match", request, "etag")
    stat = RangeSource(served.urls[0]).stat()
    source = RangeSource(served.urls[0], expected=stat)
    assert source.read(0, 512)[:9] == b"s0_000000"
    served.replace_first()
    with pytest.raises(StaleIndexError, match="answered a ranged read with ETag"):
        source.read(0, 512)
    with pytest.raises(StaleIndexError, match="answered a ranged read with ETag"):
        source.read_many([0, 1024], [512, 512])


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_forked_workers_never_misread_a_replaced_object(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    served = Served(kind, request, f"workers-{kind}")
    ds = dataset(served, tmp_path)
    promised = [ds[i] for i in range(len(ds))]
    loader = DataLoader(
        ds, batch_size=6, num_workers=2, multiprocessing_context="fork", collate_fn=list,
        prefetch_factor=1,
    )  # fmt: skip
    seen = 0
    with pytest.raises(StaleIndexError):
        for batch in loader:
            for sample in batch:
                assert sample == promised[seen]
                seen += 1
            if seen == 12:
                served.replace_first()
    assert 12 <= seen < SAMPLES


def test_the_cache_serves_the_downloaded_version_or_refuses(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    served = Served("http", request, "cached")
    ds = IndexedTarDataset(
        served.urls, remote="cache", index_dir=tmp_path / "ix", cache_dir=tmp_path / "cache",
        keys=("__key__", "jpg"),
    )  # fmt: skip
    promised = [ds[i] for i in range(len(ds))]  # both shards now cached
    served.replace_first()
    assert [ds[i] for i in range(len(ds))] == promised  # the cached copy is the indexed version
    with pytest.raises(StaleIndexError, match="ETag changed"):  # a dataset opened now
        IndexedTarDataset(
            served.urls, remote="cache", index_dir=tmp_path / "ix", cache_dir=tmp_path / "c2",
            build_missing=False,
        )  # fmt: skip
    # A download of a version replaced after the index was read is refused, not cached.
    index = open_remote_index(served.urls[1], index_dir=tmp_path / "ix")
    source = RangeSource(served.urls[1], expected=expected_stat(index.meta))
    source.read(0, 512)
    served.put(served.names[1], replacement(), version=3)
    with pytest.raises(StaleIndexError):
        source.read_many([0, 4096], [4096, 4096])
