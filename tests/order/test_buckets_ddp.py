"""BucketBatchSampler in real torch.distributed jobs: gloo on 127.0.0.1, real DataLoader
workers; stopped mid-epoch on 2 ranks and finished on 3 (tests/_bucket_ddp_worker.py)."""

from __future__ import annotations

from pathlib import Path

import ddpjob
import pytest
from _bucket_ddp_worker import bucket_ids

from indextar.order.buckets import BucketBatchSampler

WORKER = Path(__file__).resolve().parents[1] / "_bucket_ddp_worker.py"
SIZE, BATCH, STOP = 203, 4, 6
pytestmark = pytest.mark.timeout(240)


def run(log_dir: Path, phase: str, world: int, *extra: str) -> list[list[list[int]]]:
    ddpjob.wait_all(
        ddpjob.launch(
            WORKER,
            log_dir,
            phase,
            world,
            "--workers",
            "1",
            "--batch",
            str(BATCH),
            "--size",
            str(SIZE),
            *extra,
        ),  # fmt: skip
        log_dir,
        phase,
    )
    return [ddpjob.logged(log_dir, phase, rank) for rank in range(world)]


def test_stopped_on_two_ranks_finished_on_three(tmp_path: Path) -> None:
    buckets = bucket_ids(SIZE)
    whole = BucketBatchSampler(buckets, batch_size=BATCH, seed=42, num_replicas=1, rank=0)
    order = [whole.batch(p) for p in range(whole.num_batches)]
    first = run(tmp_path, "first", 2, "--stop-at", str(STOP))
    assert [len(r) for r in first] == [STOP, STOP]
    rest = run(tmp_path, "rest", 3, "--resume")
    assert len({len(r) for r in rest}) == 1  # equal counts, checked by the ranks too
    seen = [first[r][s] for s in range(STOP) for r in range(2)]
    seen += [rest[r][s] for s in range(len(rest[0])) for r in range(3)]
    # The whole epoch in its global order, each batch once, then the padding (wrapped).
    assert seen[: len(order)] == order
    assert seen[len(order) :] == order[: len(seen) - len(order)]
    assert all(len({int(buckets[i]) for i in batch}) == 1 for batch in seen)
