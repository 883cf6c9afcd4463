"""Real torch.distributed jobs for the tests: gloo on 127.0.0.1, each rank a subprocess
running a worker script (tests/_*_ddp_worker.py).

The driver side launches the ranks (forked by tests/_rank_zygote.py, which has imported
torch once for them all), waits for them or kills them (a real SIGKILL) once
each has written ``<phase>-rank<r>.ready``, and reads the batches each logged to
``<phase>-rank<r>.jsonl``. The worker side parses the arguments every rank takes, joins
the process group, and at the end meets the other ranks and writes its ``.ready``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

sys.path.append(str(Path(__file__).resolve().parent.parent / "tools"))
from loopback_servers import free_ports  # noqa: E402

TIMEOUT = 180  # seconds a rank may take, in the tests that wait for one


class IndexDataset(Dataset[int]):
    """A dataset whose samples are their own indices (plus ``start``): what the ranks
    read is the order."""

    def __init__(self, size: int, start: int = 0) -> None:
        self.size, self.start = size, start

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return self.start + index


class Rank:
    """One rank, forked by the zygote (tests/_rank_zygote.py): what the tests use of a
    ``Popen`` (``pid``, ``poll``, ``wait``, ``returncode``)."""

    def __init__(self, pid: int, zygote: _Zygote) -> None:
        self.pid, self._zygote = pid, zygote

    @property
    def returncode(self) -> int | None:
        return self._zygote.codes.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._zygote.ended:
            if not self._zygote.ended.wait_for(lambda: self.pid in self._zygote.codes, timeout):
                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout or 0)
        return self._zygote.codes[self.pid]


# What every rank's zygote imports; a zygote for other processes imports others.
RANK_IMPORTS = (
    "numpy", "torch", "torch.distributed", "torch.utils.data", "indextar",
    "indextar.order.sampler",
)  # fmt: skip


class _Zygote:
    """The test process's zygotes, one for each list of modules imported besides torch's:
    started at its first job, ended with the process."""

    _started: dict[tuple[str, ...], _Zygote] = {}

    def __init__(self, imports: tuple[str, ...]) -> None:
        script = Path(__file__).resolve().parent / "_rank_zygote.py"
        self.process = subprocess.Popen(
            [sys.executable, str(script), *imports],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self.codes: dict[int, int] = {}
        self.ended = threading.Condition()
        self.pids: queue.Queue[int] = queue.Queue()
        self.lock = threading.Lock()
        threading.Thread(target=self._listen, daemon=True).start()

    @classmethod
    def get(cls, imports: tuple[str, ...] = RANK_IMPORTS) -> _Zygote:
        zygote = cls._started.get(imports)
        if zygote is None or zygote.process.poll() is not None:
            zygote = cls._started[imports] = cls(imports)
        return zygote

    def _listen(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            if "pid" in message:
                with self.ended:  # a pid used again: the old rank's code is not the new one's
                    self.codes.pop(message["pid"], None)
                self.pids.put(message["pid"])
            else:
                with self.ended:
                    self.codes[message["exit"]] = message["code"]
                    self.ended.notify_all()

    def fork(self, argv: list[str], out: Path, env: dict[str, str], **job: int | str) -> Rank:
        """Fork a rank running ``argv``; with ``world=`` and ``port=``, a whole job in a
        session of its own; with ``module=``, ``cwd=`` and ``err=``, ``python -m module``
        (see tests/_rank_zygote.py)."""
        request = {"argv": argv, "out": str(out), "env": env, **job}
        assert self.process.stdin is not None
        with self.lock:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            try:
                return Rank(self.pids.get(timeout=TIMEOUT), self)
            except queue.Empty:
                code = self.process.poll()
                raise RuntimeError(f"the rank zygote did not fork: exit {code}") from None


def launch(worker: Path, log_dir: Path, phase: str, world: int, *args: str) -> list[Rank]:
    """Start ``world`` ranks of ``worker``; each one's output goes to ``<phase>-rank<r>.out``."""
    port = free_ports(1)[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    zygote = _Zygote.get()
    ranks = []
    for rank in range(world):
        argv = [
            str(worker), "--rank", str(rank), "--world", str(world), "--port", str(port),
            "--phase", phase, "--log-dir", str(log_dir), *args,
        ]  # fmt: skip
        ranks.append(zygote.fork(argv, log_dir / f"{phase}-rank{rank}.out", env))
    return ranks


def start_job(
    argv: list[str], out: Path, env: dict[str, str], *, world: int, imports: tuple[str, ...]
) -> Rank:
    """A job as torchrun starts one, ``world`` ranks on a free port (``world=0``: one plain
    process), in a session of its own, forked from a zygote that imported torch and
    ``imports``: its leader, whose exit code is torchrun's (0, 1 if a rank failed, or
    ``-9`` if the job's process group was SIGKILLed); the ranks' output goes to ``out``."""
    zygote = _Zygote.get(RANK_IMPORTS + imports)
    return zygote.fork(argv, out, env, world=world, port=free_ports(1)[0])


def run_module(
    module: str, args: list[str], env: dict[str, str], *, imports: tuple[str, ...]
) -> subprocess.CompletedProcess[bytes]:
    """``python -m module *args`` with ``env`` in the current folder, forked from a zygote
    that imported ``imports`` (no torch unless named), as ``subprocess.run`` with
    ``capture_output=True`` returns it."""
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder, "out"), Path(folder, "err")
        process = _Zygote.get(imports).fork(
            args, out, env, module=module, cwd=os.getcwd(), err=str(err)
        )
        code = process.wait(timeout=TIMEOUT)
        return subprocess.CompletedProcess(
            [module, *args], code, out.read_bytes(), err.read_bytes()
        )


def wait_all(processes: list[Rank], log_dir: Path, phase: str) -> None:
    """Every rank exits 0 (else the failing rank's output is the assertion's message)."""
    for rank, process in enumerate(processes):
        code = process.wait(timeout=TIMEOUT)
        assert code == 0, (log_dir / f"{phase}-rank{rank}.out").read_text()


def crash_after_ready(processes: list[Rank], log_dir: Path, phase: str) -> None:
    """SIGKILL every rank once all have written their ``.ready`` file."""
    deadline = time.monotonic() + TIMEOUT
    for rank, process in enumerate(processes):
        while not (log_dir / f"{phase}-rank{rank}.ready").exists():
            assert process.poll() is None, (log_dir / f"{phase}-rank{rank}.out").read_text()
            assert time.monotonic() < deadline, f"rank {rank} never reached its checkpoint"
            time.sleep(0.1)
    for process in processes:
        os.kill(process.pid, signal.SIGKILL)
    for process in processes:
        assert process.wait(timeout=30) == -signal.SIGKILL


def logged(log_dir: Path, phase: str, rank: int) -> list[Any]:
    """What rank ``rank`` logged in ``phase``: one JSON value a batch."""
    lines = (log_dir / f"{phase}-rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


# -- the worker's side ----------------------------------------------------------------


def rank_arguments(*numbers: str) -> argparse.ArgumentParser:
    """The arguments every rank takes (``--rank``, ``--world``, ``--port``, ``--phase``,
    ``--log-dir``, ``--resume``) and the required ints ``numbers``."""
    parser = argparse.ArgumentParser()
    for name in ("rank", "world", "port", *numbers):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--phase", required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    return parser


def join(args: argparse.Namespace) -> None:
    """Join the gloo group the driver started (one torch thread: 2 cores, many ranks)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=120),
    )


def finish(args: argparse.Namespace, steps: int, *, crash: bool) -> None:
    """Meet every rank (no hang), write ``<phase>-rank<r>.ready`` with ``steps``; then wait
    for the driver's SIGKILL if ``crash``, else leave the group."""
    import torch
    import torch.distributed as dist

    counts = torch.tensor([steps])
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    (args.log_dir / f"{args.phase}-rank{args.rank}.ready").write_text(str(steps))
    while crash:
        time.sleep(1)
    dist.destroy_process_group()
