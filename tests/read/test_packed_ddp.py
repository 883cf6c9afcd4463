"""PackedDataset under ResumableSampler in real torch.distributed jobs (gloo on
127.0.0.1, DataLoader workers, SIGKILL): a job killed mid-epoch on 2 ranks resumes on
3 ranks, and on 1 with 2 workers, with every batch what an uninterrupted run on that
world size gives, token for token. Each rank runs tests/_packed_ddp_worker.py."""

from __future__ import annotations

import json
from pathlib import Path

import ddpjob
import pytest
from _packed_ddp_worker import packed
from packcorpus import write_corpus

from indextar import ResumableSampler, collate_packs

WORKER = Path(__file__).resolve().parents[1] / "_packed_ddp_worker.py"
BATCH, EPOCH = 3, 2
FIELDS = ("input_ids", "position_ids", "cu_seqlens")
pytestmark = pytest.mark.timeout(300)


def launch(log_dir: Path, phase: str, world: int, workers: int, *extra: str) -> list[ddpjob.Rank]:
    return ddpjob.launch(
        WORKER, log_dir, phase, world, "--workers", str(workers), "--batch", str(BATCH),
        "--epoch", str(EPOCH), *extra,
    )  # fmt: skip


def expected(log_dir: Path, world: int, rank: int, consumed: int) -> list[dict[str, list]]:
    """The batches rank ``rank`` of ``world`` reads from ``consumed`` on, computed here."""
    packs = packed(log_dir)
    sampler = ResumableSampler(packs, seed=1234, num_replicas=world, rank=rank)
    sampler.load_state_dict({**sampler.state_dict(), "epoch": EPOCH, "consumed": consumed})
    indices = list(sampler)
    out = []
    for at in range(0, len(indices), BATCH):
        batch = collate_packs(packs.__getitems__(indices[at : at + BATCH]))
        out.append({k: batch[k].tolist() for k in FIELDS})
    return out


def logged(log_dir: Path, phase: str, rank: int, up_to: int | None = None) -> list[dict]:
    return [
        {k: r[k] for k in FIELDS}
        for r in ddpjob.logged(log_dir, phase, rank)
        if up_to is None or r["step"] <= up_to
    ]


@pytest.mark.slow
def test_killed_packed_job_resumes_on_other_world_sizes_token_for_token(tmp_path: Path) -> None:
    write_corpus(tmp_path)
    packs = packed(tmp_path)
    assert len(packs) > 6 * BATCH * 2
    checkpoint_at, world = 3, 2
    crash = launch(tmp_path, "crash", world, 2, "--checkpoint-at", str(checkpoint_at))
    ddpjob.crash_after_ready(crash, tmp_path, "crash")
    state = json.loads((tmp_path / "checkpoint.json").read_text())
    consumed = checkpoint_at * BATCH * world
    assert (state["epoch"], state["consumed"]) == (EPOCH, consumed)
    for rank in range(world):
        assert (
            logged(tmp_path, "crash", rank, checkpoint_at)
            == expected(tmp_path, world, rank, 0)[:checkpoint_at]
        )
    for new_world, workers in [(3, 0), (1, 2)]:
        phase = f"resume-w{new_world}"
        ddpjob.wait_all(launch(tmp_path, phase, new_world, workers, "--resume"), tmp_path, phase)
        for rank in range(new_world):
            assert logged(tmp_path, phase, rank) == expected(tmp_path, new_world, rank, consumed)
