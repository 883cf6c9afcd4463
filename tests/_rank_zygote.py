"""Forks the ranks of tests/ddpjob.py's jobs from one interpreter that has imported
torch, torch.distributed and indextar once.

A fresh interpreter spends 2-3 s of CPU on those imports, and the suite's DDP tests
start some 30 ranks. Each rank is still a process of its own, running its worker
script from the top as ``__main__`` with its own arguments, environment and output
file, and ending through the interpreter's usual exit (atexit handlers included);
only the imports, done before any thread exists, are shared.

Protocol, one JSON object a line: in ``{"argv": [script, *args], "out": file,
"env": {...}}``; out ``{"pid": n}`` for each request, then ``{"exit": pid, "code": c}``
when that rank ends (``c`` as ``Popen.returncode``: ``-9`` for a SIGKILL). The zygote
ends when its input closes.
"""

from __future__ import annotations

import json
import os
import runpy
import select
import sys
import traceback
from typing import Any

import numpy  # noqa: F401
import torch  # noqa: F401
import torch.distributed  # noqa: F401
import torch.utils.data  # noqa: F401

import indextar  # noqa: F401
import indextar.order.sampler  # noqa: F401


def run_rank(request: dict[str, Any]) -> int:
    """In the forked child: become the rank and run its script; its exit status."""
    os.environ.clear()
    os.environ.update(request["env"])
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    try:
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


def main() -> None:
    def send(message: dict[str, int]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    children: set[int] = set()
    pending = b""
    while True:
        if select.select([0], [], [], 0.05)[0]:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return  # the driver is gone
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    sys.exit(run_rank(json.loads(line)))  # the interpreter's own exit
                children.add(pid)
                send({"pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
