"""StreamingTarDataset over HTTP: one streaming GET per shard, resumed where it broke,
the next shard's GET sent early, and each sample once under DataLoader workers."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest
import torch.utils.data
from conftest import tar_bytes
from loopback_servers import FaultPlan, HttpServer

from indextar.errors import StaleIndexError
from indextar.read.opening import open_stream
from indextar.read.streaming import StreamingTarDataset
from indextar.source.objectstream import ObjectStream
from indextar.source.retry import RetryPolicy

SHARDS, PER_SHARD, SIZE = 4, 12, 50_000


def members(shard: int, count: int = PER_SHARD) -> dict[str, bytes]:
    """Samples of ``SIZE`` bytes whose contents name their shard, sample and offset."""
    return {
        f"d{shard}_{i:04d}.{ext}": bytes((shard * 31 + i * 7 + j) % 251 for j in range(SIZE))
        if ext == "bin" else f"{shard}/{i}".encode()
        for i in range(count)
        for ext in ("bin", "txt")
    }  # fmt: skip


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served")
    for n in range(SHARDS):
        (root / f"data-{n}.tar").write_bytes(tar_bytes(members(n)))
    return root


def local(root: Path, **options: Any) -> list[dict[str, Any]]:
    urls = [str(root / f"data-{n}.tar") for n in range(SHARDS)]
    return [strip(s) for s in StreamingTarDataset(urls, **options)]


def strip(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if k != "__shard__"}


def urls(http: HttpServer, mode: str = "files") -> list[str]:
    return [http.url(f"data-{n}.tar", mode=mode) for n in range(SHARDS)]


def test_resets_and_short_bodies_mid_stream_give_the_exact_samples(
    http: HttpServer, http_root: Path
) -> None:
    plan = FaultPlan(
        busy=0.1, retry_after="", reset=0.2, short=0.4, wrong_range=0.1, whole=0.1,
        per_range=2, seed=3,
    )  # fmt: skip
    http.set_faults(plan)
    try:
        got = [strip(s) for s in StreamingTarDataset(urls(http, "faulty"))]
        log = http.faults()
    finally:
        http.set_faults(FaultPlan())
    assert got == local(http_root)
    assert {"short", "reset"} <= {fault for _, _, _, fault in log}  # what it survived
    resumed = [asked for _, _, asked, _ in log if asked != "bytes=0-"]
    assert resumed and all(asked.endswith("-") for asked in resumed)  # from the byte reached


def test_a_cut_stream_resumes_from_the_byte_reached(http: HttpServer, http_root: Path) -> None:
    http.reset()
    got = [strip(s) for s in StreamingTarDataset(urls(http, "cut"))]
    assert got == local(http_root)
    # the first GET of each shard sent half of it, then broke; one more GET did the rest
    assert all(http.stats()[f"data-{n}.tar"]["requests"] == 2 for n in range(SHARDS))


def test_an_object_changed_mid_stream_raises_and_never_splices(tmp_path: Path) -> None:
    shard = tmp_path / "changing.tar"
    old = tar_bytes(members(0, 40))  # 2 MB: its first half is many reads of the body
    shard.write_bytes(old)
    with HttpServer(tmp_path) as http:
        # the GET runs at most a read of the body ahead: it breaks after the change
        stream = ObjectStream(http.url("changing.tar", mode="cut"), buffer_bytes=1)
        got = bytearray(stream.read(1000) or b"")
        changed = tar_bytes(members(1, 40))
        assert len(changed) == len(old)  # the same size: only the ETag tells
        shard.write_bytes(changed)
        with pytest.raises(StaleIndexError, match="changed while it was streamed"):
            while chunk := stream.read(1 << 16):
                got += chunk
        stream.close()
    assert len(got) < len(old) and old.startswith(bytes(got))


def test_the_next_shards_get_goes_out_before_the_current_one_is_read(
    http: HttpServer, http_root: Path
) -> None:
    http.set_faults(FaultPlan())  # no faults; the log records each ranged GET
    samples = iter(StreamingTarDataset(urls(http, "faulty")))
    first = next(samples)
    assert first["__key__"] == "d0_0000"
    deadline = time.monotonic() + 10
    while not any(path == "data-1.tar" for _, path, _, _ in http.faults()):
        assert time.monotonic() < deadline, "shard 1 was not asked for while shard 0 was read"
        time.sleep(0.05)
    rest = [strip(s) for s in samples]
    assert [strip(first), *rest] == local(http_root)


@pytest.mark.parametrize(
    "options",
    [{}, {"shuffle": 7, "seed": 4}, {"resampled": True, "epoch_length": 100, "seed": 2}],
    ids=["in-order", "shuffled", "resampled"],
)
def test_sending_the_next_get_early_keeps_order_and_content(
    http: HttpServer, http_root: Path, options: dict[str, Any]
) -> None:
    got = [strip(s) for s in StreamingTarDataset(urls(http), **options)]
    assert got == local(http_root, **options)


def test_stopping_early_drops_the_shard_sent_ahead(http: HttpServer) -> None:
    dataset = StreamingTarDataset(urls(http), epoch_length=3)
    assert [s["__key__"] for s in dataset] == ["d0_0000", "d0_0001", "d0_0002"]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_read_each_sample_once(http: HttpServer, http_root: Path, context: str) -> None:
    loader = torch.utils.data.DataLoader(
        StreamingTarDataset(urls(http)), num_workers=2, batch_size=None,
        multiprocessing_context=context,
    )  # fmt: skip
    got = sorted((s["__key__"], s["bin"]) for s in loader)
    assert got == sorted((s["__key__"], s["bin"]) for s in local(http_root))


def test_open_stream_decompresses_a_streamed_targz(tmp_path: Path) -> None:
    import gzip

    data = tar_bytes(members(2))
    (tmp_path / "shard.tar.gz").write_bytes(gzip.compress(data))
    with HttpServer(tmp_path) as http, open_stream(http.url("shard.tar.gz")) as stream:
        assert stream.read() == data


def test_a_server_that_keeps_failing_names_the_shard(http: HttpServer) -> None:
    url = http.url("data-0.tar", mode="fail")
    stream = ObjectStream(url, retry=RetryPolicy(attempts=2, initial_delay=0.01))
    with pytest.raises(Exception, match="data-0.tar") as caught:
        io.BufferedReader(stream).read()
    assert "500" in str(caught.value)
    stream.close()


@pytest.fixture(scope="module")
def s3_files(http_root: Path) -> list[Path]:
    return [http_root / f"data-{n}.tar" for n in range(SHARDS)]


def test_s3_shards_stream_by_one_signed_get_each(s3: Any, http_root: Path) -> None:
    """The S3 branch of the streaming GET (s3_get_object on s3fs's client): the exact
    samples, shard after shard, with the next shard's GET sent early."""
    shards = [f"s3://shards/data-{n}.tar" for n in range(SHARDS)]
    got = [strip(s) for s in StreamingTarDataset(shards, storage_options=s3.storage_options())]
    assert got == local(http_root)
