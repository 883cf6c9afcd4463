"""Remote reads under a misbehaving server: a fault-injecting aiohttp server on 127.0.0.1
(``tools/loopback_servers.py``, ``/faulty/``) answers ranged GETs with another range,
the whole object, 503 with ``Retry-After``, resets and short bodies. Every read must
come back with the sample's own bytes or an error that names the URL, the range, the
sample and the last status; a wrong answer is retried, never served, never called stale.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import tar_bytes

from indextar import IndexedTarDataset
from indextar.errors import RemoteReadError
from indextar.source.remote import RangeSource, RetryPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from loopback_servers import FaultPlan, HttpServer, SeaweedServer  # noqa: E402

SAMPLES = 64
CLS_BLOCKS = 512 + 512  # a sample's .cls header and its one block of data
FAST = RetryPolicy(attempts=4, initial_delay=0.01, max_delay=0.05)


def _members() -> dict[str, bytes]:
    members = {}
    for i in range(SAMPLES):
        members[f"k{i:04d}.cls"] = str(i).encode()
        members[f"k{i:04d}.bin"] = bytes([i]) * (700 + 37 * i)
    return members


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("faulty")
    (folder / "data.tar").write_bytes(tar_bytes(_members()))
    return folder


@pytest.fixture(scope="module")
def server(served: Path) -> Iterator[HttpServer]:
    with HttpServer(served) as http:
        yield http


@pytest.fixture
def dataset(server: HttpServer, tmp_path: Path) -> IndexedTarDataset:
    """The shard through ``/faulty/``, indexed while the server behaves."""
    server.set_faults(FaultPlan())
    return IndexedTarDataset([server.url("data.tar", mode="faulty")], index_dir=tmp_path)


def _expected(i: int) -> dict[str, bytes]:
    return {"cls": str(i).encode(), "bin": bytes([i]) * (700 + 37 * i)}


def _members_of(sample: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in sample.items() if not k.startswith("__")}


def _counts(server: HttpServer) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, _, _, fault in server.faults():
        counts[fault] = counts.get(fault, 0) + 1
    return counts


def _read_both_ways(dataset: IndexedTarDataset, server: HttpServer, plan: FaultPlan) -> None:
    """``ds[i]`` for half the samples, ``__getitems__`` for the other half, under ``plan``."""
    server.set_faults(plan)
    for i in range(0, SAMPLES, 2):
        assert _members_of(dataset[i]) == _expected(i), i
    odd = list(range(1, SAMPLES, 2))
    for i, sample in zip(odd, dataset.__getitems__(odd)):
        assert _members_of(sample) == _expected(i), i


def test_a_wrong_range_starting_at_the_samples_own_member_header_is_retried(
    dataset: IndexedTarDataset, server: HttpServer
) -> None:
    # The answer starts at the sample's .bin header, which names the sample: the header
    # check passes, and only Content-Range tells (before: .cls came back as .bin's data).
    _read_both_ways(dataset, server, FaultPlan(wrong_range=1, shifts=(CLS_BLOCKS,), per_range=1))
    assert _counts(server) == {"wrong_range": SAMPLES, "ok": SAMPLES}


@pytest.mark.parametrize("shift", [None, "next sample"])
def test_a_wrong_range_elsewhere_is_retried_not_called_stale(
    dataset: IndexedTarDataset, server: HttpServer, shift: str | None
) -> None:
    # Before: StaleIndexError ("changed since it was indexed") though the ETag matched.
    with dataset._leased(0) as shard:
        span = shard.span(0)[1]
    shifts = (None,) if shift is None else (span,)
    _read_both_ways(dataset, server, FaultPlan(wrong_range=1, shifts=shifts, per_range=1))
    assert _counts(server) == {"wrong_range": SAMPLES, "ok": SAMPLES}


def test_a_wrong_range_without_content_range_check_is_retried_by_the_header_check(
    server: HttpServer,
) -> None:
    # Bytes of another sample under a right Content-Range can only be caught by the
    # span's header check; with the ETag unchanged that is a wrong answer, retried.
    from indextar.read.shard import OpenShard

    index_dir = server.root / "idx-header-check"
    server.set_faults(FaultPlan())
    ds = IndexedTarDataset([server.url("data.tar", mode="faulty")], index_dir=index_dir)
    with ds._leased(0) as shard:  # the shard ds reads through, held while it is used
        assert isinstance(shard, OpenShard) and isinstance(shard.source, RangeSource)
        offset, length = shard.span(5)
        other = server.root / "data.tar"
        wrong = other.read_bytes()[shard.span(6)[0] :][:length]
        key, members = shard.read(5, wrong)  # the batch path's span, not the sample's
    assert key == "k0005" and dict(members) == _expected(5)


def test_the_whole_object_answering_a_range_is_retried_on_ds_i_as_on_batches(
    dataset: IndexedTarDataset, server: HttpServer
) -> None:
    # Before: ds[i] failed after one attempt ("got 8... bytes, not ..."); batches retried.
    _read_both_ways(dataset, server, FaultPlan(whole=1, per_range=1))
    assert _counts(server) == {"whole": SAMPLES, "ok": SAMPLES}


def test_resets_and_short_bodies_are_retried(
    dataset: IndexedTarDataset, server: HttpServer
) -> None:
    _read_both_ways(dataset, server, FaultPlan(reset=0.5, short=0.5, per_range=1))
    counts = _counts(server)
    assert counts["ok"] == SAMPLES and counts["reset"] + counts["short"] == SAMPLES


def test_retry_after_is_honoured(server: HttpServer) -> None:
    server.set_faults(FaultPlan(busy=1, retry_after="1", per_range=1))
    raw = (server.root / "data.tar").read_bytes()
    source = RangeSource(server.url("data.tar", mode="faulty"), retry=FAST)
    started = time.monotonic()
    assert source.read(1024, 5000) == raw[1024:6024]
    (busy, _, _, first), (ok, _, _, second) = server.faults()
    assert (first, second) == ("busy", "ok")
    # Before: the retry came after FAST's 0.01 s backoff.
    assert 1.0 <= ok - busy < 1.5 and time.monotonic() - started < 2


def test_retries_stop_at_the_policys_total_wait(server: HttpServer) -> None:
    server.set_faults(FaultPlan(busy=1, retry_after="30"))
    url = server.url("data.tar", mode="faulty")
    source = RangeSource(url, retry=RetryPolicy(attempts=5, max_wait=0.5))
    started = time.monotonic()
    with pytest.raises(RemoteReadError) as info:
        source.read(0, 512)
    assert time.monotonic() - started < 1
    message = str(info.value)
    assert "after 1 attempt," in message and "last status 503" in message
    assert "the next wait would pass 0.5s" in message and info.value.status == 503


@pytest.mark.parametrize("how", ["ds[i]", "__getitems__"])
def test_a_read_whose_retries_are_spent_names_url_range_key_attempts_and_status(
    dataset: IndexedTarDataset, server: HttpServer, how: str
) -> None:
    server.set_faults(FaultPlan(busy=1, retry_after="0"))
    with pytest.raises(RemoteReadError) as info:
        if how == "ds[i]":
            dataset[7]
        else:
            dataset.__getitems__([7, 8])
    with dataset._leased(0) as shard:
        error, (offset, length) = info.value, shard.span(7)
    message = str(error)
    assert error.url in message and f"bytes {offset}-{offset + length - 1}" in message
    assert "of sample 'k0007'" in message and error.key == "k0007"
    assert "after 5 attempts, last status 503" in message
    assert (error.status, error.attempts, error.offset) == (503, 5, offset)


# -- a storm of every fault at once, through DataLoader workers -------------------------

STORM = FaultPlan(
    busy=0.1, retry_after="0", reset=0.05, short=0.05, wrong_range=0.1, whole=0.05,
    shifts=(None, CLS_BLOCKS, 512), per_range=3, seed=26,
)  # fmt: skip


@pytest.mark.parametrize("batch_size", [8, None], ids=["__getitems__", "ds[i]"])
def test_a_fault_storm_through_two_dataloader_workers_serves_no_wrong_byte(
    dataset: IndexedTarDataset, server: HttpServer, batch_size: int | None
) -> None:
    from torch.utils.data import DataLoader

    order = [(i * 37 + 11) % SAMPLES for i in range(SAMPLES)]  # each sample once, shuffled
    server.set_faults(STORM)
    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=order, num_workers=2, collate_fn=lambda b: b
    )
    read = [s for got in loader for s in (got if batch_size else [got])]
    wrong = [s["__key__"] for s in read if _members_of(s) != _expected(int(s["__key__"][1:]))]
    assert len(read) == len(order) and [s["__index__"] for s in read] == order
    assert wrong == []
    counts = _counts(server)
    assert all(counts.get(fault, 0) > 0 for fault in ("busy", "reset", "short", "wrong_range"))
    assert counts.get("whole", 0) > 0 and counts["ok"] >= len(order)


# -- the same faults from an S3 endpoint: a proxy in front of SeaweedFS ------------------


@pytest.fixture(scope="module")
def s3_files(served: Path) -> list[Path]:
    return [served / "data.tar"]


@pytest.fixture(scope="module")
def s3_proxy(s3: SeaweedServer, served: Path) -> Iterator[HttpServer]:
    with HttpServer(served, upstream=f"http://127.0.0.1:{s3.port}") as proxy:
        yield proxy


def _through(proxy: HttpServer, s3: SeaweedServer) -> dict[str, object]:
    return {**s3.storage_options(), "endpoint_url": f"http://127.0.0.1:{proxy.port}"}


def test_s3_retry_after_is_honoured_by_indextar_not_hidden_in_botocore(
    s3: SeaweedServer, s3_proxy: HttpServer
) -> None:
    s3_proxy.set_faults(FaultPlan(busy=1, retry_after="1", per_range=1))
    raw = (s3_proxy.root / "data.tar").read_bytes()
    options = _through(s3_proxy, s3)
    source = RangeSource("s3://shards/data.tar", storage_options=options, retry=FAST)
    assert source.read(1024, 5000) == raw[1024:6024]
    (busy, _, _, first), (ok, _, _, second) = s3_proxy.faults()
    assert (first, second) == ("busy", "ok") and 1.0 <= ok - busy < 1.5


def test_s3_fault_storm_serves_no_wrong_byte(
    s3: SeaweedServer, s3_proxy: HttpServer, tmp_path: Path
) -> None:
    s3_proxy.set_faults(FaultPlan())
    options = _through(s3_proxy, s3)
    dataset = IndexedTarDataset(
        ["s3://shards/data.tar"], index_dir=tmp_path, storage_options=options
    )
    _read_both_ways(dataset, s3_proxy, STORM)
    counts = _counts(s3_proxy)
    assert all(counts.get(fault, 0) > 0 for fault in ("busy", "wrong_range", "whole"))
