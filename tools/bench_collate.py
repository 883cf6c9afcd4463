"""Batches from DataLoader workers: ``default_collate`` against ``pooled_collate``.

``python tools/bench_collate.py`` (``tools/bench.py collate``). Shards of precomputed
latents (``.npy`` members of ``4 x 64 x 64`` float16, 32 KB, and a ``.cls``), read by
``IndexedTarDataset`` through a DataLoader with 2 workers, batches of 256 (8 MB): the
workers' cost a sample is small, so what a batch costs the training process is its
handover. Rows, in interleaved rounds, best of them: ``default_collate`` (a new
shared-memory block per field per batch), ``pooled_collate`` (one of a few reused
blocks a batch), and the floor, the same reads with a collate that hands over nothing
but the batch's length. CPU a batch is the median over the rounds, in the training
process and in the workers together.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import interleaved  # noqa: E402
from procstats import rate_and_cpu  # noqa: E402

import indextar  # noqa: E402

SHAPE = (4, 64, 64)
BATCH = 256

Report = Callable[[str], None]


def write_latents(folder: Path, count: int) -> list[str]:
    rng = np.random.default_rng(0)
    base = rng.standard_normal(SHAPE).astype(np.float16)
    with indextar.ShardWriter(str(folder / "latents-%06d.tar"), maxcount=5000) as sink:
        for i in range(count):
            buffer = io.BytesIO()
            np.save(buffer, np.roll(base, i, axis=2))
            sink.write(
                {"__key__": f"l{i:07d}", "npy": buffer.getvalue(), "cls": b"%d" % (i % 1000)}
            )
    return sink.shards


def count_only(samples: list[Any]) -> int:
    """The floor: the same reads, and nothing handed over but a number."""
    return len(samples)


def run(report: Report = print, quick: bool = False, rounds: int = 3) -> dict[str, Any]:
    from torch.utils.data import DataLoader, default_collate

    count = 2_048 if quick else 20_480
    rounds = 1 if quick else rounds
    rows: dict[str, Callable[[list[Any]], Any]] = {
        "default_collate": default_collate,
        "pooled_collate": indextar.pooled_collate,
        "floor: the reads, a count handed over": count_only,
    }
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as scratch:
        shards = write_latents(Path(scratch), count)
        ds = indextar.IndexedTarDataset(shards, keys=("npy", "cls"), decode=[])

        def case(collate: Callable[[list[Any]], Any]) -> Callable[[], tuple[float, ...]]:
            def read() -> tuple[float, int]:
                loader = DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=collate)
                batches = 0
                for batch in loader:
                    batches += 1
                    del batch
                del loader  # its workers are joined: their CPU is counted
                return count, batches

            def one() -> tuple[float, ...]:
                """Samples a second, and CPU ms a batch of the training process and of
                the workers."""
                figures = rate_and_cpu(read)
                load.append(os.getloadavg()[0])
                return figures

            return one

        figures = interleaved({name: case(collate) for name, collate in rows.items()}, rounds)
        ds.close()
    best = {name: max(rate for rate, _, _ in runs) for name, runs in figures.items()}
    report(
        f"{count:,} latents of {SHAPE[0]}x{SHAPE[1]}x{SHAPE[2]} float16 (32 KB, as `.npy` "
        f"members) in indexed shards, DataLoader with 2 workers, batches of {BATCH} (8 MB), "
        f"best of {rounds} interleaved rounds (load average {min(load):.1f}-{max(load):.1f}); "
        "CPU a batch is the median over the rounds:"
    )
    report("")
    report("| collate | samples/s | × default_collate | CPU ms a batch: main | workers |")
    report("|---|---|---|---|---|")
    for name in rows:
        main_ms, workers_ms = np.median(np.array(figures[name])[:, 1:], axis=0)
        ratio = best[name] / best["default_collate"]
        report(f"| {name} | {best[name]:,.0f} | {ratio:.2f}× | {main_ms:.2f} | {workers_ms:.2f} |")
    report("")
    return {"samples_per_s": best, "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    args = parser.parse_args()
    run(quick=args.quick, rounds=args.rounds)


if __name__ == "__main__":
    main()
