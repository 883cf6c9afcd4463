"""The worker processes of ``tools/fuzz.py``: cases handed out one at a time, a time
budget kept to the case, and a watchdog that kills a case stuck where no signal reaches.

Why not ``multiprocessing.Pool.imap``: its task thread pulls the task generator ahead
into the workers' pipe, as far as the pipe takes it (some 400 chunks of 25 cases), so a
generator that stops yielding at the deadline has by then queued minutes of cases for
the slower targets; a 3 s ``ztables`` run ran past 60 s, and the 10-minute runs of
``ztables`` and ``parquet`` did not return. A worker killed by a crash in C (or by the
kernel) loses its task, and ``imap`` then waits for it for ever; a case stuck in C
never sees its ``SIGALRM``. Here the parent hands each worker one case number at a
time, stops handing out at the deadline, and gives the cases still running a short
grace before cutting them off (they are not counted). A case that has not answered
after ``hang_after`` seconds, or whose worker dies, is a finding named by its number.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["Lost", "run_cases"]


@dataclass(frozen=True, slots=True)
class Lost:
    """A case that never answered: it hung past the watchdog, or its worker died."""

    number: int
    kind: str  # "hang" or "crash"
    why: str


def _serve(
    conn: Connection,
    work: Callable[[int], Any],
    init: Callable[..., None] | None,
    args: tuple[Any, ...],
) -> None:
    if init is not None:
        init(*args)
    conn.send(None)  # ready: the start-up is not counted against a case
    while (number := conn.recv()) is not None:
        conn.send((number, work(number)))


@dataclass(slots=True)
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False
    number: int | None = None
    started: float = 0.0
    served: int = 0

    def kill(self) -> None:
        self.process.kill()
        self.process.join()
        self.conn.close()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else -code
        return f"worker killed by {name}"
    return f"worker exited with status {code}"


def run_cases(
    work: Callable[[int], Any],
    on_result: Callable[[int, Any], None],
    *,
    cases: int | None,
    seconds: float | None,
    jobs: int,
    hang_after: float,
    initializer: Callable[..., None] | None = None,
    initargs: tuple[Any, ...] = (),
    cases_per_worker: int = 1000,
    grace: float = 2.0,
) -> tuple[int, list[Lost]]:
    """Run ``work(0)``, ``work(1)``, ... in ``jobs`` processes until ``cases`` are done or
    ``seconds`` pass; ``on_result(number, result)`` sees each answer as it comes.

    Returns the number of cases answered and the cases lost. A case still running at
    the deadline has ``grace`` seconds more, then is cut off uncounted. Each worker is
    replaced after ``cases_per_worker`` cases, so that no leak builds up over a run.
    """
    ctx: Any = multiprocessing.get_context("forkserver" if sys.platform != "win32" else "spawn")
    deadline = time.monotonic() + seconds if seconds is not None else float("inf")
    workers: list[_Worker] = []
    lost: list[Lost] = []
    answered = next_number = 0

    def start() -> _Worker:
        ours, theirs = ctx.Pipe()
        process = ctx.Process(
            target=_serve, args=(theirs, work, initializer, initargs), daemon=True
        )
        process.start()
        theirs.close()
        return _Worker(process, ours)

    def more() -> bool:
        return (cases is None or next_number < cases) and time.monotonic() < deadline

    def replace(worker: _Worker, kind: str = "", why: str = "") -> None:
        if kind and worker.number is not None:
            lost.append(Lost(worker.number, kind, why))
        worker.kill()
        workers[workers.index(worker)] = start()

    try:
        workers.extend(start() for _ in range(max(1, jobs)))
        while True:
            for worker in workers:
                if worker.ready and worker.number is None and more():
                    worker.number, worker.started = next_number, time.monotonic()
                    worker.conn.send(next_number)
                    next_number += 1
            busy = [w for w in workers if w.number is not None]
            now = time.monotonic()
            if not busy and not more():
                break
            if busy and now > deadline + grace:
                break  # cut off: the cases still running are not counted
            wait([w.conn for w in workers] + [w.process.sentinel for w in workers], 0.2)
            for worker in list(workers):
                try:
                    while worker.conn.poll():
                        message = worker.conn.recv()
                        if message is None:
                            worker.ready = True
                            continue
                        number, result = message
                        on_result(number, result)
                        answered += 1
                        worker.number, worker.served = None, worker.served + 1
                except (EOFError, OSError):
                    pass  # it died: its sentinel says so below
                if not worker.process.is_alive():
                    if not worker.ready:  # its start-up failed: so would the next one's
                        why = _exit_reason(worker.process.exitcode)
                        raise RuntimeError(f"a fuzz worker failed to start: {why}")
                    replace(worker, "crash", _exit_reason(worker.process.exitcode))
                elif worker.number is not None and time.monotonic() - worker.started > hang_after:
                    replace(worker, "hang", f"hang: no answer after {hang_after:g} s (killed)")
                elif worker.number is None and worker.served >= cases_per_worker:
                    replace(worker)
    finally:
        for worker in workers:
            worker.kill()
    return answered, lost
