"""remote="cache" on every kind of .tar.zst (issue 15, item 2), against the loopback HTTP
and S3 servers: a multi-frame .tar.zst is cached as it is and read by frames; a .tar.zst
of one frame (GNU ``tar --zstd``), which no read can start inside, is indexed from a
download and kept decompressed in the cache, and ranged reads refuse it naming it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from loopback_servers import HttpServer
from tarcraft import GNU_TAR, write_tree
from torch.utils.data import DataLoader

import indextar
from indextar.errors import CompressedShardError, ShardFormatError, StaleIndexError
from indextar.source.cache import ShardCache
from indextar.source.conditional import RemoteStat
from indextar.tar.compress import zstd_frame_spans

N = 40
ONE, FRAMES = "one.tar.zst", "frames.tar.zst"


def payload(i: int) -> bytes:
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, 3000 + 41 * i, np.uint8).tobytes()


def gnu_tar(tree: Path, *flags: str) -> bytes:
    return subprocess.run(
        [GNU_TAR, "--sort=name", *flags, "-cf", "-", "-C", str(tree), "."],
        check=True,
        capture_output=True,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    ).stdout


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same samples as a one-frame ``tar --zstd`` shard and as a shard of 64 KiB
    frames (the second indexed next to itself; the first cannot be indexed locally)."""
    folder = tmp_path_factory.mktemp("served-zst")
    tree = folder / "tree"
    write_tree(tree, {f"k{i:03d}.bin": payload(i) for i in range(N)})
    write_tree(tree, {f"k{i:03d}.cls": b"%d" % (i % 7) for i in range(N)})
    (folder / ONE).write_bytes(gnu_tar(tree, "--zstd"))
    plain = gnu_tar(tree)
    compressor = zstandard.ZstdCompressor(write_content_size=True, write_checksum=True)
    step = 1 << 16
    chunks = (plain[at : at + step] for at in range(0, len(plain), step))
    (folder / FRAMES).write_bytes(b"".join(map(compressor.compress, chunks)))
    assert sum(data for _, _, data in zstd_frame_spans((folder / ONE).read_bytes())) == 1
    assert len(zstd_frame_spans((folder / FRAMES).read_bytes())) > 3
    indextar.build_index(folder / FRAMES)
    (folder / "one.tar").write_bytes(plain)  # what the cache must hold
    return folder


@pytest.fixture(scope="module")
def s3_files(root: Path) -> list[Path]:
    return [root / ONE, root / FRAMES]


@pytest.fixture(scope="module")
def http_root(root: Path) -> Path:
    return root


def check(sample: dict[str, Any]) -> int:
    i = int(sample["__key__"].rsplit("k", 1)[1])  # "./k007" from tar -C
    assert sample["bin"] == payload(i) and sample["cls"] == b"%d" % (i % 7)
    return i


def read_all(ds: indextar.IndexedTarDataset, seed: int) -> None:
    assert len(ds) == 2 * N
    order = np.random.default_rng(seed).permutation(2 * N).tolist()
    assert [check(ds[i]) for i in order[:30]] == [i % N for i in order[:30]]
    assert [check(s) for s in ds.__getitems__(order[30:])] == [i % N for i in order[30:]]


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_one_frame_and_multi_frame_zst_read_through_the_cache(
    kind: str, root: Path, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if kind == "http":
        http = request.getfixturevalue("http")
        urls, options = [http.url(ONE), http.url(FRAMES)], {}
    else:
        server = request.getfixturevalue("s3")  # conftest's, holding s3_files
        urls, options = [f"s3://shards/{ONE}", f"s3://shards/{FRAMES}"], server.storage_options()
    cache = tmp_path / "cache"
    ds = indextar.IndexedTarDataset(
        urls, remote="cache", index_dir=tmp_path / "ix", cache_dir=cache, storage_options=options
    )
    read_all(ds, seed=1)
    entries = {p.name.split("-", 1)[1]: p for p in cache.iterdir() if not p.name.endswith(".lock")}
    assert sorted(entries) == ["frames.tar.zst", "one.tar"]  # one frame: kept decompressed
    assert entries["one.tar"].read_bytes() == (root / "one.tar").read_bytes()
    assert entries["frames.tar.zst"].read_bytes() == (root / FRAMES).read_bytes()
    limit = ShardCache(cache, limit="1GB")
    assert limit.usage() == (root / "one.tar").stat().st_size + (root / FRAMES).stat().st_size
    # a second dataset over the same cache reads the copies already there
    inodes = {name: path.stat().st_ino for name, path in entries.items()}
    again = indextar.IndexedTarDataset(
        urls, remote="cache", index_dir=tmp_path / "ix", cache_dir=cache, storage_options=options
    )
    read_all(again, seed=2)
    assert {name: path.stat().st_ino for name, path in entries.items()} == inodes


def test_the_cached_copy_is_shared_by_fork_workers(http: HttpServer, tmp_path: Path) -> None:
    ds = indextar.IndexedTarDataset(
        http.url(ONE), remote="cache", index_dir=tmp_path / "ix", cache_dir=tmp_path / "cache"
    )
    http.reset()
    loader = DataLoader(
        ds, batch_size=8, num_workers=2, multiprocessing_context="fork", collate_fn=list
    )
    assert sorted(check(s) for batch in loader for s in batch) == list(range(N))
    assert http.stats()[ONE]["bytes"] == (http.root / ONE).stat().st_size  # downloaded once
    assert len(list((tmp_path / "cache").glob("*-one.tar"))) == 1


def test_a_multi_frame_zst_is_read_by_ranges_a_frame_at_a_time(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    ds = indextar.IndexedTarDataset(http.url(FRAMES), remote="ranges", index_dir=tmp_path)
    check(ds[N - 1])
    http.reset()
    for i in (2, N // 2, 5):
        check(ds[i])
    assert 0 < http.stats()[FRAMES]["bytes"] < (root / FRAMES).stat().st_size


def test_ranged_reads_of_a_one_frame_zst_are_refused_naming_it(
    http: HttpServer, tmp_path: Path
) -> None:
    url = http.url(ONE)
    ds = indextar.IndexedTarDataset(url, remote="ranges", index_dir=tmp_path)
    assert len(ds) == N  # indexed from a download, as remote="cache" needs
    for read in (lambda: ds[3], lambda: ds.__getitems__([1, 2])):
        with pytest.raises(CompressedShardError, match="remote='cache'") as caught:
            read()
        assert caught.value.shard == url and repr(url) in str(caught.value)


def test_a_truncated_one_frame_object_is_an_error_naming_it(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    cut = root / "cut" / ONE
    cut.parent.mkdir(exist_ok=True)
    cut.write_bytes((root / ONE).read_bytes()[:-2000])
    url = http.url(f"cut/{ONE}")
    with pytest.raises(ShardFormatError) as caught:
        indextar.IndexedTarDataset(url, remote="cache", index_dir=tmp_path / "ix")
    assert caught.value.shard == url and repr(url) in str(caught.value)
    assert ".tmp" not in str(caught.value)
    assert not list((tmp_path / "ix").iterdir())  # no index, no temporary copy left


def test_a_one_frame_object_replaced_after_indexing_is_stale(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    folder = root / "replaced"
    folder.mkdir(exist_ok=True)
    (folder / ONE).write_bytes((root / ONE).read_bytes())
    url = http.url(f"replaced/{ONE}")
    ds = indextar.IndexedTarDataset(
        url, remote="cache", index_dir=tmp_path / "ix", cache_dir=tmp_path / "cache"
    )
    shorter = (root / "one.tar").read_bytes()[:-1024]
    (folder / ONE).write_bytes(zstandard.ZstdCompressor().compress(shorter))
    with pytest.raises(StaleIndexError):
        ds[0]
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]


def test_the_cache_refuses_a_stream_of_another_size_than_the_index_says(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    url = http.url(ONE)
    expected = RemoteStat((root / ONE).stat().st_size, "")
    plain = (root / "one.tar").stat().st_size
    cache = ShardCache(tmp_path, limit="1GB")
    for claimed, got in ((plain - 512, f"more than {plain - 512}"), (plain + 512, str(plain))):
        with pytest.raises(ShardFormatError, match=f"decompresses to {got} bytes") as caught:
            cache.open(url, expected, codec="zstd", plain_size=claimed)
        assert caught.value.shard == url
        assert not [p for p in tmp_path.iterdir() if not p.name.endswith(".lock")]
    fd = cache.open(url, expected, codec="zstd", plain_size=plain)
    try:
        assert os.pread(fd, plain + 1, 0) == (root / "one.tar").read_bytes()
    finally:
        os.close(fd)


def test_streaming_a_corrupt_one_frame_object_names_it_and_the_compressed_offset(
    http: HttpServer, root: Path
) -> None:
    data = bytearray((root / ONE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (root / "corrupt").mkdir(exist_ok=True)
    (root / "corrupt" / ONE).write_bytes(bytes(data))
    url = http.url(f"corrupt/{ONE}")
    with pytest.raises(ShardFormatError, match="corrupt zstd data") as caught:
        list(indextar.StreamingTarDataset(url))
    assert caught.value.shard == url
    assert caught.value.offset is not None and 0 < caught.value.offset <= len(data)
