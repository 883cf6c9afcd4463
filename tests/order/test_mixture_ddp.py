"""A weighted mixture in a real torch.distributed (gloo) job: 2 ranks with DataLoader
workers, SIGKILLed after a checkpoint, resumed on 3 ranks without workers."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _mixture_ddp_worker import EPOCH, EPOCH_LENGTH, SEED, WEIGHTS, mixture

import indextar

WORKER = Path(__file__).with_name("_mixture_ddp_worker.py")
BATCH = 4
pytestmark = pytest.mark.timeout(240)


def launch(
    log_dir: Path, phase: str, world: int, workers: int, *extra: str
) -> list[subprocess.Popen[bytes]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = []
    for rank in range(world):
        command = [sys.executable, str(WORKER), "--rank", str(rank), "--world", str(world),
                   "--port", str(port), "--workers", str(workers), "--batch", str(BATCH),
                   "--phase", phase, "--log-dir", str(log_dir), *extra]  # fmt: skip
        with (log_dir / f"{phase}-rank{rank}.out").open("wb") as output:
            processes.append(
                subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
            )
    return processes


def logged(log_dir: Path, phase: str, rank: int, up_to: int | None = None) -> list[int]:
    lines = (log_dir / f"{phase}-rank{rank}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return [i for r in records if up_to is None or r["step"] <= up_to for i in r["indices"]]


@pytest.mark.slow
def test_a_killed_blended_ddp_job_resumes_on_three_ranks(tmp_path: Path) -> None:
    checkpoint_at = 6
    crash = launch(tmp_path, "crash", 2, 2, "--checkpoint-at", str(checkpoint_at))
    deadline = time.monotonic() + 180
    for rank, process in enumerate(crash):
        while not (tmp_path / f"crash-rank{rank}.ready").exists():
            assert process.poll() is None, (tmp_path / f"crash-rank{rank}.out").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.1)
    for process in crash:
        os.kill(process.pid, signal.SIGKILL)
    for process in crash:
        assert process.wait(timeout=30) == -signal.SIGKILL
    state = json.loads((tmp_path / "checkpoint.json").read_text())
    consumed = checkpoint_at * BATCH * 2
    assert (state["epoch"], state["consumed"], state["num_replicas"]) == (EPOCH, consumed, 2)
    assert state["weights"] == [{"epoch": 0, "weights": WEIGHTS}]

    resume = launch(tmp_path, "resume", 3, 0, "--resume")
    for rank, process in enumerate(resume):
        assert process.wait(timeout=180) == 0, (tmp_path / f"resume-rank{rank}.out").read_text()
    after = [logged(tmp_path, "resume", rank) for rank in range(3)]
    assert len({len(a) for a in after}) == 1  # equal counts on every rank
    before = [i for rank in range(2) for i in logged(tmp_path, "crash", rank, checkpoint_at)]

    reference = indextar.ResumableSampler(
        mixture(), weights=WEIGHTS, epoch_length=EPOCH_LENGTH, seed=SEED
    )
    reference.set_epoch(EPOCH)
    epoch = reference.indices(0, EPOCH_LENGTH).tolist()
    padding = -(EPOCH_LENGTH - consumed) % 3
    assert collections.Counter(before) == collections.Counter(epoch[:consumed])
    assert collections.Counter(i for a in after for i in a) == collections.Counter(
        epoch[consumed:] + epoch[:padding]
    )
    assert sum(i < 23 for i in epoch) == 105  # exactly 0.7 of 150 from part "a"
