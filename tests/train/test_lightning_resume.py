"""Lightning: SIGKILL after the last ModelCheckpoint, ``fit(ckpt_path="last")``, same batches.

Runs ``_lightning_run.py`` (a LightningDataModule over indexed shards, a tiny model,
``ModelCheckpoint(every_n_train_steps=4, save_last=True)``) in subprocesses: an
uninterrupted run, runs SIGKILLed mid-epoch (with their DataLoader workers) and
restarted on the same or another number of devices and workers, and the same with a
plain DataLoader, which Lightning restarts from the beginning of the epoch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import trainruns
from trainruns import global_order, keep_before, run, seen

pytest.importorskip("pytorch_lightning")

SCRIPT = Path(__file__).with_name("_lightning_run.py")
BATCH, N = 4, 48


def checkpoint_step(run_dir: Path) -> int:
    ckpt = torch.load(run_dir / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)
    return int(ckpt["global_step"])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[tuple[int, str]]]:
    """Shards and the log of an uninterrupted run on 1 device: 2 epochs of 12 steps."""
    return trainruns.uninterrupted(tmp_path_factory.mktemp("lightning"), SCRIPT, N)


@pytest.mark.timeout(240)
def test_one_process_resumes_batch_for_batch(
    uninterrupted: tuple[str, list[tuple[int, str]]], tmp_path: Path
) -> None:
    pattern, expected = uninterrupted
    run(SCRIPT, str(tmp_path), pattern, "--workers=1", "--kill-at-step=6", expect_kill=True)
    assert checkpoint_step(tmp_path) == 4  # steps 4 and 5 were lost
    keep_before(tmp_path, 1, 4)
    run(SCRIPT, str(tmp_path), pattern, "--workers=0")  # another worker count
    assert seen(tmp_path, 1) == [expected]  # every step: the same keys, in the same order


@pytest.mark.timeout(240)
def test_a_plain_dataloader_replays_and_skips_batches(
    uninterrupted: tuple[str, list[tuple[int, str]]], tmp_path: Path
) -> None:
    """What Lightning does by itself (the measurement in docs/trainers.md), and the check
    that the test above would fail without indextar's loader state."""
    pattern, expected = uninterrupted
    run(SCRIPT, str(tmp_path), pattern, "--no-glue", "--kill-at-step=6", expect_kill=True)
    keep_before(tmp_path, 1, 4)
    run(SCRIPT, str(tmp_path), pattern, "--no-glue")
    [log] = seen(tmp_path, 1)
    assert log != expected
    # Lightning keeps its step count (4 of 12 done) but restarts the loader: the rest of
    # epoch 0 is its first 8 batches again. 16 samples twice, the last 16 never.
    epoch0 = [key for step, key in log if step < 12]
    order = [key for _, key in expected[:N]]
    assert epoch0 == order[:16] + order[:32]
    assert len(set(epoch0)) == 32
    assert [key for step, key in log if step >= 12] == [key for _, key in expected[N:]]


@pytest.mark.timeout(300)
def test_ddp_resumes_on_two_devices_and_on_one(
    uninterrupted: tuple[str, list[tuple[int, str]]], tmp_path: Path
) -> None:
    """DDP on 2 CPU processes (gloo), killed at step 5 of 6 after the checkpoint at step
    4, resumed on 2 devices and, from a copy of the same checkpoint, on 1."""
    pattern, expected = uninterrupted
    order = [key for _, key in expected]  # the global order of both epochs
    killed, elastic = tmp_path / "killed", tmp_path / "elastic"
    killed.mkdir()
    run(
        SCRIPT,
        str(killed),
        pattern,
        "--devices=2",
        "--workers=1",
        "--kill-at-step=5",
        expect_kill=True,
    )
    assert checkpoint_step(killed) == 4
    keep_before(killed, 2, 4)
    shutil.copytree(killed, elastic)  # the same checkpoint and logs, resumed on 1 device

    run(SCRIPT, str(killed), pattern, "--devices=2", "--workers=0")
    logs = seen(killed, 2)
    # Batch for batch: global step s of 2 ranks is positions 8s .. 8s+7 of the order.
    assert [step for step, _ in logs[0]] == [s for s in range(12) for _ in range(BATCH)]
    assert global_order(logs) == order

    run(SCRIPT, str(elastic), pattern, "--devices=1", "--workers=1")
    before = [[line for line in log if line[0] < 4] for log in seen(elastic, 2)]
    after = [line for line in seen(elastic, 1)[0] if line[0] >= 4]
    assert global_order(before) + [key for _, key in after] == order
    # 4 steps of 8 were done; on 1 device the 16 samples left of epoch 0 are 4 steps of
    # 4, then epoch 1 is 12: steps 4 .. 19.
    assert [step for step, _ in after] == [s for s in range(4, 20) for _ in range(BATCH)]
