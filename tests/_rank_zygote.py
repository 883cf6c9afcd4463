"""Forks the ranks of tests/ddpjob.py's jobs from one interpreter that has imported
torch, torch.distributed and indextar once (the modules named on its command line).

A fresh interpreter spends 2-3 s of CPU on those imports, and the suite's DDP tests
start some 30 ranks. Each rank is still a process of its own, running its worker
script from the top as ``__main__`` with its own arguments, environment and output
file, and ending through the interpreter's usual exit (atexit handlers included);
only the imports, done before any thread exists, are shared.

Protocol, one JSON object a line: in ``{"argv": [script, *args], "out": file,
"env": {...}}``; out ``{"pid": n}`` for each request, then ``{"exit": pid, "code": c}``
when that rank ends (``c`` as ``Popen.returncode``: ``-9`` for a SIGKILL). The zygote
ends when its input closes, and SIGKILLs first what it forked that still runs.

A request with ``"world": n`` (and ``"port"``) is a whole job as torchrun would start
it (tests/train/trainruns.py): the forked child leads a session of its own (a
``killpg`` ends the job, not the zygote) and forks ``n`` ranks with torchrun's
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_PORT``, ...), all writing to ``out``;
it exits 0 when every rank did, else 1 as torchrun does. ``"world": 0`` is one plain
process in a session of its own. Modules named on the command line are imported
too (``accelerate``, ``torch._dynamo``: 2 s of CPU a rank).

A request with ``"module"`` instead of a script in ``argv`` runs it as ``python -m``
does, in ``"cwd"``, its standard error to ``"err"`` if given (tests/cli: the CLI
without an interpreter's start, 1 s of CPU a call).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import sys
import traceback
from typing import Any


def run_rank(request: dict[str, Any], *, append: bool = False) -> int:
    """In the forked child: become the rank and run its script; its exit status."""
    os.environ.clear()
    os.environ.update(request["env"])
    mode = os.O_APPEND if append else os.O_TRUNC
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | mode, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    err = (
        os.open(request["err"], os.O_WRONLY | os.O_CREAT | mode, 0o644) if "err" in request else out
    )
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    try:
        if "module" in request:
            os.chdir(request["cwd"])
            sys.argv = [request["module"], *request["argv"]]
            sys.path[0] = request["cwd"]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(request["argv"][0])
            sys.argv = list(request["argv"])
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def run_job(request: dict[str, Any]) -> int:
    """In the forked child: a session of its own, then ``world`` ranks forked from it
    with the environment torchrun gives its workers; 1 if any rank failed."""
    os.setsid()
    world = request["world"]
    if world == 0:
        return run_rank(request)
    os.close(os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    ranks = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            env = {
                **request["env"],
                "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
                "ROLE_RANK": str(rank), "WORLD_SIZE": str(world),
                "LOCAL_WORLD_SIZE": str(world), "ROLE_WORLD_SIZE": str(world),
                "GROUP_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(request["port"]), "TORCHELASTIC_RUN_ID": "none",
            }  # fmt: skip
            sys.exit(run_rank({**request, "env": env}, append=True))
        ranks.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in ranks]
    return 0 if not any(codes) else 1


def main() -> None:
    for name in sys.argv[1:]:
        importlib.import_module(name)

    def send(message: dict[str, int]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    children: dict[int, bool] = {}  # pid -> whether it leads a job's session
    pending = b""
    while True:
        if select.select([0], [], [], 0.05)[0]:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                end(children)  # the driver is gone
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    run = run_job if "world" in request else run_rank
                    sys.exit(run(request))  # the interpreter's own exit
                children[pid] = "world" in request
                send({"pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del children[pid]
                send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def end(children: dict[int, bool]) -> None:
    """SIGKILL what still runs of what the driver started (a job: its whole session):
    a driver killed, or a test given up on by pytest-timeout, leaves no rank behind."""
    for pid, job in children.items():
        if job:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)  # also a job's leader not yet in a session of its own
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
