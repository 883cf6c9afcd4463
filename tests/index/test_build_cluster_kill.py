"""A Dask worker killed with SIGKILL in the middle of ``indextar index --dask``.

Three worker processes (nannies, one thread each) on a LocalCluster index 10 local
shards, 2 of them damaged. Once the first outcomes are in, the test kills a worker
that is running a build. The build must finish on the others: every shard reported
exactly once, every good one with a complete, verified index (and nothing else in the
index folder but a killed writer's hidden temporary and lock files), the damaged ones
and only they failed and listed in the failures file; ``--retry-failed`` then builds
exactly those, once fixed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import sample_members, tar_bytes

from indextar import open_index
from indextar.index.shard import INDEX_SUFFIX, index_path
from indextar.index.verify import verify_index

distributed = pytest.importorskip("distributed", reason="the dask extra (in the test extra)")

SHARDS = 10
BAD = {3, 9}
SAMPLES = 3000  # a build takes a few hundred ms: long enough to be killed in


@pytest.fixture(scope="module")
def cluster() -> Iterator[distributed.LocalCluster]:
    with distributed.LocalCluster(
        n_workers=3,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        scheduler_kwargs={"dashboard_address": ":0"},
    ) as local:
        yield local


def _shard_bytes(n: int) -> bytes:
    return tar_bytes(sample_members(SAMPLES, prefix=f"s{n}_"))


def test_a_killed_worker_leaves_no_half_index_and_no_shard_twice(
    cluster: distributed.LocalCluster, tmp_path: Path
) -> None:
    shards = []
    for n in range(SHARDS):
        shard = tmp_path / f"data-{n:02d}.tar"
        data = _shard_bytes(n)
        shard.write_bytes(data[: len(data) // 3] if n in BAD else data)
        shards.append(str(shard))
    idx, failures = tmp_path / "idx", tmp_path / "failed.json"

    def index(*extra: str, stderr: Any = subprocess.PIPE) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "indextar", "index", *shards, "--index-dir", str(idx),
             "--dask", cluster.scheduler_address, "--json-lines", "--failed-file",
             str(failures), *extra],
            stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip

    # Its first line is read before the kill, the rest from the same file object after:
    # communicate() reads the pipe's descriptor and would lose the lines that readline()
    # had already buffered (two shards "not reported" when the CLI printed three at once).
    # Its errors go to a file, so that reading its output to the end cannot block on them.
    with distributed.Client(cluster) as client, open(tmp_path / "stderr", "w+") as errors:
        run = index(stderr=errors)
        assert run.stdout is not None
        lines = [json.loads(run.stdout.readline())]
        killed = None
        deadline = time.monotonic() + 30
        while killed is None and time.monotonic() < deadline:
            busy = [w for w, tasks in client.processing().items() if tasks]
            if busy:
                pids = client.run(os.getpid, workers=[busy[0]])
                killed = pids[busy[0]]
                os.kill(killed, signal.SIGKILL)
            else:
                time.sleep(0.01)
        watchdog = threading.Timer(180, run.kill)  # read() has no timeout of its own
        watchdog.start()
        with run.stdout:
            out = run.stdout.read()
        watchdog.cancel()
        run.wait(timeout=10)
        errors.seek(0)
        err = errors.read()
    assert killed is not None, "no worker was running a build to kill"
    lines += [json.loads(line) for line in out.splitlines()]
    assert run.returncode == 1, err
    reported = [line["shard"] for line in lines[:-1]]
    assert sorted(reported) == sorted(shards), "a shard reported twice, or not at all"
    failed = sorted(line["shard"] for line in lines[:-1] if not line["ok"])
    assert failed == sorted(shards[n] for n in BAD)
    summary = lines[-1]["summary"]
    assert summary["failed"] == len(BAD) and summary["shards"] == SHARDS - len(BAD), summary
    assert summary["samples"] == SAMPLES * (SHARDS - len(BAD)), summary
    listed = json.loads(failures.read_text())["failed"]
    assert sorted(entry["shard"] for entry in listed) == failed
    for n, shard in enumerate(shards):
        if n in BAD:
            assert not index_path(shard, index_dir=idx).exists()
        else:
            assert len(open_index(shard, index_dir=idx)) == SAMPLES
            assert verify_index(shard, index_dir=idx).ok
    for path in idx.iterdir():  # the indexes, or a killed writer's hidden leftovers
        assert path.name.endswith(INDEX_SUFFIX) or path.name.startswith("."), path

    for n in BAD:
        Path(shards[n]).write_bytes(_shard_bytes(n))
    again = index("--retry-failed")
    out, err = again.communicate(timeout=180)
    assert again.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert sorted(line["shard"] for line in lines[:-1]) == failed
    assert lines[-1]["summary"]["built"] == len(BAD)
    assert not failures.exists()
