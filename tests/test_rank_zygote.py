"""tests/_rank_zygote.py, driven by its protocol: what it forked and still runs when its
driver goes (a pytest worker killed, a test given up on by pytest-timeout) goes too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ZYGOTE = Path(__file__).with_name("_rank_zygote.py")


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_what_still_runs_when_the_driver_goes_is_killed(tmp_path: Path) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\nprint('up', flush=True)\ntime.sleep(600)\n")
    zygote = subprocess.Popen(
        [sys.executable, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    requests = [{"world": 0, "port": 0}, {}]  # a job in a session of its own; a rank
    outs = [tmp_path / f"out{n}" for n in range(len(requests))]
    pids = []
    try:
        for request, out in zip(requests, outs):
            line = {"argv": [str(sleeper)], "out": str(out), "env": dict(os.environ), **request}
            zygote.stdin.write(json.dumps(line).encode() + b"\n")
            zygote.stdin.flush()
            pids.append(json.loads(zygote.stdout.readline())["pid"])
        deadline = time.monotonic() + 60
        while not all(out.exists() and out.read_text() == "up\n" for out in outs):
            assert time.monotonic() < deadline, "the sleepers did not start"
            time.sleep(0.05)
        zygote.stdin.close()
        assert zygote.wait(timeout=30) == 0
        deadline = time.monotonic() + 10
        while any(map(running, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if running(pid)]
    finally:
        for pid in pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        zygote.kill()
        zygote.wait()
        zygote.stdout.close()
