"""Benchmark the writers and resharding.

1. Write throughput of ``indextar.ShardWriter`` (which also writes each shard's
   index) against ``webdataset.ShardWriter`` on the same samples, already
   encoded to bytes.
2. Resharding throughput against ``cat`` of the same source shards into one
   file: the floor, since resharding copies those bytes and more.

Targets: at least 1.5x webdataset's writer; resharding at least 50% of ``cat``.

Usage::

    python tools/bench_writer.py [--dir /dev/shm] [--write docs/benchmarks-writer.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from indextar import ShardWriter  # noqa: E402
from indextar.write.reshard import reshard  # noqa: E402

MIXES = {
    # name: (samples, jpg size range)
    "small (1-4 KB jpg + cls + json)": (40_000, (1_000, 4_000)),
    "images (20-200 KB jpg + cls + json)": (4_000, (20_000, 200_000)),
}


def make_samples(n: int, sizes: tuple[int, int], seed: int = 0) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    pool = [rng.bytes(int(s)) for s in rng.integers(*sizes, size=min(n, 500))]
    return [
        {
            "__key__": f"sample{i:07d}",
            "jpg": pool[i % len(pool)],
            "cls": str(i % 1000).encode(),
            "json": b'{"caption": "a picture", "id": %d}' % i,
        }
        for i in range(n)
    ]


def best_of(repeats: int, setup: Callable[[], None], run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        setup()
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return min(times)


def fresh(folder: Path) -> Callable[[], None]:
    def setup() -> None:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)

    return setup


def folder_bytes(folder: Path, suffix: str = ".tar") -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.endswith(suffix))


def write_ours(folder: Path, samples: list[dict[str, object]]) -> None:
    with ShardWriter(str(folder / "s-%06d.tar"), maxcount=10_000) as sink:
        for s in samples:
            sink.write(s)


def write_theirs(folder: Path, samples: list[dict[str, object]]) -> None:
    import webdataset

    with webdataset.ShardWriter(str(folder / "s-%06d.tar"), maxcount=10_000, verbose=0) as sink:
        for s in samples:
            sink.write(s)


def bench_write(base: Path, repeats: int) -> list[list[str]]:
    rows = []
    for name, (n, sizes) in MIXES.items():
        samples = make_samples(n, sizes)
        ours_dir, theirs_dir = base / "ours", base / "theirs"

        t_ours = best_of(repeats, fresh(ours_dir), partial(write_ours, ours_dir, samples))
        t_theirs = best_of(repeats, fresh(theirs_dir), partial(write_theirs, theirs_dir, samples))
        mb = folder_bytes(ours_dir) / 1e6
        rows.append(
            [
                f"write, {name}",
                f"{n / t_ours:,.0f} samples/s, {mb / t_ours:,.0f} MB/s (indexed)",
                f"webdataset: {n / t_theirs:,.0f} samples/s",
                f"**{t_theirs / t_ours:.2f}x** (target 1.5x)",
            ]
        )
    return rows


def bench_reshard(base: Path, repeats: int) -> list[list[str]]:
    n, sizes = MIXES["images (20-200 KB jpg + cls + json)"]
    source = base / "src"
    fresh(source)()
    with ShardWriter(str(source / "src-%06d.tar"), maxcount=250) as sink:
        for s in make_samples(n, sizes, seed=1):
            sink.write(s)
    shards = sink.shards
    total = folder_bytes(source) / 1e6
    out = base / "out"

    def cat() -> None:
        with open(out / "all.tar", "wb") as f:
            subprocess.run(["cat", *shards], stdout=f, check=True)

    t_cat = best_of(repeats, fresh(out), cat)
    rows = []
    for shuffle in (False, True):
        t = best_of(
            repeats,
            fresh(out),
            partial(reshard, shards, str(out / "r-%06d.tar"), maxcount=1_000, shuffle=shuffle),
        )
        label = "reshard --shuffle" if shuffle else "reshard"
        rows.append(
            [
                f"{label}, {len(shards)} shards, {total:,.0f} MB",
                f"{total / t:,.0f} MB/s (indexed)",
                f"cat: {total / t_cat:,.0f} MB/s",
                f"**{t_cat / t:.0%}** of cat (target 50%)",
            ]
        )
    return rows


def table(rows: list[list[str]]) -> str:
    lines = ["| benchmark | indextar | reference | ratio |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_dir = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    parser.add_argument("--dir", default=default_dir, help=f"scratch folder ({default_dir})")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs (3)")
    parser.add_argument("--write", metavar="FILE.md", help="also write the table to this file")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-writer-", dir=args.dir))
    try:
        rows = bench_write(base, args.repeats) + bench_reshard(base, args.repeats)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"scratch folder {args.dir}, best of {args.repeats}"
    )
    result = table(rows)
    print(result)
    print(f"\n{machine}")
    if args.write:
        Path(args.write).write_text(
            "# Writer and reshard benchmarks\n\n"
            "Measured with `python tools/bench_writer.py --write docs/benchmarks-writer.md`.\n"
            "Samples are bytes already encoded; indextar's writer also writes each shard's\n"
            "index and fsyncs each shard before renaming it into place. `cat` copies the same\n"
            "source shards into one file, the floor for resharding.\n\n"
            f"{result}\n\n{machine}.\n"
        )


if __name__ == "__main__":
    main()
