"""Crash safety of every rewrite: SIGKILL at random moments, then check and re-run.

Each scenario (``tools/crash_scenarios.py``) puts an old state in place, starts its
rewrite in a child process, kills it with SIGKILL after a random delay (up to 1.2x the
time a whole run takes), and checks what is left: every file the old one or the new
one (byte for byte, or an index that opens and holds one of the two states), no other
file but the writer's hidden temporary and lock files, no half-written file that
opens. Then it runs the rewrite again, to the end, and checks that it succeeded and
left the new state. The scenarios:

``import``      ``indextar meta import`` of a parquet table into 4 indexes
``recompress``  ``indextar recompress`` of a plain tar into a ``.tar.zst`` (and its index)
``append``      ``indextar index --manifest M --append`` of 20 shards to a 40-shard manifest
``cache``       a ``remote="cache"`` read that fills the shard cache over HTTP (a real
                aiohttp server on 127.0.0.1), its limit 1.5 shards

The rewrites' import time would dominate, so a server process imports them once and
forks a child per run (as tests/index/test_crash.py does for builds).

Long form: ``python tools/crash_storm.py --kills 25`` (every scenario; ``--only NAME``);
the suite runs a few kills each (tests/test_crash_rewrites.py). docs/reliability.md
records the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crash_scenarios import SCENARIOS, Scenario  # noqa: E402

__all__ = ["Forker", "storm", "main"]

# Reads "NAME FOLDER" lines: forks a child running that scenario's rewrite in FOLDER and
# prints its pid; on the next line ("reap") prints the child's wait status. A child is
# reaped only after it was killed (or finished), so its pid cannot be reused by then.
_SERVER = """
import os, sys
sys.path.insert(0, sys.argv[1])
from crash_scenarios import run_action, warm_up
warm_up()
print("ready", flush=True)
for line in sys.stdin:
    name, folder = line.split(" ", 1)
    pid = os.fork()
    if pid == 0:
        sys.stdin.close()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        log = os.path.join(folder.strip(), "..", "child.log")  # its errors, for the report
        os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), 2)
        os._exit(run_action(name, folder.strip()))
    print(pid, flush=True)
    sys.stdin.readline()
    print(os.waitpid(pid, 0)[1], flush=True)
"""


class Forker:
    """The server process that forks one child per rewrite."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(Path(__file__).resolve().parent)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        ready = self.process.stdout.readline()
        assert ready == "ready\n", f"the crash server did not start: {ready!r}"

    def start(self, name: str, folder: Path) -> int:
        """Start ``name``'s rewrite in ``folder``; returns the child's pid."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{name} {folder}\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def status(self) -> int:
        """Wait for the last child; its wait status."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("reap\n")
        self.process.stdin.flush()
        return int(self.process.stdout.readline())

    def run(self, name: str, folder: Path) -> float:
        """Run ``name``'s rewrite to the end; its seconds. Raises if it failed."""
        started = time.perf_counter()
        self.start(name, folder)
        status = self.status()
        if status != 0:
            raise AssertionError(
                f"{name}: a run to the end failed (wait status {status}; see child.log "
                f"beside {folder})"
            )
        return time.perf_counter() - started

    def close(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)
        self.process.stdout.close()


def storm(
    scenario: Scenario, forker: Forker, *, kills: int, seed: int, timing_runs: int = 3
) -> dict[str, object]:
    """``kills`` SIGKILLs of ``scenario``'s rewrite, each checked and re-run; the counts.

    Two kills in three come after a random delay, the third once the rewrite's
    temporary file (or download) appears: at once, or after a random part of the rest.

    Raises ``AssertionError`` on the first state that is neither old nor new, a stray
    file, or a re-run that fails or leaves other than the new state.
    """
    rng = random.Random(seed)

    def run(name: str) -> float:
        return forker.run(name, scenario.folder)

    timings = []
    for _ in range(timing_runs):
        scenario.reset(0, run)
        timings.append(run(scenario.name))
        scenario.check(expect="new")
    seconds = min(timings)
    landed: Counter[str] = Counter()
    for kill in range(kills):
        scenario.reset(kill, run)
        delay = rng.uniform(0, 1.2 * seconds)
        started = time.perf_counter()
        pid = forker.start(scenario.name, scenario.folder)
        if kill % 3 == 2:  # while the write runs: from when a temporary file appeared
            while not scenario.writing() and time.perf_counter() - started < 2 * seconds:
                time.sleep(0.0005)
            left = seconds - (time.perf_counter() - started)
            time.sleep(rng.uniform(0, max(0.0, left)) if kill % 2 else 0)
        else:
            time.sleep(max(0.0, delay - (time.perf_counter() - started)))
        os.kill(pid, signal.SIGKILL)  # running, or a zombie until reaped
        status = forker.status()
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if not killed and status != 0:
            raise AssertionError(f"{scenario.name}: a run failed before its kill ({status})")
        landed[f"{'killed' if killed else 'finished'}: {scenario.check()}"] += 1
        run(scenario.name)  # the re-run succeeds ...
        scenario.check(expect="new")  # ... and leaves the new state
        scenario.remove_temps()
    return {"scenario": scenario.name, "kills": kills, "run_ms": round(seconds * 1000), **landed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=25, help="kills per scenario")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args(argv)
    forker = Forker()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for name in args.only or list(SCENARIOS):
                with SCENARIOS[name](Path(scratch) / name) as scenario:
                    counts = storm(scenario, forker, kills=args.kills, seed=args.seed)
                print(json.dumps(counts), flush=True)
    finally:
        forker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
