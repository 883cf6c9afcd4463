"""examples/train_ddp.py under torchrun: SIGKILL mid-epoch, resume, same sample order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
WORLD, BATCH = 2, 8


def torchrun(run: Path, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={WORLD}",
    ]
    return subprocess.Popen(
        [*cmd, str(EXAMPLE), str(run), f"--batch-size={BATCH}", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``; torchrun puts its workers in sessions of their own."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL torchrun and every rank and DataLoader worker under it, at once."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()


def finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    return out


def seen(run: Path) -> list[list[str]]:
    return [(run / f"seen-rank{r}.txt").read_text().splitlines() for r in range(WORLD)]


@pytest.mark.timeout(400)
def test_killed_and_resumed_run_trains_on_the_same_samples(tmp_path: Path) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    for run in (straight, killed):
        subprocess.run(
            [sys.executable, str(EXAMPLE), str(run), "--make-data"],
            check=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )

    out = finish(torchrun(straight, "--workers=0"))
    assert "epoch 1: train accuracy" in out
    expected = seen(straight)
    assert len(expected[0]) == len(expected[1]) == 2 * 384 // WORLD  # two epochs, no padding

    # Train slowly with a DataLoader worker, and SIGKILL every process mid-epoch once
    # a checkpoint exists.
    proc = torchrun(killed, "--workers=1", "--step-delay=0.15")
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("checkpoint epoch 0 step 8"):
            break
    else:
        pytest.fail(f"the run ended before its checkpoint: exit {proc.wait()}")
    time.sleep(0.5)  # let it run past the checkpoint: that work is lost, as in a real crash
    kill_tree(proc)

    state = torch.load(killed / "checkpoint.pt", weights_only=True)["sampler"]
    epoch, steps_done = state["epoch"], state["consumed"] // (BATCH * WORLD)
    assert (epoch, steps_done) >= (0, 8)
    # Lines logged after the checkpoint belong to lost work: drop them, as the
    # restarted run will train on those samples again.
    for rank, lines in enumerate(seen(killed)):
        kept = [
            ln for ln in lines if (int(ln.split()[0]), int(ln.split()[1])) < (epoch, steps_done)
        ]
        (killed / f"seen-rank{rank}.txt").write_text("".join(f"{ln}\n" for ln in kept))

    out = finish(torchrun(killed, "--workers=0"))  # resume with another worker count
    assert f"resumed at epoch {epoch}, position {state['consumed']}" in out
    assert seen(killed) == expected
