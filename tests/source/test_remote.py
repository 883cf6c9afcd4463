"""Remote shards against real servers on 127.0.0.1: aiohttp (HTTP) and SeaweedFS (S3)."""

from __future__ import annotations

import logging
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import sample_members, tar_bytes
from indexrows import load_samples
from loopback_servers import HttpServer, SeaweedServer

from indextar.errors import (
    CacheFullError,
    PipeRefusedError,
    RemoteReadError,
    StaleIndexError,
)
from indextar.index.opener import OpenedEntry
from indextar.index.remote import expected_stat, open_remote_index, remote_index_path, upload_index
from indextar.read.shard import OpenShard
from indextar.source.cache import CachedSource, ShardCache, parse_size
from indextar.source.conditional import RemoteStat
from indextar.source.remote import RangeSource, RetryPolicy

FAST = RetryPolicy(attempts=4, initial_delay=0.01, max_delay=0.05)
SHARDS = 4
PER_SHARD = 40


def _members(shard: int) -> dict[str, bytes]:
    members = sample_members(PER_SHARD, exts=("jpg", "cls", "json"), prefix=f"s{shard}_")
    # A few larger members, so that spans cross blocks and chunk edges.
    members[f"s{shard}_big.bin"] = os.urandom(300_000 + shard)
    return members


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("served")
    for shard, fmt in zip(range(SHARDS), ("ustar", "gnu", "pax", "ustar")):
        (folder / f"data-{shard}.tar").write_bytes(tar_bytes(_members(shard), fmt))
    return folder


@pytest.fixture(scope="module")
def http_root(root: Path) -> Path:
    return root


@pytest.fixture(scope="module")
def s3_files(root: Path) -> list[Path]:
    return [root / f"data-{shard}.tar" for shard in range(SHARDS)]


def _remote(
    kind: str, http: HttpServer, s3: SeaweedServer, name: str
) -> tuple[str, dict[str, Any]]:
    if kind == "http":
        return http.url(name), {}
    return f"s3://shards/{name}", s3.storage_options()


def _local_samples(path: Path) -> list[dict[str, Any]]:
    from indextar.read.streaming import StreamingTarDataset

    return [
        {k: v for k, v in s.items() if k != "__shard__"} for s in StreamingTarDataset(str(path))
    ]


@pytest.fixture(params=["http", "s3"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- byte-identical to local files ------------------------------------------------


def test_streaming_matches_local(kind: str, request: pytest.FixtureRequest, root: Path) -> None:
    from indextar.read.streaming import StreamingTarDataset

    server = request.getfixturevalue(kind)
    urls = [
        server.url(f"data-{n}.tar") if kind == "http" else f"s3://shards/data-{n}.tar"
        for n in range(SHARDS)
    ]
    options = {} if kind == "http" else server.storage_options()
    got = list(StreamingTarDataset(urls, storage_options=options))
    expected = [s for n in range(SHARDS) for s in _local_samples(root / f"data-{n}.tar")]
    assert [{k: v for k, v in s.items() if k != "__shard__"} for s in got] == expected
    assert len(got) == SHARDS * (PER_SHARD + 1)
    assert got[0]["__shard__"] == urls[0]


def test_ranges_match_local(
    kind: str, request: pytest.FixtureRequest, root: Path, tmp_path: Path
) -> None:
    url, options = _remote(
        kind, request.getfixturevalue("http"), request.getfixturevalue("s3"), "data-2.tar"
    )
    index = open_remote_index(url, index_dir=tmp_path, storage_options=options)
    assert index.path == remote_index_path(url, tmp_path) and index.meta.etag
    source = RangeSource(url, expected=expected_stat(index.meta), storage_options=options)
    shard = OpenShard.load(OpenedEntry(index, index.load_arrays(), source))
    local = _local_samples(root / "data-2.tar")
    assert len(shard) == len(local)
    for n in (0, 7, len(local) - 1, 3):
        key, members = shard.read(n)
        assert {"__key__": key, **dict(members)} == local[n]
    # A batch: one concurrent request per sample's span.
    spans = shard.samples[:, :2]
    datas = shard.source.read_many(spans[:, 0].tolist(), (spans[:, 1] - spans[:, 0]).tolist())
    raw = (root / "data-2.tar").read_bytes()
    assert datas == [raw[a:b] for a, b in spans.tolist()]


def test_index_next_to_the_shard_is_used(
    s3: SeaweedServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, options = "s3://shards/data-1.tar", s3.storage_options()
    built = open_remote_index(url, index_dir=tmp_path / "a", storage_options=options)
    assert upload_index(built, storage_options=options) == url + ".idx.sqlite"
    with caplog.at_level(logging.INFO, "indextar"):
        fetched = open_remote_index(
            url, index_dir=tmp_path / "b", storage_options=options, build_missing=False
        )
    assert "fetched the index" in caplog.text and "building" not in caplog.text
    assert fetched.meta == built.meta and load_samples(fetched).start_offset.tolist() == (
        load_samples(built).start_offset.tolist()
    )


# -- failures ----------------------------------------------------------------------


def test_503_twice_is_retried(
    http: HttpServer, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = (root / "data-0.tar").read_bytes()
    source = RangeSource(http.url("data-0.tar", mode="flaky/2"), retry=FAST)
    with caplog.at_level(logging.WARNING, "indextar.source.remote"):
        assert source.read(512, 10_000) == raw[512:10_512]
    # One warning per retry, each naming the 503 (counted per record: the URL's port
    # may contain "503" too).
    retries = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(retries) == 2 and all("503" in m.split(" failed (", 1)[1] for m in retries)


def test_cut_mid_body_is_retried(http: HttpServer, root: Path) -> None:
    raw = (root / "data-1.tar").read_bytes()
    source = RangeSource(http.url("data-1.tar", mode="cut"), retry=FAST)
    assert source.read(1024, 200_000) == raw[1024:201_024]


def test_batch_with_failures_is_retried(http: HttpServer, root: Path) -> None:
    raw = (root / "data-3.tar").read_bytes()
    source = RangeSource(http.url("data-3.tar", mode="flaky/3"), retry=FAST)
    offsets, lengths = [0, 5000, 100_000, 250_000], [100, 2000, 50_000, 1]
    assert source.read_many(offsets, lengths) == [raw[o : o + n] for o, n in zip(offsets, lengths)]


def test_persistent_failure_names_url_and_range(http: HttpServer) -> None:
    url = http.url("data-0.tar", mode="fail")
    with pytest.raises(RemoteReadError) as info:
        RangeSource(url, retry=FAST).read(2048, 512)
    message = str(info.value)
    assert url in message and "bytes 2048-2559" in message and "after 4 attempts" in message
    assert "500" in message and info.value.offset == 2048 and info.value.length == 512


def test_replaced_object_is_detected(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    http, s3 = request.getfixturevalue("http"), request.getfixturevalue("s3")
    name = f"replaced-{kind}.tar"
    original = tar_bytes(sample_members(20, prefix="a"))
    replaced = tar_bytes(sample_members(20, prefix="b"))  # same size, other bytes
    assert len(original) == len(replaced)
    url, options = _remote(kind, http, s3, name)

    def put(data: bytes) -> None:
        if kind == "http":
            (http.root / name).write_bytes(data)
            os.utime(http.root / name, ns=(1, len(data) + (data == replaced)))  # a new ETag
        else:
            import s3fs

            s3fs.S3FileSystem(skip_instance_cache=True, **options).pipe(f"shards/{name}", data)

    put(original)
    index = open_remote_index(url, index_dir=tmp_path, storage_options=options)
    put(replaced)
    source = RangeSource(url, expected=expected_stat(index.meta), storage_options=options)
    with pytest.raises(StaleIndexError, match="ETag changed"):
        source.read(0, 512)
    with pytest.raises(StaleIndexError, match=url.replace("/", ".")):
        open_remote_index(url, index_dir=tmp_path, storage_options=options, build_missing=False)
    rebuilt = open_remote_index(url, index_dir=tmp_path, storage_options=options)
    assert rebuilt.keys()[0] == "b000000"


# -- the shard cache --------------------------------------------------------------


def _fill(directory: str, url: str, size: int, etag: str, barrier: Any) -> None:
    cache = ShardCache(directory, limit="10MB")
    barrier.wait()
    fd = cache.open(url, RemoteStat(size, etag))
    os.close(fd)


def test_two_processes_download_once(http: HttpServer, root: Path, tmp_path: Path) -> None:
    url = http.url("data-2.tar")
    stat = RangeSource(url).stat()
    http.reset()
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    workers = [
        context.Process(target=_fill, args=(str(tmp_path), url, stat.size, stat.etag, barrier))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    served = http.stats()["data-2.tar"]
    assert served["bytes"] == stat.size, served
    cached = ShardCache(tmp_path, limit="10MB").path_for(url, stat)
    assert cached.read_bytes() == (root / "data-2.tar").read_bytes()


def test_cache_never_exceeds_its_limit(http: HttpServer, root: Path, tmp_path: Path) -> None:
    stats = [RangeSource(http.url(f"data-{n}.tar")).stat() for n in range(SHARDS)]
    limit = int(max(s.size for s in stats) * 2.5)
    cache = ShardCache(tmp_path, limit=limit)
    held = CachedSource(http.url("data-0.tar"), cache=cache, expected=stats[0])
    assert held.read(0, 512) == (root / "data-0.tar").read_bytes()[:512]  # stays open
    for _ in range(3):
        for n in (1, 2, 3, 2, 1):
            source = CachedSource(http.url(f"data-{n}.tar"), cache=cache, expected=stats[n])
            assert source.read(512, 1000) == (root / f"data-{n}.tar").read_bytes()[512:1512]
            source.close()
            assert cache.usage() <= limit
            assert cache.path_for(held.url, stats[0]).exists(), "evicted a shard in use"
    # Every shard held open: no room, and the error says why.
    others = [
        CachedSource(http.url(f"data-{n}.tar"), cache=cache, expected=stats[n]) for n in (1, 2)
    ]
    others[0].read(0, 1)
    with pytest.raises(CacheFullError, match="open or downloading"):
        others[1].read(0, 1)
    assert cache.usage() <= limit
    held.close()
    others[1].read(0, 1)  # now data-0 can go
    assert not cache.path_for(held.url, stats[0]).exists()


def test_parse_size() -> None:
    assert (
        parse_size("50GB") == 50 * 10**9
        and parse_size("512MiB") == 512 << 20
        and parse_size(7) == 7
    )
    with pytest.raises(ValueError, match="50GB"):
        parse_size("lots")


# -- pipe: ------------------------------------------------------------------------


def test_pipe_refused_unless_allowed(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from indextar.read.streaming import StreamingTarDataset

    url = f"pipe:cat {root / 'data-0.tar'}"
    monkeypatch.delenv("INDEXTAR_ALLOW_PIPE", raising=False)
    with pytest.raises(
        PipeRefusedError,
        match="allow_pipe=True or set the environment variable INDEXTAR_ALLOW_PIPE=1",
    ):
        StreamingTarDataset(url)
    assert len(list(StreamingTarDataset(url, allow_pipe=True))) == PER_SHARD + 1
    monkeypatch.setenv("INDEXTAR_ALLOW_PIPE", "1")
    assert len(list(StreamingTarDataset(url))) == PER_SHARD + 1


# -- IndexedTarDataset over URLs ----------------------------------------------------


@pytest.mark.parametrize("strategy", ["ranges", "cache"])
def test_indexed_dataset_over_urls(
    kind: str, strategy: str, request: pytest.FixtureRequest, root: Path, tmp_path: Path
) -> None:
    from indextar.read.dataset import IndexedTarDataset

    http, s3 = request.getfixturevalue("http"), request.getfixturevalue("s3")
    urls = [_remote(kind, http, s3, f"data-{n}.tar")[0] for n in range(SHARDS)]
    options = _remote(kind, http, s3, "x")[1]
    remote = IndexedTarDataset(
        urls,
        remote=strategy,
        index_dir=tmp_path / "ix",
        cache_dir=tmp_path / "cache",
        storage_options=options,
    )
    local = IndexedTarDataset(
        [str(root / f"data-{n}.tar") for n in range(SHARDS)], index_dir=tmp_path / "local"
    )
    assert len(remote) == len(local) == SHARDS * (PER_SHARD + 1)

    def strip(sample: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in sample.items() if k != "__shard__"}

    order = list(range(len(local)))[::-7]
    assert [strip(s) for s in remote.__getitems__(order)] == [
        strip(s) for s in local.__getitems__(order)
    ]
    assert strip(remote[5]) == strip(local[5]) and remote[5]["__shard__"] == urls[0]
    # Reopened from the index folder (no build), in another process's copy.
    import pickle

    again = pickle.loads(pickle.dumps(remote))
    assert strip(again[len(local) - 1]) == strip(local[len(local) - 1])
    if strategy == "cache":
        assert len(list((tmp_path / "cache").glob("*-data-*.tar"))) == SHARDS


@pytest.mark.timeout(60)
def test_parent_keeps_working_after_forked_workers(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    """Forked DataLoader workers must not close the parent's connections (they share its epoll)."""
    import torch.utils.data

    from indextar.read.dataset import IndexedTarDataset

    urls = [http.url(f"data-{n}.tar") for n in range(SHARDS)]
    ds = IndexedTarDataset(urls, index_dir=tmp_path)
    ds.__getitems__([0, 50, 100])  # the parent has open connections now
    loader = torch.utils.data.DataLoader(
        ds, batch_size=16, num_workers=2, collate_fn=len, multiprocessing_context="fork"
    )
    for _ in range(2):
        assert sum(loader) == len(ds)
    assert RangeSource(urls[0]).stat().size == (root / "data-0.tar").stat().st_size
    assert len(IndexedTarDataset(urls, index_dir=tmp_path)) == len(ds)
