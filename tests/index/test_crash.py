"""Crash safety: ``indextar index`` killed with SIGKILL at random points.

After every kill the shard has no index, or one that :func:`open_index` accepts and
:func:`verify_index` confirms: never one that opens and is wrong. A killed build may
leave its temporary file (``.<index name>.<random>.tmp``), which nothing takes for
an index (the next build removes it: tests/test_atomic.py), and its lock file
(``.<index name>.lock``, unlocked by the kernel; the next writer removes it).

The CLI's import time would dominate the run, so a server process imports
``indextar.cli.commands`` once and forks a child per run that calls the CLI's ``main`` (as
``indextar index --force SHARD``); the test kills that child by its pid.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from conftest import sample_members, tar_bytes

from indextar import build_index, open_index
from indextar.index.shard import INDEX_SUFFIX
from indextar.index.verify import verify_index

# INDEXTAR_CRASH_KILLS / INDEXTAR_CRASH_SEED run longer or other series (docs/reliability.md).
KILLS = int(os.environ.get("INDEXTAR_CRASH_KILLS", "50"))
SEED = int(os.environ.get("INDEXTAR_CRASH_SEED", "7"))
# For each line (a shard path) forks a child running `indextar index --force SHARD` and
# prints its pid; on the next line ("reap") prints the child's wait status. A child is
# reaped only after the test has killed it, so its pid cannot be reused by then.
SERVER = """
import contextlib, io, os, sys
from indextar.cli.commands import main
with contextlib.redirect_stdout(io.StringIO()):  # warm up: lazy imports happen once, here
    main(["index", "--force", sys.argv[1]])
print("ready", flush=True)
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        sys.stdin.close()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os._exit(main(["index", "--force", line.strip()]))
    print(pid, flush=True)
    sys.stdin.readline()
    print(os.waitpid(pid, 0)[1], flush=True)
"""


class Server:
    def __init__(self, shard: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(shard)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "ready\n"

    def start(self, shard: Path) -> int:
        """Start a build of ``shard``; returns the child's pid."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{shard}\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def status(self) -> int:
        """Wait for the last child; its wait status."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("reap\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()


def state_after_kill(shard: Path) -> str:
    """What a kill left: ``none``, ``temp file``, ``index`` (checked valid), or both."""
    index = shard.with_name(shard.name + INDEX_SUFFIX)
    temps = sorted(p.name for p in shard.parent.glob(f".{index.name}.*.tmp"))
    lock = index.with_name(f".{index.name}.lock")
    stray = [
        p.name
        for p in shard.parent.iterdir()
        if p not in (shard, index, lock) and p.name not in temps
    ]
    assert not stray, f"unexpected files after a kill: {stray}"
    assert not any(Path(name).match(f"*{INDEX_SUFFIX}") for name in temps)
    if index.exists():
        opened = open_index(shard)  # raises if the file is not a complete, fresh index
        report = verify_index(shard)
        assert report.ok, report.problems
        assert len(opened) == report.samples
    if index.exists():
        return "index + temp file" if temps else "index"
    return "temp file only" if temps else "nothing"


def test_sigkill_at_random_points_never_leaves_a_wrong_index(tmp_path: Path) -> None:
    shard = tmp_path / "victim.tar"
    shard.write_bytes(tar_bytes(sample_members(3000, ("jpg", "cls"))))
    index = shard.with_name(shard.name + INDEX_SUFFIX)
    rng = random.Random(SEED)
    server = Server(shard)
    try:
        # Runs to the end measure how long a build takes.
        timings = []
        for _ in range(3):
            started = time.perf_counter()
            server.start(shard)
            assert server.status() == 0
            timings.append(time.perf_counter() - started)
        build_seconds = min(timings)
        open_index(shard)

        landed: Counter[str] = Counter()
        for kill in range(KILLS):
            # Half the runs replace a valid index (--force), half build from nothing.
            if kill % 2:
                index.unlink(missing_ok=True)
            elif not index.exists():
                build_index(shard)
            delay = rng.uniform(0, 1.2 * build_seconds)
            started = time.perf_counter()
            pid = server.start(shard)
            time.sleep(max(0.0, delay - (time.perf_counter() - started)))
            os.kill(pid, signal.SIGKILL)  # running, or a zombie until reaped
            status = server.status()
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            landed[f"{'killed' if killed else 'finished'}: {state_after_kill(shard)}"] += 1
            for temp in tmp_path.glob(".*.tmp"):
                temp.unlink()
        build_index(shard, force=True)  # takes the lock a killed build may have left
        assert sorted(p.name for p in tmp_path.iterdir()) == [shard.name, index.name]
    finally:
        server.close()
    print(f"build {build_seconds * 1000:.0f} ms; where {KILLS} kills landed: {dict(landed)}")
    assert sum(landed.values()) == KILLS
    # The kills must hit the write itself, not only the scan before it or the end (about
    # a quarter do; a busy machine skews the timing, so only one is required).
    assert landed["killed: temp file only"] + landed["killed: index + temp file"] >= 1, landed
