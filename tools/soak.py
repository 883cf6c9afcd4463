"""Soak test: read many random samples through DataLoader workers and check every byte.

Writes shards with :class:`indextar.ShardWriter` (random member sizes, ustar, and a
PAX long name now and then), recording the SHA-1 of every member in a side JSON file
at write time. Then reads ``--samples`` random samples (with replacement) through
``--workers`` DataLoader workers and checks each member's bytes, in the main process,
against the recorded digest. Reports mismatches (must be 0), samples/s, and the RSS
of the main process and the workers over time (it should stay flat).

Usage::

    python tools/soak.py --samples 1000000            # the figure in docs/reliability.md
    python tools/soak.py --samples 20000 --json       # what tests/test_soak.py runs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MB, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return 0.0


def child_pids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def write_shards(folder: Path, *, shards: int, per_shard: int, seed: int) -> dict[str, str]:
    """Write the shards; return ``{"key.ext": sha1}`` of every member."""
    from indextar import ShardWriter

    rng = random.Random(seed)
    digests: dict[str, str] = {}
    with ShardWriter(str(folder / "soak-%04d.tar"), maxcount=per_shard) as writer:
        for i in range(shards * per_shard):
            key = f"s{i:08d}" if i % 97 else f"long/{'d' * 120}/s{i:08d}"
            sample: dict[str, Any] = {"__key__": key}
            for ext in ("bin", "cls"):
                size = (
                    rng.choice([0, 1, 511, 512, 513, rng.randrange(1, 20_000)])
                    if ext == "bin"
                    else 4
                )
                data = rng.randbytes(size)
                sample[ext] = data
                digests[f"{key}.{ext}"] = hashlib.sha1(data).hexdigest()
            writer.write(sample)
    return digests


def collate(batch: list[Any]) -> list[Any]:
    return batch


def soak(
    folder: Path, *, samples: int, workers: int, batch_size: int, seed: int, report_every: int
) -> dict[str, Any]:
    import torch.utils.data

    from indextar import IndexedTarDataset

    digests = json.loads((folder / "sha1.json").read_text())
    shards = sorted(str(p) for p in folder.glob("soak-*.tar"))
    dataset = IndexedTarDataset(shards)
    sampler = torch.utils.data.RandomSampler(
        dataset,
        replacement=True,
        num_samples=samples,
        generator=torch.Generator().manual_seed(seed),
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        sampler=sampler,
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=collate,
        persistent_workers=False,
    )
    checked = mismatches = members = 0
    rss: list[dict[str, float]] = []
    started = time.perf_counter()
    next_report = report_every
    for batch in loader:
        for sample in batch:
            key = sample["__key__"]
            for ext in ("bin", "cls"):
                if hashlib.sha1(sample[ext]).hexdigest() != digests[f"{key}.{ext}"]:
                    mismatches += 1
                members += 1
            checked += 1
        if checked >= next_report:
            me = os.getpid()
            rss.append(
                {
                    "samples": checked,
                    "seconds": round(time.perf_counter() - started, 1),
                    "main_mb": round(rss_mb(me), 1),
                    "workers_mb": round(sum(rss_mb(p) for p in child_pids(me)), 1),
                }
            )
            next_report += report_every
    seconds = time.perf_counter() - started
    return {
        "samples": checked,
        "members": members,
        "mismatches": mismatches,
        "seconds": round(seconds, 1),
        "samples_per_second": round(checked / seconds),
        "dataset_samples": len(dataset),
        "shards": len(shards),
        "rss": rss,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--per-shard", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--data-dir", type=Path, help="keep the shards here (default: a temporary folder)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="indextar-soak-") as temporary:
        folder = args.data_dir or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "sha1.json").exists():
            digests = write_shards(
                folder, shards=args.shards, per_shard=args.per_shard, seed=args.seed
            )
            (folder / "sha1.json").write_text(json.dumps(digests))
        result = soak(
            folder,
            samples=args.samples,
            workers=args.workers,
            batch_size=args.batch_size,
            seed=args.seed,
            report_every=max(1, args.samples // 10),
        )
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['samples']:,} random samples ({result['members']:,} members) from "
            f"{result['shards']} shards of {result['dataset_samples']:,} samples, "
            f"{args.workers} workers: "
            f"{result['mismatches']} mismatches, {result['samples_per_second']:,} samples/s"
        )
        print("| samples read | seconds | main RSS (MB) | workers RSS (MB) |")
        print("|---:|---:|---:|---:|")
        for row in result["rss"]:
            cells = (f"{row['samples']:,}", row["seconds"], row["main_mb"], row["workers_mb"])
            print("| " + " | ".join(map(str, cells)) + " |")
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
