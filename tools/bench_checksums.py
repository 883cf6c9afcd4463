"""Benchmark per-sample checksums (issue 26, 1e): what they cost a read and a build.

Two local shards, each indexed three ways into folders of their own (no checksums,
``crc32``, ``xxh3_64``), so that the same bytes are read through each index:

* ``small``: 20,000 samples of a ``cls`` and a 100-byte ``txt`` (a span of 2 KiB:
  four header blocks and two data blocks);
* ``100KB``: 1,000 samples of one 100,000-byte ``bin``.

1. ``ds[i]`` in a shuffled order, and ``ds.__getitems__`` of batches of 64: microseconds
   of this process's CPU time per sample (``time.process_time``: on a shared machine,
   wall time measured mostly the others' load), the best of 5 rounds, the variants
   interleaved round by round (a warm page cache: what checksums add to a read, not
   to the disk).
2. ``build_index(..., force=True)`` of each shard: the best of 3, interleaved.

Run ``python tools/bench_checksums.py [--quick]`` or ``python tools/bench.py checksums``.
Shards are generated once into ``bench-data/checksums-*``.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from benchlib import interleaved  # noqa: E402

import indextar  # noqa: E402

VARIANTS: dict[str, bool | str] = {"none": False, "crc32": "crc32", "xxh3_64": "xxh3_64"}
BATCH = 64


def _shard(folder: Path, name: str, samples: int, members: Callable[[int], dict[str, Any]]) -> Path:
    path = folder / f"checksums-{name}-{samples}.tar"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with indextar.TarWriter(path.with_suffix(".tmp.tar"), index=False) as sink:
            for i in range(samples):
                sink.write({"__key__": f"s{i:07d}", **members(i)})
        path.with_suffix(".tmp.tar").rename(path)
    return path


def _datasets(shard: Path) -> dict[str, indextar.IndexedTarDataset]:
    """The shard opened through each variant's index (built once, in its own folder)."""
    result = {}
    for variant, checksums in VARIANTS.items():
        folder = shard.parent / f"{shard.stem}-{variant}"
        folder.mkdir(exist_ok=True)
        indextar.build_index(shard, index_dir=folder, checksums=checksums)
        result[variant] = indextar.IndexedTarDataset(str(shard), index_dir=folder)
    return result


def _per_sample_us(run: Callable[[], int]) -> Callable[[], float]:
    def case() -> float:
        start = time.process_time()
        count = run()
        return (time.process_time() - start) / count * 1e6

    return case


def _reads(ds: indextar.IndexedTarDataset, order: list[int], batched: bool) -> Callable[[], int]:
    if batched:
        batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]

        def run() -> int:
            for batch in batches:
                ds.__getitems__(batch)
            return len(order)

        return run

    def run_each() -> int:
        for i in order:
            ds[i]
        return len(order)

    return run_each


def _builds(shard: Path, folder: Path, checksums: bool | str) -> Callable[[], float]:
    def case() -> float:
        start = time.perf_counter()
        indextar.build_index(shard, index_dir=folder, force=True, checksums=checksums)
        return time.perf_counter() - start

    return case


def _ratios(best: dict[str, float]) -> str:
    return f" | {best['crc32'] / best['none']:.2f}x | {best['xxh3_64'] / best['none']:.2f}x |"


def run(report: Callable[[str], None] = print, *, quick: bool = False) -> dict[str, Any]:
    data = REPO / "bench-data"
    small = _shard(
        data,
        "small",
        2_000 if quick else 20_000,
        lambda i: {"cls": i % 1000, "txt": (f"{i:07d}" * 15)[:100]},
    )
    large = _shard(
        data,
        "100KB",
        100 if quick else 1_000,
        lambda i: {"bin": random.Random(i).randbytes(100_000)},
    )
    rounds = 2 if quick else 5
    out: dict[str, Any] = {"reads": {}, "builds": {}}
    report("| shard | read | " + " | ".join(VARIANTS) + " | crc32 / none | xxh3_64 / none |")
    report("|---|---|" + "---:|" * (len(VARIANTS) + 2))
    for label, shard in (("small", small), ("100KB", large)):
        datasets = _datasets(shard)
        order = list(range(len(datasets["none"])))
        random.Random(0).shuffle(order)
        for read, batched in (("ds[i]", False), ("__getitems__(64)", True)):
            figures = interleaved(
                {v: _per_sample_us(_reads(ds, order, batched)) for v, ds in datasets.items()},
                rounds,
            )
            best = {v: min(f) for v, f in figures.items()}
            out["reads"][f"{label} {read}"] = best
            report(
                f"| {label} | {read} | "
                + " | ".join(f"{best[v]:.2f} us" for v in VARIANTS)
                + _ratios(best)
            )
    report("")
    report("| shard | build_index | " + " | ".join(VARIANTS) + " | crc32 / none | xxh3_64 / none |")
    report("|---|---|" + "---:|" * (len(VARIANTS) + 2))
    for label, shard in (("small", small), ("100KB", large)):
        folders = {v: shard.parent / f"{shard.stem}-{v}" for v in VARIANTS}
        figures = interleaved(
            {v: _builds(shard, folders[v], c) for v, c in VARIANTS.items()}, 2 if quick else 3
        )
        best = {v: min(f) for v, f in figures.items()}
        out["builds"][label] = best
        size_mb = shard.stat().st_size / 1e6
        report(
            f"| {label} ({size_mb:.0f} MB) | build_index | "
            + " | ".join(f"{best[v] * 1e3:.0f} ms" for v in VARIANTS)
            + _ratios(best)
        )
    report("")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    run(quick=parser.parse_args().quick)


if __name__ == "__main__":
    main()
