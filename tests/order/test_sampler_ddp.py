"""ResumableSampler in real torch.distributed jobs: gloo on 127.0.0.1, real DataLoader
workers, real SIGKILL. Each rank is a subprocess running tests/_sampler_ddp_worker.py.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import ddpjob
import pytest
import torch.distributed  # noqa: F401

from indextar.order.sampler import ResumableSampler

WORKER = Path(__file__).resolve().parents[1] / "_sampler_ddp_worker.py"
SIZE, BATCH, EPOCH, SEED = 101, 4, 3, 1234
pytestmark = pytest.mark.timeout(240)


def launch(log_dir: Path, phase: str, world: int, workers: int, *extra: str) -> list[ddpjob.Rank]:
    return ddpjob.launch(
        WORKER, log_dir, phase, world, "--workers", str(workers), "--batch", str(BATCH),
        "--size", str(SIZE), "--epoch", str(EPOCH), *extra,
    )  # fmt: skip


def batches(
    log_dir: Path, phase: str, rank: int, *, up_to_step: int | None = None
) -> list[list[int]]:
    records = ddpjob.logged(log_dir, phase, rank)
    return [r["indices"] for r in records if up_to_step is None or r["step"] <= up_to_step]


def reference(world: int, consumed: int) -> ResumableSampler:
    sampler = ResumableSampler(SIZE, seed=SEED, num_replicas=world, rank=0)
    sampler.set_epoch(EPOCH)
    sampler.load_state_dict({"epoch": EPOCH, "consumed": consumed})
    return sampler


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_ddp_ranks_get_equal_batches_and_disjoint_coverage(tmp_path: Path, world: int) -> None:
    ddpjob.wait_all(launch(tmp_path, "full", world, 0), tmp_path, "full")
    per_rank = [batches(tmp_path, "full", rank) for rank in range(world)]
    assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
    assert len({sum(map(len, b)) for b in per_rank}) == 1
    seen = collections.Counter(i for b in per_rank for batch in b for i in batch)
    padding = -SIZE % world
    expected = collections.Counter(range(SIZE)) + collections.Counter(
        reference(world, 0).indices(0, padding).tolist()
    )
    assert seen == expected


@pytest.mark.slow
def test_killed_job_resumes_on_other_world_and_worker_counts(tmp_path: Path) -> None:
    checkpoint_at, world = 5, 2
    crash = launch(tmp_path, "crash", world, 2, "--checkpoint-at", str(checkpoint_at))
    ddpjob.crash_after_ready(crash, tmp_path, "crash")
    state = json.loads((tmp_path / "checkpoint.json").read_text())
    consumed = checkpoint_at * BATCH * world
    assert (state["epoch"], state["consumed"]) == (EPOCH, consumed)
    before = collections.Counter(
        i for rank in range(world)
        for batch in batches(tmp_path, "crash", rank, up_to_step=checkpoint_at) for i in batch
    )  # fmt: skip
    for new_world, workers in [(3, 0), (1, 3)]:
        phase = f"resume-w{new_world}"
        ddpjob.wait_all(launch(tmp_path, phase, new_world, workers, "--resume"), tmp_path, phase)
        per_rank = [batches(tmp_path, phase, rank) for rank in range(new_world)]
        assert len({sum(map(len, b)) for b in per_rank}) == 1
        after = collections.Counter(i for b in per_rank for batch in b for i in batch)
        padding = -(SIZE - consumed) % new_world
        expected = collections.Counter(range(SIZE)) + collections.Counter(
            reference(new_world, consumed).indices(0, padding).tolist()
        )
        assert before + after == expected, new_world
