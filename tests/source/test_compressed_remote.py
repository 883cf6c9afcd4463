"""Compressed shards read remotely (issue 15), against the loopback HTTP and S3 servers:
a per-sample .tar.zst / .tar.gz is one ranged request per sample (exactly its frame),
a foreign .tar.gz is read from its seek points, and remote="cache" reads all of them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loopback_servers import HttpServer
from tarcraft import GNU_TAR, write_tree

import indextar
from indextar.index.arrays import read_layout

N = 60


def payload(i: int) -> bytes:
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, 4000 + 37 * i, np.uint8).tobytes()


NAMES = ("ps.tar.zst", "ps.tar.gz", "gnu.tar.gz")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three shards of the same samples, each indexed next to itself (the sidecar)."""
    folder = tmp_path_factory.mktemp("served-compressed")
    for codec, name in (("zstd", NAMES[0]), ("gzip", NAMES[1])):
        with indextar.TarWriter(folder / name, compress=codec) as sink:
            for i in range(N):
                sink.write({"__key__": f"k{i:03d}", "bin": payload(i), "cls": i % 7})
    tree = folder / "tree"
    write_tree(tree, {f"k{i:03d}.bin": payload(i) for i in range(N)})
    write_tree(tree, {f"k{i:03d}.cls": b"%d" % (i % 7) for i in range(N)})
    subprocess.run(
        [GNU_TAR, "--sort=name", "-czf", str(folder / NAMES[2]), "-C", str(tree), "."], check=True
    )
    index = indextar.build_index(folder / NAMES[2], seek_spacing=65536)
    assert index.meta.seek_spacing  # read through seek points, not frames
    return folder


@pytest.fixture(scope="module")
def http_root(root: Path) -> Path:
    return root


@pytest.fixture(scope="module")
def s3_files(root: Path) -> list[Path]:
    return [root / n for n in NAMES] + [root / (n + ".idx.sqlite") for n in NAMES]


def remote(kind: str, request: pytest.FixtureRequest, name: str) -> tuple[str, dict[str, Any]]:
    if kind == "http":
        return request.getfixturevalue("http").url(name), {}
    s3 = request.getfixturevalue("s3")
    return f"s3://shards/{name}", s3.storage_options()


def check(sample: dict[str, Any]) -> int:
    i = int(sample["__key__"].rsplit("k", 1)[1])  # "k007", or "./k007" from tar -C
    assert sample["bin"] == payload(i) and sample["cls"] == b"%d" % (i % 7)
    return i


@pytest.mark.parametrize("kind", ["http", "s3"])
@pytest.mark.parametrize("strategy", ["ranges", "cache"])
def test_every_kind_of_compressed_shard_reads_remotely(
    kind: str, strategy: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    urls, options = [], {}
    for name in NAMES:
        url, options = remote(kind, request, name)
        urls.append(url)
    ds = indextar.IndexedTarDataset(
        urls,
        remote=strategy,
        index_dir=tmp_path / "ix",
        cache_dir=tmp_path / "cache",
        storage_options=options,
    )
    assert len(ds) == 3 * N
    order = np.random.default_rng(0).permutation(3 * N).tolist()
    assert [check(ds[i]) for i in order[:40]] == [i % N for i in order[:40]]
    batch = ds.__getitems__(order[40:])
    assert [check(s) for s in batch] == [i % N for i in order[40:]]


def test_one_ranged_request_per_sample_of_exactly_its_frame(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    index = indextar.open_index(root / NAMES[0])
    frames = read_layout(index.path, index.meta).frames
    assert frames is not None
    ds = indextar.IndexedTarDataset(http.url(NAMES[0]), remote="ranges", index_dir=tmp_path)
    check(ds[0])  # opens the index and the shard
    http.reset()
    for i in (41, 7, 59):
        check(ds[i])
    stats = http.stats()
    path = NAMES[0]
    assert stats[path]["requests"] == 3
    assert stats[path]["bytes"] == sum(int(frames[i, 1]) for i in (41, 7, 59))
    http.reset()
    batch = ds.__getitems__([3, 30, 50, 12])
    assert [check(s) for s in batch] == [3, 30, 50, 12]
    assert http.stats()[path]["requests"] == 4


def test_a_foreign_targz_is_fetched_from_its_seek_point(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    size = (root / NAMES[2]).stat().st_size
    ds = indextar.IndexedTarDataset(http.url(NAMES[2]), remote="ranges", index_dir=tmp_path)
    check(ds[N - 1])
    http.reset()
    for i in (3, N - 2, N // 2):
        check(ds[i])
    fetched = http.stats()[NAMES[2]]["bytes"]
    # each read starts at the seek point before it: far less than the file each time
    assert 0 < fetched < 3 * size * 0.6


def test_a_remote_shard_without_an_index_is_indexed_from_a_download(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    bare = root / "bare"
    bare.mkdir(exist_ok=True)
    for name in NAMES:  # the shards alone, no sidecar indexes
        (bare / name).write_bytes((root / name).read_bytes())
    urls = [http.url(f"bare/{name}") for name in NAMES]
    ds = indextar.IndexedTarDataset(urls, index_dir=tmp_path / "ix")
    assert len(ds) == 3 * N
    order = np.random.default_rng(5).permutation(3 * N).tolist()
    assert [check(s) for s in ds.__getitems__(order)] == [i % N for i in order]
    kinds = [indextar.IndexedTarDataset(u, index_dir=tmp_path / "ix") for u in urls]
    built = sorted((tmp_path / "ix").glob("*.idx.sqlite"))
    assert len(built) == 3 and not list((tmp_path / "ix").glob(".*"))  # no copy left
    assert len(kinds) == 3
    metas = {ix.meta.shard_name: ix.meta for ix in (k.shard_index(0) for k in kinds)}
    assert metas[urls[2]].seek_spacing and not metas[urls[0]].seek_spacing
    assert metas[urls[0]].compression == "zstd" and metas[urls[1]].compression == "gzip"
