"""What the kernel counts for this process, from ``/proc/self`` and ``times(2)`` (Linux)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "bytes_read",
    "cpu_seconds",
    "mapping_of",
    "own_and_children_cpu",
    "process_tree_cpu",
    "rate_and_cpu",
    "rss_bytes",
    "thread_cpu_seconds",
]


def bytes_read() -> int:
    """Bytes this process has read through read/pread so far (the kernel's ``rchar``)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children once reaped
    (DataLoader workers after their loader shuts them down, ``pipe:`` commands after
    they exit); children still running, such as servers, are not counted yet."""
    return sum(own_and_children_cpu())


def own_and_children_cpu() -> tuple[float, float]:
    """:func:`cpu_seconds` apart: this process's, and its reaped children's (DataLoader
    workers once their loader shut them down)."""
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


def mapping_of(address: int) -> str:
    """The path of this process's mapping that holds ``address`` (``/proc/self/maps``;
    ``""`` for an anonymous one): shared memory is ``/dev/shm/...``."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, stop = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < stop:
                return fields[5].strip() if len(fields) > 5 else ""
    raise LookupError(f"no mapping of this process holds {address:#x}")


def process_tree_cpu(pid: int) -> float:
    """User and system CPU seconds so far of the running process ``pid`` and of its
    running descendants (a server and its workers), from ``/proc/<pid>/stat``."""
    total, todo = 0.0, [pid]
    while todo:
        one = todo.pop()
        try:
            total += _stat_cpu(Path(f"/proc/{one}/stat"))
            for task in Path(f"/proc/{one}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # it ended meanwhile
            continue
    return total


def thread_cpu_seconds() -> dict[int, float]:
    """User and system CPU seconds so far of each running thread of this process, by
    native thread id (``/proc/self/task/<tid>/stat``)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            out[int(task.name)] = _stat_cpu(task / "stat")
        except OSError:  # it ended meanwhile
            continue
    return out


def _stat_cpu(stat: Path) -> float:
    """utime + stime of a ``/proc/.../stat`` file, in seconds."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of the process ``pid`` (default: this one), in bytes
    (``VmRSS`` of ``/proc/<pid>/status``)."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(kib) * 1024


def rate_and_cpu(read: Callable[[], tuple[float, int]]) -> tuple[float, float, float]:
    """Run ``read`` (a pass of a loader: what it read, and in how many batches) and give
    what it read a second, and the CPU ms a batch of this process and of its reaped
    children (the pass's DataLoader workers, once it has shut them down)."""
    start, (own, children) = time.perf_counter(), own_and_children_cpu()
    amount, batches = read()
    wall = time.perf_counter() - start
    own_after, children_after = own_and_children_cpu()
    per_batch = 1e3 / max(batches, 1)
    return amount / wall, (own_after - own) * per_batch, (children_after - children) * per_batch
