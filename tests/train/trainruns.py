"""Helpers for the trainer tests: shards, runs in subprocesses, their logs of keys.

Every training run appends the key of each sample it trains on to
``seen-rank<r>.txt`` as ``<step> <key>`` lines, ``step`` counting optimiser steps from
the start of training (a resumed run continues the count). A run asked to
``--kill-at-step S`` SIGKILLs its whole process group (every rank, every DataLoader
worker, the job's leader) once all ranks have finished step ``S``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))
from ddpjob import start_job  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHARDS, PER_SHARD = 2, 24  # 48 samples: whole global batches for 1 or 2 ranks of 4 or 8


def make_shards(run: Path, per_shard: int = PER_SHARD) -> str:
    """Two shards of ``per_shard`` samples ``s<shard>-<i>`` with a ``cls`` member; their
    pattern."""
    run.mkdir(parents=True, exist_ok=True)
    for shard in range(SHARDS):
        with tarfile.open(run / f"train-{shard}.tar", "w") as tf:
            for i in range(per_shard):
                payload = b"%d" % (i % 3)
                info = tarfile.TarInfo(f"s{shard}-{i:02d}.cls")
                info.size, info.mtime = len(payload), 0
                tf.addfile(info, io.BytesIO(payload))
    return str(run / f"train-{{0..{SHARDS - 1}}}.tar")


# What each run script imports besides torch, once, in the zygote its runs fork from.
PRELOAD = {
    "_accelerate_run.py": ("torch._dynamo", "accelerate"),
    "_lightning_run.py": ("torch._dynamo", "pytorch_lightning"),
}


def run(script: Path, *args: str, processes: int = 0, expect_kill: bool = False) -> str:
    """Run ``script`` in a session of its own: one process, or ``processes`` ranks as
    torchrun starts them (its environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``, ...).
    Every process is forked from a zygote (tests/_rank_zygote.py) that imported torch
    and ``PRELOAD[script.name]`` once; its output is returned."""
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{script.parent}", OMP_NUM_THREADS="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    out_file = script_output(script)
    job = start_job(
        [str(script), *args], out_file, env, world=processes, imports=PRELOAD.get(script.name, ())
    )
    try:
        code = job.wait(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        raise
    out = out_file.read_text()
    out_file.unlink()
    if expect_kill:
        assert code in (-signal.SIGKILL, 1), out  # 1: a rank failed, as torchrun exits
        assert "killed at step" in out or code == -signal.SIGKILL, out
    else:
        assert code == 0, out
    return out


def script_output(script: Path) -> Path:
    """A fresh file for one run's output."""
    handle, name = tempfile.mkstemp(prefix=f"{script.stem}-", suffix=".out")
    os.close(handle)
    return Path(name)


def uninterrupted(folder: Path, script: Path, samples: int) -> tuple[str, list[tuple[int, str]]]:
    """Shards in ``folder`` and the log of ``script`` run on them uninterrupted on 1
    process: 2 epochs, each over every one of the ``samples`` once."""
    pattern = make_shards(folder / "data")
    (folder / "straight").mkdir()
    run(script, str(folder / "straight"), pattern)
    [log] = seen(folder / "straight", 1)
    assert len(log) == 2 * samples and len({key for _, key in log[:samples]}) == samples
    return pattern, log


def seen(run_dir: Path, world: int) -> list[list[tuple[int, str]]]:
    """Each rank's ``(step, key)`` log."""
    logs = []
    for rank in range(world):
        lines = (run_dir / f"seen-rank{rank}.txt").read_text().split("\n")
        logs.append([(int(step), key) for step, key in (ln.split() for ln in lines if ln)])
    return logs


def keep_before(run_dir: Path, world: int, step: int) -> None:
    """Drop the log lines of steps from ``step`` on: work lost by the kill, trained again."""
    for rank, log in enumerate(seen(run_dir, world)):
        kept = "".join(f"{s} {key}\n" for s, key in log if s < step)
        (run_dir / f"seen-rank{rank}.txt").write_text(kept)


def global_order(logs: list[list[tuple[int, str]]], chunk: int = 1) -> list[str]:
    """The keys in the order of the epochs' global positions. Rank r of R takes chunks
    r, r + R, ... of ``chunk`` positions (1 for ResumableSampler's own split, a batch
    for Accelerate's ``BatchSamplerShard``), so the ranks' logs interleave by chunks."""
    assert len({len(log) for log in logs}) == 1, [len(log) for log in logs]
    chunks = [[log[i : i + chunk] for i in range(0, len(log), chunk)] for log in logs]
    return [key for row in zip(*chunks) for part in row for _, key in part]
