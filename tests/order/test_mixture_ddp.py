"""A weighted mixture in a real torch.distributed (gloo) job: 2 ranks with DataLoader
workers, SIGKILLed after a checkpoint, resumed on 3 ranks without workers."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import ddpjob
import pytest
from _mixture_ddp_worker import EPOCH, EPOCH_LENGTH, SEED, WEIGHTS, mixture

import indextar

WORKER = Path(__file__).resolve().parents[1] / "_mixture_ddp_worker.py"
BATCH = 4
pytestmark = pytest.mark.timeout(240)


def launch(log_dir: Path, phase: str, world: int, workers: int, *extra: str) -> list[Any]:
    return ddpjob.launch(
        WORKER, log_dir, phase, world, "--workers", str(workers), "--batch", str(BATCH), *extra
    )


def logged(log_dir: Path, phase: str, rank: int, up_to: int | None = None) -> list[int]:
    records = ddpjob.logged(log_dir, phase, rank)
    return [i for r in records if up_to is None or r["step"] <= up_to for i in r["indices"]]


@pytest.mark.slow
def test_a_killed_blended_ddp_job_resumes_on_three_ranks(tmp_path: Path) -> None:
    checkpoint_at = 6
    crash = launch(tmp_path, "crash", 2, 2, "--checkpoint-at", str(checkpoint_at))
    ddpjob.crash_after_ready(crash, tmp_path, "crash")
    state = json.loads((tmp_path / "checkpoint.json").read_text())
    consumed = checkpoint_at * BATCH * 2
    assert (state["epoch"], state["consumed"], state["num_replicas"]) == (EPOCH, consumed, 2)
    assert state["weights"] == [{"epoch": 0, "weights": WEIGHTS}]

    ddpjob.wait_all(launch(tmp_path, "resume", 3, 0, "--resume"), tmp_path, "resume")
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
