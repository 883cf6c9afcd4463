"""Read-ahead of remote samples driven by the order (issue 25): ``ReadAheadBatches``
hints the next batches, ``IndexedTarDataset(prefetch_bytes=)`` fetches them ahead.

Real servers on 127.0.0.1 (aiohttp HTTP with its fault route, SeaweedFS S3), real
DataLoader workers (fork and spawn). Every run with read-ahead is compared with the
same run without it: the same samples in the same order, each span fetched once.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tar_bytes
from torch.utils.data import DataLoader, get_worker_info

from indextar import (
    BucketBatchSampler,
    IndexedTarDataset,
    ReadAheadBatches,
    ResumableSampler,
    StaleIndexError,
)
from indextar.order.readahead import Hint, HintedBatch
from indextar.source.throttle import INITIAL

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from loopback_servers import FaultPlan, HttpServer, SeaweedServer  # noqa: E402

SHARDS, SAMPLES, BATCH = 3, 40, 6


def members(shard: int) -> dict[str, bytes]:
    """Samples of 1 to 3 KB, each byte telling its shard and sample."""
    return {
        f"s{shard}_{i:04d}.{ext}": bytes([shard * 50 + i % 50]) * (1000 + 700 * (i % 3))
        for i in range(SAMPLES)
        for ext in ("bin", "cls")
    }


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("served")
    for shard in range(SHARDS):
        (folder / f"ra-{shard}.tar").write_bytes(tar_bytes(members(shard)))
    return folder


@pytest.fixture(scope="module")
def http(root: Path) -> Iterator[HttpServer]:
    with HttpServer(root) as server:
        yield server


@pytest.fixture(scope="module")
def s3_files(root: Path) -> list[Path]:
    return [root / f"ra-{shard}.tar" for shard in range(SHARDS)]


def urls(http: HttpServer, mode: str = "files") -> list[str]:
    return [http.url(f"ra-{shard}.tar", mode=mode) for shard in range(SHARDS)]


def dataset(shards: list[str], folder: Path, **kwargs: Any) -> IndexedTarDataset:
    return IndexedTarDataset(shards, index_dir=folder / "ix", keys=("__key__", "bin"), **kwargs)


def requests(http: HttpServer) -> int:
    return sum(entry["requests"] for entry in http.stats().values())


def with_stats(batch: list[Any]) -> tuple[list[Any], Any]:
    """A collate_fn that also returns the read-ahead figures of the process that read
    the batch (a worker, or the main process)."""
    info = get_worker_info()
    return batch, None if info is None else info.dataset.prefetch_stats()  # type: ignore[attr-defined]


def read_all(
    ds: IndexedTarDataset, batches: Any, workers: int, context: str = "fork"
) -> tuple[list[Any], list[Any]]:
    loader = DataLoader(
        ds, batch_sampler=batches, num_workers=workers, collate_fn=with_stats,
        multiprocessing_context=context if workers else None,
    )  # fmt: skip
    samples, stats = [], []
    for batch, stat in loader:
        samples += batch
        stats.append(stat if workers else ds.prefetch_stats())
    return samples, stats


# -- the hints ----------------------------------------------------------------------------


def test_batches_are_the_batch_samplers_and_hints_name_the_next_ones() -> None:
    from torch.utils.data import BatchSampler

    for drop_last in (False, True):
        plain = ResumableSampler(23, seed=5)
        ahead = ResumableSampler(23, seed=5)
        expected = list(BatchSampler(plain, 4, drop_last))
        got = list(ReadAheadBatches(ahead, 4, drop_last=drop_last, depth=3))
        assert [list(b) for b in got] == expected
        assert len(ReadAheadBatches(ahead, 4, drop_last=drop_last)) == len(expected)
        for number, batch in enumerate(got):
            hint = batch.hint
            assert hint is not None and hint.number == number
            assert [list(b) for _, b in hint.batches()] == expected[number + 1 : number + 4]
            assert [n for n, _ in hint.batches()] == list(
                range(number + 1, number + 1 + len(hint.sizes))
            )
        assert len({b.hint.token for b in got}) == 1  # type: ignore[union-attr]
    # Any iterable sampler: read ahead of what is handed out, same batches.
    assert [list(b) for b in ReadAheadBatches(range(7), 3, depth=1)] == [[0, 1, 2], [3, 4, 5], [6]]
    # A batch sampler: batch_size=None.
    buckets = BucketBatchSampler([0, 1, 0, 1, 0, 1, 0], batch_size=2, seed=3)
    reference = BucketBatchSampler([0, 1, 0, 1, 0, 1, 0], batch_size=2, seed=3)
    hinted = list(ReadAheadBatches(buckets, None, depth=2))
    assert [list(b) for b in hinted] == list(reference)
    assert hinted[0].hint.ahead.tolist() == [i for b in list(reference)[1:3] for i in b]  # type: ignore[union-attr]


def test_a_hinted_batch_pickles_with_its_hint_and_the_sampler_counts_only_what_was_handed_out() -> (
    None
):
    batch = next(iter(ReadAheadBatches(ResumableSampler(50, seed=1), 5)))
    copy = pickle.loads(pickle.dumps(batch))
    assert type(copy) is HintedBatch and list(copy) == list(batch)
    assert isinstance(copy.hint, Hint) and copy.hint.ahead.tolist() == batch.hint.ahead.tolist()  # type: ignore[union-attr]
    # Looking ahead moves no state: after k batches, consumed is k batches' worth.
    sampler, plain = ResumableSampler(50, seed=1), ResumableSampler(50, seed=1)
    batches, plain_iter = iter(ReadAheadBatches(sampler, 5, depth=4)), iter(plain)
    for _ in range(3):
        next(batches)
        for _ in range(5):
            next(plain_iter)
    assert sampler.state_dict() == plain.state_dict() and sampler.consumed == 15


# -- reads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "workers", "context"),
    [("http", 0, ""), ("http", 2, "fork"), ("http", 2, "spawn"), ("s3", 0, ""), ("s3", 2, "fork")],
)
def test_read_ahead_gives_the_same_samples_in_order_each_fetched_once(
    kind: str, workers: int, context: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if kind == "http":
        server: Any = request.getfixturevalue("http")
        shards, options = urls(server), {}
    else:
        seaweed: SeaweedServer = request.getfixturevalue("s3")
        shards = [f"s3://shards/ra-{shard}.tar" for shard in range(SHARDS)]
        options = seaweed.storage_options()
    ds = dataset(shards, tmp_path, storage_options=options)
    sampler = ResumableSampler(ds, seed=7)
    plain, _ = read_all(ds, [list(b) for b in ReadAheadBatches(sampler, BATCH)], 0)
    if kind == "http":
        server.reset()
    ahead, stats = read_all(
        ds, ReadAheadBatches(sampler, BATCH, depth=4), workers, context or "fork"
    )
    assert ahead == plain and len(ahead) == SHARDS * SAMPLES
    assert {type(sample[1]) for sample in ahead + plain} == {bytes}  # not the buffers they came in
    assert (
        sum(
            1
            for sample in ahead
            if sample[1][0] != int(sample[0][1]) * 50 + int(sample[0][3:]) % 50
        )
        == 0
    )
    if kind == "http":
        assert requests(server) == SHARDS * SAMPLES  # no span fetched twice
    last = [s for s in stats if s is not None][-1]
    assert last.taken > 0 and last.peak_bytes <= last.budget


def test_resume_mid_epoch_gives_the_uninterrupted_runs_samples(
    http: HttpServer, tmp_path: Path
) -> None:
    ds = dataset(urls(http), tmp_path)
    uninterrupted, _ = read_all(ds, ReadAheadBatches(ResumableSampler(ds, seed=3), BATCH), 0)
    sampler = ResumableSampler(ds, seed=3)
    first: list[Any] = []
    for batch in ReadAheadBatches(sampler, BATCH, depth=5):
        first += ds.__getitems__(batch)
        if len(first) == 4 * BATCH:
            break
    state = sampler.state_dict()
    assert state["consumed"] == 4 * BATCH  # the hints looked 5 batches further
    resumed_sampler = ResumableSampler(ds, seed=3)
    resumed_sampler.load_state_dict(state)
    fresh = dataset(urls(http), tmp_path)
    rest, _ = read_all(fresh, ReadAheadBatches(resumed_sampler, BATCH), 2)
    assert first + rest == uninterrupted


def test_a_wrong_prediction_costs_budget_never_a_sample(http: HttpServer, tmp_path: Path) -> None:
    ds = dataset(urls(http), tmp_path)
    expected = [ds[i] for i in range(len(ds))]
    http.reset()
    token = 99
    # Batch 0 predicts batches 1 and 2 as samples 10..21; batch 1 asks for others.
    lies = HintedBatch(range(0, 6), Hint(token, 0, np.arange(10, 22), (6, 6)))
    assert ds.__getitems__(lies) == expected[0:6]
    deadline = time.monotonic() + 30
    while (stats := ds.prefetch_stats()) is None or stats.fetched < 12:
        assert time.monotonic() < deadline, stats
        time.sleep(0.01)
    asked = HintedBatch(range(60, 66), Hint(token, 1, np.arange(0, 0), ()))
    assert ds.__getitems__(asked) == expected[60:66]
    late = HintedBatch(range(16, 22), Hint(token, 2, np.arange(0, 0), ()))
    assert ds.__getitems__(late) == expected[16:22]
    stats = ds.prefetch_stats()
    assert stats is not None
    taken = (stats.taken, stats.wasted, stats.missed, stats.held_bytes)
    assert taken == (6, 6, 6, 0)  # missed: batch 1's (batch 0 was read before announcing)
    # Batch 0 directly, 1 and 2 ahead, batch 1's real samples directly: none twice.
    assert requests(http) == 6 + 12 + 6


def test_a_shard_replaced_mid_epoch_raises_stale_never_wrong_bytes(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    name = "ra-replaced.tar"
    path = root / name
    path.write_bytes(tar_bytes(members(0)))
    os.utime(path, ns=(10**9, 10**9))
    ds = dataset([http.url(name)], tmp_path, prefetch_bytes=3 * 2400)
    promised = [ds[i] for i in range(len(ds))]
    sampler = ResumableSampler(ds, seed=2)
    seen = 0
    with pytest.raises(StaleIndexError, match="changed since it was indexed"):
        for batch in ReadAheadBatches(sampler, 4, depth=6):
            for at, sample in zip(batch, ds.__getitems__(batch)):
                assert sample == promised[at]
                seen += 1
            if seen == 8:  # same size, other bytes, another ETag
                other = tar_bytes({k.replace("s0_", "zz"): v[::-1] for k, v in members(0).items()})
                path.write_bytes(other)
                os.utime(path, ns=(2 * 10**9, 2 * 10**9))
    assert 8 <= seen < SAMPLES


def test_a_server_failing_part_of_the_requests_still_gives_the_right_samples(
    http: HttpServer, tmp_path: Path
) -> None:
    ds = dataset(urls(http, mode="faulty"), tmp_path)
    expected = [ds[i] for i in range(len(ds))]
    http.set_faults(
        FaultPlan(
            busy=0.1, retry_after="0", reset=0.1, short=0.1, wrong_range=0.1, per_range=2, seed=4
        )
    )
    try:
        got, stats = read_all(ds, ReadAheadBatches(ResumableSampler(ds, seed=4), BATCH, depth=8), 0)
        faults = [fault for *_, fault in http.faults() if fault != "ok"]
    finally:
        http.set_faults(FaultPlan())
    order = list(ReadAheadBatches(ResumableSampler(ds, seed=4), BATCH))
    assert got == [expected[i] for batch in order for i in batch]
    assert len(faults) > 10 and stats[-1].taken > 0


@pytest.mark.parametrize("kind", ["http", "s3"])
def test_a_store_that_says_slow_down_gets_fewer_requests_in_flight(
    kind: str, request: pytest.FixtureRequest, root: Path, tmp_path: Path
) -> None:
    """503 SlowDown answers cut what the read-ahead keeps in flight (the samples are
    right all the same: each refused span is fetched by its batch, with its retries).
    S3: the direct signed client's answers, through a faulting proxy before SeaweedFS."""
    with contextlib.ExitStack() as stack:
        if kind == "http":
            server: HttpServer = request.getfixturevalue("http")
            ds = dataset(urls(server, mode="faulty"), tmp_path)
        else:
            seaweed: SeaweedServer = request.getfixturevalue("s3")
            upstream = f"http://127.0.0.1:{seaweed.port}"
            server = stack.enter_context(HttpServer(root, upstream=upstream))
            options = {
                **seaweed.storage_options(),
                "endpoint_url": f"http://127.0.0.1:{server.port}",
            }
            shards = [f"s3://shards/ra-{shard}.tar" for shard in range(SHARDS)]
            ds = dataset(shards, tmp_path, storage_options=options)
        expected = [ds[i] for i in range(len(ds))]
        server.set_faults(FaultPlan(busy=0.3, retry_after="0", per_range=1, seed=7))
        try:
            got, stats = read_all(ds, ReadAheadBatches(ResumableSampler(ds, seed=7), BATCH), 0)
            busy = [fault for *_, fault in server.faults() if fault == "busy"]
        finally:
            server.set_faults(FaultPlan())
        _, clean = read_all(ds, ReadAheadBatches(ResumableSampler(ds, seed=8), BATCH), 0)
    order = list(ReadAheadBatches(ResumableSampler(ds, seed=7), BATCH))
    assert got == [expected[i] for batch in order for i in batch]
    assert busy and 0 < stats[-1].throttled <= len(busy)
    assert min(s.in_flight_limit for s in stats) < INITIAL  # cut at least once
    # a clean pass: no request is refused, and the limit only grows
    assert clean[-1].throttled == stats[-1].throttled
    assert clean[-1].in_flight_limit >= stats[-1].in_flight_limit


def test_memory_stays_within_the_budget(http: HttpServer, tmp_path: Path) -> None:
    budget = 4 * 2400  # four samples of the largest size, about
    ds = dataset(urls(http), tmp_path, prefetch_bytes=budget)
    peak = 0
    for batch in ReadAheadBatches(ResumableSampler(ds, seed=9), BATCH, depth=10):
        ds.__getitems__(batch)
        stats = ds.prefetch_stats()
        assert stats is not None and stats.held_bytes + stats.in_flight_bytes <= budget
        peak = max(peak, stats.peak_bytes)
    assert 0 < peak <= budget
    assert stats.taken > 0 and stats.held_bytes == 0


@pytest.mark.timeout(240)
def test_every_ddp_rank_reads_its_own_order_ahead(http: HttpServer, tmp_path: Path) -> None:
    import ddpjob

    worker = Path(__file__).resolve().parents[1] / "_readahead_ddp_worker.py"
    ds = dataset(urls(http), tmp_path)  # builds the indexes the ranks use
    keys = [ds[i][0] for i in range(len(ds))]
    http.reset()
    shard_args = [arg for url in urls(http) for arg in ("--url", url)]
    ranks = ddpjob.launch(
        worker, tmp_path, "ddp", 2, "--workers", "2", "--batch", "4", "--seed", "11",
        "--index-dir", str(tmp_path / "ix"), *shard_args,
    )  # fmt: skip
    ddpjob.wait_all(ranks, tmp_path, "ddp")
    for rank in range(2):
        order = ResumableSampler(len(ds), seed=11, num_replicas=2, rank=rank)
        expected = [keys[i] for i in order]
        logged = [key for record in ddpjob.logged(tmp_path, "ddp", rank) for key in record["keys"]]
        assert logged == expected
    assert requests(http) == len(ds)  # each span once, across both ranks and their workers


def test_a_compressed_shard_is_read_ahead_through_its_frames(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    import indextar

    with indextar.TarWriter(root / "ra-frames.tar.zst", compress="zstd") as sink:
        for i in range(SAMPLES):
            sink.write({"__key__": f"z{i:04d}", "bin": bytes([i]) * (500 + 97 * i)})
    shards = [http.url("ra-frames.tar.zst"), urls(http)[1]]
    ds = dataset(shards, tmp_path)
    expected = [ds[i] for i in range(len(ds))]
    http.reset()
    got, stats = read_all(ds, ReadAheadBatches(ResumableSampler(ds, seed=6), BATCH), 0)
    order = [i for b in ReadAheadBatches(ResumableSampler(ds, seed=6), BATCH) for i in b]
    assert got == [expected[i] for i in order]
    assert requests(http) == len(ds)  # one ranged GET a sample (its frame), none twice
    assert stats[-1].taken >= len(ds) - 2 * BATCH


def test_a_key_view_passes_the_hint_on_as_base_indices(http: HttpServer, tmp_path: Path) -> None:
    ds = dataset(urls(http), tmp_path)
    view = ds.exclude([f"s1_{i:04d}" for i in range(0, SAMPLES, 2)])
    expected = [view[i] for i in range(len(view))]
    batches = ReadAheadBatches(ResumableSampler(view, seed=8), BATCH)
    loader = DataLoader(view, batch_sampler=batches, collate_fn=list)
    got = [sample for batch in loader for sample in batch]
    order = [i for b in ReadAheadBatches(ResumableSampler(view, seed=8), BATCH) for i in b]
    assert got == [expected[i] for i in order]
    stats = ds.prefetch_stats()
    assert stats is not None and stats.taken >= len(view) - 2 * BATCH and stats.wasted == 0


def test_what_the_read_ahead_allocates_stays_within_the_budget_plus_a_constant(
    http: HttpServer, root: Path, tmp_path: Path
) -> None:
    import tracemalloc

    name, size, count, batch = "ra-big.tar", 256 << 10, 48, 4
    (root / name).write_bytes(tar_bytes({f"b{i:03d}.bin": bytes([i]) * size for i in range(count)}))
    budget = 4 * (size + 1024)  # four spans: a sample and its headers
    ds = IndexedTarDataset([http.url(name)], index_dir=tmp_path / "ix", prefetch_bytes=budget)
    ds[0]  # the index, the shard and the client, before measuring
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for hinted in ReadAheadBatches(ResumableSampler(ds, seed=1), batch, depth=count):
            assert len(ds.__getitems__(hinted)) == len(hinted)  # and dropped
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    stats = ds.prefetch_stats()
    # Read ahead, so that the budget was exercised: how many arrive before their batch
    # asks depends on the machine's load (20 of 48 on a busy CI), not on the code.
    assert stats is not None and stats.taken >= count // 4
    # The budget, a batch being read and built (twice its bytes), and 4 MiB for the
    # requests in flight (their buffers are joined once: up to the budget again).
    assert peak <= 2 * budget + 2 * batch * size + (4 << 20), peak
