"""What the kernel counts for this process, from ``/proc/self`` and ``times(2)`` (Linux)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["bytes_read", "cpu_seconds", "rss_bytes"]


def bytes_read() -> int:
    """Bytes this process has read through read/pread so far (the kernel's ``rchar``)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children once reaped
    (DataLoader workers after their loader shuts them down, ``pipe:`` commands after
    they exit); children still running, such as servers, are not counted yet."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of the process ``pid`` (default: this one), in bytes
    (``VmRSS`` of ``/proc/<pid>/status``)."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    kib = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(kib) * 1024
