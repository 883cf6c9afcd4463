"""A DataLoader worker that reads ahead keeps what its C heap frees for its next batch
(``indextar.source.heap``): a batch's spans and samples, freed, are not given back to
the kernel to be faulted in again at the next batch; and the objects it has at its
first read-ahead are frozen out of its garbage collector's walks. The training
process's own heap and collector are left as they are.

Each case runs in a fresh interpreter (a heap's thresholds are the process's, and
glibc moves them with what the process has freed before) against a real HTTP server
on 127.0.0.1, and counts the page faults of allocating and freeing 20 batches of 64
buffers of 100 kB after the dataset's first batch, then the anonymous memory that a
child forked after 40 MB more were freed starts with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import tar_bytes

from indextar import IndexedTarDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from loopback_servers import HttpServer  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc") or sys.maxsize < 2**32,
    reason="the thresholds are glibc's, on a 64-bit machine",
)

CHILD = """
import gc, json, os, resource, sys
from indextar import IndexedTarDataset, ReadAheadBatches
prefetch, index_dir, workers, *urls = sys.argv[1:]
ds = IndexedTarDataset(urls, index_dir=index_dir, prefetch_bytes=int(prefetch))
def batch(size=64):  # as a batch's spans: allocated, touched, freed together
    return [bytearray(100_000) for _ in range(size)]
def anon_mb():
    status = open("/proc/self/status").read().split("RssAnon:")[1]
    return int(status.split()[0]) // 1024
def probe(indices):
    ds.__getitems__(indices)  # its first batch: the read-ahead starts
    batch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        batch()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    batch(400)  # 40 MB freed: kept, or given back
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # what a forked child starts with
        os.write(write, str(anon_mb()).encode())
        os._exit(0)
    os.waitpid(child, 0)
    return {
        "faults": faults, "parent_mb": anon_mb(), "child_mb": int(os.read(read, 64)),
        "frozen": gc.get_freeze_count(),
    }
hinted = next(iter(ReadAheadBatches(range(len(ds)), 4)))
if workers == "0":
    found = probe(hinted)
else:  # in a DataLoader worker
    import torch.utils.data
    class Probe(torch.utils.data.Dataset):
        def __len__(self):
            return len(ds)
        def __getitems__(self, indices):
            return [probe(indices)]
    loader = torch.utils.data.DataLoader(
        Probe(), batch_sampler=[hinted], num_workers=1, collate_fn=lambda found: found[0],
        multiprocessing_context="fork",
    )
    found = next(iter(loader))
print(json.dumps(found))
"""
BATCHES_PAGES = 20 * 64 * 100_000 // 4096  # each page of every batch faulted again


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    folder = tmp_path_factory.mktemp("heap")
    samples = {f"h_{i:03d}.bin": bytes([i]) * 3000 for i in range(16)}
    (folder / "heap-0.tar").write_bytes(tar_bytes(samples))
    with HttpServer(folder) as server:
        yield server


def run(
    http: HttpServer, index_dir: Path, prefetch: int, workers: int = 1, **env: str
) -> dict[str, int]:
    url = http.url("heap-0.tar")
    IndexedTarDataset([url], index_dir=index_dir)  # the index, built here once
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(prefetch), str(index_dir), str(workers), url],
        capture_output=True, text=True, timeout=120, env={**environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_a_worker_reading_ahead_keeps_its_freed_batches_and_its_forks_give_them_back(
    http: HttpServer, tmp_path: Path
) -> None:
    found = run(http, tmp_path, 256 << 20)
    assert found["faults"] < BATCHES_PAGES / 20
    # the objects it had at its first read-ahead (torch's, the dataset's) are left out
    # of its collector's walks
    assert found["frozen"] > 10_000, found
    # the 40 MB freed last stay with the parent; a forked child does not copy them in
    assert found["parent_mb"] - found["child_mb"] > 30, found


def test_the_training_process_a_worker_without_read_ahead_or_the_users_own_threshold_are_left_alone(
    http: HttpServer, tmp_path: Path
) -> None:
    # glibc's defaults give each freed batch back: faulted in again, page by page
    training = run(http, tmp_path, 256 << 20, workers=0)  # its heap is the user's
    no_read_ahead = run(http, tmp_path, 0)
    for found in (
        training,
        no_read_ahead,
        run(http, tmp_path, 256 << 20, MALLOC_TRIM_THRESHOLD_="131072"),
    ):
        assert found["faults"] > BATCHES_PAGES / 2, found
    # and its collector's generations too
    assert training["frozen"] == no_read_ahead["frozen"] == 0
