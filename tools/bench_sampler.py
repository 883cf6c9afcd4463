"""Benchmark ResumableSampler against torch's DistributedSampler.

Run ``python tools/bench_sampler.py``. Prints a Markdown table: start-up time (build the
sampler and draw the first index), peak memory of that start-up, indices per second,
and resume time at 90% of an epoch. Each measurement runs in a fresh subprocess so that
peak RSS is its own.

Targets (issue 4): start-up under 10 ms and under 50 MB at every N, and at least 10M
indices/s.
"""

from __future__ import annotations

import itertools
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

SIZES = (10**6, 10**8, 10**10)
RESUME_SIZE = 10**9
MEMORY_LIMIT = 4 * 2**30
# DistributedSampler holds randperm(N) (8 bytes each) and then a list of N Python ints
# (an 8-byte pointer plus a 28-byte int object each).
DISTRIBUTED_BYTES_PER_SAMPLE = 8 + 8 + 28
ITERATED = 5_000_000


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _measure(kind: str, size: int) -> dict[str, Any]:
    """Run one measurement in this process; called in a fresh subprocess."""
    import torch  # noqa: F401  (imported before the baseline, for both kinds)
    from torch.utils.data import DistributedSampler

    from indextar.order.sampler import ResumableSampler

    class Sized:
        def __len__(self) -> int:
            return size

    baseline = _rss_bytes()
    started = time.perf_counter()
    sampler: Any
    if kind == "distributed":
        sampler = DistributedSampler(Sized(), num_replicas=8, rank=3, shuffle=True, seed=0)
    elif kind == "blocks":
        sampler = ResumableSampler(size, num_replicas=8, rank=3, order="blocks")
    else:
        sampler = ResumableSampler(size, num_replicas=8, rank=3)
    iterator = iter(sampler)
    next(iterator)
    startup = time.perf_counter() - started
    result: dict[str, Any] = {
        "startup_s": startup,
        "memory_bytes": max(_peak_rss_bytes() - baseline, 0),
    }
    count = min(ITERATED, len(sampler) - 1)
    started = time.perf_counter()
    for _ in itertools.islice(iterator, count):
        pass
    result["iterate_per_s"] = count / (time.perf_counter() - started)
    if kind == "global":
        started = time.perf_counter()
        sampler.indices(size // 2, size // 2 + ITERATED)
        result["numpy_per_s"] = ITERATED / (time.perf_counter() - started)
    return result


def _measure_resume(size: int) -> float:
    from indextar.order.sampler import ResumableSampler

    sampler = ResumableSampler(size, num_replicas=8, rank=3)
    started = time.perf_counter()
    sampler.load_state_dict({"epoch": 0, "consumed": size * 9 // 10})
    next(iter(sampler))
    return time.perf_counter() - started


def _in_subprocess(*args: str) -> Any:
    output = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def run(report: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Measure every row and report a Markdown table, one line at a time."""
    rows: list[dict[str, Any]] = []
    for size, kind in itertools.product(SIZES, ("global", "blocks", "distributed")):
        row: dict[str, Any] = {"size": size, "kind": kind}
        if kind == "distributed" and size * DISTRIBUTED_BYTES_PER_SAMPLE > MEMORY_LIMIT:
            row["skipped"] = (
                f"needs ~{size * DISTRIBUTED_BYTES_PER_SAMPLE / 2**30:,.0f} GiB "
                f"(randperm + list of ints) > 4 GiB"
            )
        else:
            row.update(_in_subprocess("--one", kind, str(size)))
        rows.append(row)
    resume = min(_in_subprocess("--resume", str(RESUME_SIZE)) for _ in range(3))
    _report_table(rows, resume, report)
    return rows


def _report_table(rows: list[dict[str, Any]], resume: float, report: Callable[[str], None]) -> None:
    names = {
        "global": "ResumableSampler (global)",
        "blocks": "ResumableSampler (blocks, 1024)",
        "distributed": "DistributedSampler",
    }
    report(
        "| N | sampler | start-up | start-up memory | indices/s (iterating) "
        "| indices/s (numpy) | start-up vs DistributedSampler |"
    )
    report("|---|---|---|---|---|---|---|")
    for row in rows:
        label = f"| {row['size']:.0e} | {names[row['kind']]} |"
        if "skipped" in row:
            report(f"{label} skipped: {row['skipped']} | | | | |")
            continue
        reference = next(
            (r for r in rows if r["size"] == row["size"] and r["kind"] == "distributed"
             and "startup_s" in r), None
        )  # fmt: skip
        ratio = (
            f"{reference['startup_s'] / row['startup_s']:,.0f}x faster"
            if reference is not None and row["kind"] != "distributed"
            else "—"
        )
        numpy_rate = f"{row['numpy_per_s'] / 1e6:.1f}M" if "numpy_per_s" in row else "—"
        report(
            f"{label} {row['startup_s'] * 1e3:.2f} ms | {row['memory_bytes'] / 2**20:.1f} MB "
            f"| {row['iterate_per_s'] / 1e6:.1f}M | {numpy_rate} | {ratio} |"
        )
    report("")
    report(
        f"Resume at 90% of a {RESUME_SIZE:.0e}-sample epoch (load_state_dict + first index, "
        f"8 ranks): {resume * 1e3:.2f} ms. DistributedSampler cannot resume mid-epoch; "
        f"skipping ahead means building randperm({RESUME_SIZE:.0e}) (> 4 GiB as a list): skipped."
    )


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(_measure(argv[1], int(argv[2]))))
    elif argv[:1] == ["--resume"]:
        print(json.dumps(_measure_resume(int(argv[1]))))
    else:
        run()


if __name__ == "__main__":
    main(sys.argv[1:])
