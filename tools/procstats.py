"""What the kernel counts for this process, from ``/proc/self`` (Linux only)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["bytes_read"]


def bytes_read() -> int:
    """Bytes this process has read through read/pread so far (the kernel's ``rchar``)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])
