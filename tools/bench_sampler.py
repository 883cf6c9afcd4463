"""Benchmark ResumableSampler against torch's DistributedSampler.

Run ``python tools/bench_sampler.py``. Prints a Markdown table: start-up time (build the
sampler and draw the first index), peak memory of that start-up, indices per second,
and resume time at 90% of an epoch. Each measurement runs in a fresh subprocess so that
peak RSS is its own.

Targets (issue 4): start-up under 10 ms and under 50 MB at every N, and at least 10M
indices/s.

Mixtures (issue 14): ``weights=`` over 100 parts, 1e10 draws an epoch: start-up, indices/s
(iterating and numpy) and resume at 90%, targets under 10 ms, 10M/s and 10 ms; and a
DataLoader reading a blend of two datasets against one dataset of the same shards,
target within 5%. ``python tools/bench_sampler.py --mixture`` runs these rows alone.
"""

from __future__ import annotations

import itertools
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import interleaved, timed

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


MIXTURE_SIZE, MIXTURE_PARTS, MIXTURE_ITERATED = 10**10, 100, 2_000_000
BLEND_MEMBER_BYTES = (1024, 65536)


class _Parts:
    """The shape of a mixture of ``parts`` equal parts of ``size`` samples in all."""

    def __init__(self, size: int, parts: int) -> None:
        self.cumulative_sizes = [size // parts * (p + 1) for p in range(parts)]
        self.datasets = [range(size // parts)] * parts

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]


def _measure_mixture() -> dict[str, float]:
    """Start-up, indices/s and resume of a 100-part mixture; in a fresh subprocess."""
    from indextar.order.sampler import ResumableSampler

    parts = _Parts(MIXTURE_SIZE, MIXTURE_PARTS)
    weights = list(range(1, MIXTURE_PARTS + 1))  # unequal: every part its own share

    def make() -> ResumableSampler:
        return ResumableSampler(
            parts, weights=weights, epoch_length=MIXTURE_SIZE, num_replicas=8, rank=3
        )

    started = time.perf_counter()
    sampler = make()
    iterator = iter(sampler)
    next(iterator)
    result = {"startup_s": time.perf_counter() - started}
    started = time.perf_counter()
    for _ in itertools.islice(iterator, MIXTURE_ITERATED):
        pass
    result["iterate_per_s"] = MIXTURE_ITERATED / (time.perf_counter() - started)
    started = time.perf_counter()
    sampler.indices(MIXTURE_SIZE // 2, MIXTURE_SIZE // 2 + ITERATED)
    result["numpy_per_s"] = ITERATED / (time.perf_counter() - started)
    resumed = make()
    started = time.perf_counter()
    resumed.load_state_dict({"epoch": 3, "consumed": MIXTURE_SIZE * 9 // 10})
    next(iter(resumed))
    result["resume_s"] = time.perf_counter() - started
    return result


def _blend_vs_single(
    member_bytes: int, rounds: int = 5, samples: int = 20_000
) -> dict[str, list[float]]:
    """Samples/s of a DataLoader (no workers) over one dataset of 4 shards and over a
    50/50 blend of two datasets of 2 shards each (the same shards), interleaved,
    ``rounds`` times; each sample a 4-byte ``cls`` and a ``bin`` of ``member_bytes``."""
    import io
    import tarfile

    from torch.utils.data import DataLoader

    import indextar

    with tempfile.TemporaryDirectory() as folder:
        shards = []
        for shard in range(4):
            path = Path(folder) / f"data-{shard}.tar"
            with tarfile.open(path, "w") as tf:
                for i in range(samples // 4):
                    for ext, size in (("cls", 4), ("bin", member_bytes)):
                        info = tarfile.TarInfo(f"s{shard}-{i:06d}.{ext}")
                        info.size = size
                        tf.addfile(info, io.BytesIO(bytes(size)))
            shards.append(str(path))
        single = indextar.IndexedTarDataset(shards)
        blend = indextar.MixtureDataset(
            {
                "a": indextar.IndexedTarDataset(shards[:2]),
                "b": indextar.IndexedTarDataset(shards[2:]),
            }
        )
        loaders = {
            "single": DataLoader(
                single,
                batch_size=256,
                collate_fn=list,
                sampler=indextar.ResumableSampler(single, seed=0),
            ),
            "blend": DataLoader(
                blend,
                batch_size=256,
                collate_fn=list,
                sampler=indextar.ResumableSampler(blend, weights={"a": 0.5, "b": 0.5}, seed=0),
            ),
        }

        def rate(loader: DataLoader[Any]) -> Callable[[], float]:
            def case() -> float:
                seconds, count = timed(lambda: sum(len(batch) for batch in loader))
                return count / seconds

            return case

        return interleaved({name: rate(loader) for name, loader in loaders.items()}, rounds)


def run_mixture(report: Callable[[str], None] = print) -> dict[str, Any]:
    """The mixture rows: each sampler figure best of 3 fresh processes, the blend best of 5."""
    runs = [_in_subprocess("--mixture-one") for _ in range(3)]
    best = {
        "startup_s": min(r["startup_s"] for r in runs),
        "iterate_per_s": max(r["iterate_per_s"] for r in runs),
        "numpy_per_s": max(r["numpy_per_s"] for r in runs),
        "resume_s": min(r["resume_s"] for r in runs),
    }
    blends = {size: _in_subprocess("--blend", str(size)) for size in BLEND_MEMBER_BYTES}
    report(
        f"Mixture of {MIXTURE_PARTS} parts, {MIXTURE_SIZE:.0e} draws an epoch, 8 ranks "
        f"(best of 3 processes; ranges in brackets):"
    )
    report("")
    report("| measure | result | range | target |")
    report("|---|---|---|---|")
    resume = "resume at 90% (load_state_dict + first index)"
    rows = [
        ("start-up (build + first index)", "startup_s", 1e3, "ms", "< 10 ms"),
        ("indices/s (iterating)", "iterate_per_s", 1e-6, "M", ">= 10M"),
        ("indices/s (numpy)", "numpy_per_s", 1e-6, "M", "—"),
        (resume, "resume_s", 1e3, "ms", "< 10 ms"),
    ]
    for label, key, scale, unit, target in rows:
        values = [r[key] * scale for r in runs]
        value = best[key] * scale
        report(
            f"| {label} | {value:.2f} {unit} | {min(values):.2f}–{max(values):.2f} {unit} "
            f"| {target} |"
        )
    for size, blend in blends.items():
        for kind, label in (("single", "one dataset"), ("blend", "50/50 blend of two")):
            rates = blend[kind]
            target = "within 5%" if kind == "blend" else "—"
            report(
                f"| DataLoader, {label}, {size:,}-byte samples (samples/s) | {max(rates):,.0f} "
                f"| {min(rates):,.0f}–{max(rates):,.0f} | {target} |"
            )
    report("")
    for size, blend in blends.items():
        ratio = max(blend["blend"]) / max(blend["single"])
        report(f"blend / single, {size:,}-byte samples (best of 5 each, interleaved): {ratio:.3f}")
    return {**best, "blend": blends}


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
    report("")
    rows.append({"kind": "mixture", **run_mixture(report)})
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
            (
                r
                for r in rows
                if r["size"] == row["size"] and r["kind"] == "distributed" and "startup_s" in r
            ),
            None,
        )
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
    elif argv[:1] == ["--mixture-one"]:
        print(json.dumps(_measure_mixture()))
    elif argv[:1] == ["--blend"]:
        print(json.dumps(_blend_vs_single(int(argv[1]))))
    elif argv[:1] == ["--mixture"]:
        run_mixture()
    else:
        run()


if __name__ == "__main__":
    main(sys.argv[1:])
