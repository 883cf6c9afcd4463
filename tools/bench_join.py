"""Benchmark joins by key (issue 30): planning, the cached open, reading, sidecar writing.

1. **Planning** ``IndexedTarDataset.join`` of two shard sets of N keys each
   (``--keys``; 1e7 by default, 1e6 as well), the right one shuffled against the
   left and cut into other shard sizes, from cold indexes (each side's indexes
   opened for the first time in a fresh process, no join cache). The indexes are
   made synthetically, fast: each shard is a sparse file of the size its samples
   would take (one 16-byte ``.npy`` member each, header and padding: 1 KiB a
   sample), and its index is written from the offsets the writer would record
   (``TarScan`` and ``write_index``, as ``TarWriter`` does); nothing is read from
   the shards' bytes, so none are written. Target: under 10 s at 1e7.
2. **Cached open**: the same join again, in a fresh process, from the join cache.
   Target: under 50 ms.
3. **Reading**: random ``joined[i]`` in ``__getitems__`` batches of 64 against the
   sum of the two sides' own ``__getitems__`` of the same samples, on real shards
   (``ShardWriter``: 1e5 images of 2 KB, and 128-float embeddings), interleaved
   rounds. Target: at most 1.1x.
4. **Sidecar writing**: ``write_sidecar`` of a 128-float embedding for 1e5 samples
   (the function returns a precomputed array) against ``ShardWriter`` writing the
   same samples. Target: at least 0.8x its rate.

Run ``python tools/bench_join.py [--quick] [--keys N]`` or ``python tools/bench.py
join``. The machine may be shared: read the ratios of interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import indextar  # noqa: E402
from indextar.index.meta import IndexMeta, file_fingerprint  # noqa: E402
from indextar.index.naming import group_members  # noqa: E402
from indextar.index.shard import index_path  # noqa: E402
from indextar.index.tables import write_index  # noqa: E402
from indextar.tar.scan import TarScan  # noqa: E402

Report = Callable[[str], None]
SAMPLE_BYTES = 1024  # one header and one padded 16-byte member
REGULAR = ord("0")


def synthetic_shard(path: Path, keys: list[str]) -> None:
    """A sparse shard of ``keys`` (one ``npy`` member each) and its index, written from
    the offsets alone."""
    n = len(keys)
    size = n * SAMPLE_BYTES + 1024
    with open(path, "wb") as f:
        f.truncate(size)
    starts = np.arange(n, dtype=np.int64) * SAMPLE_BYTES
    scan = TarScan(
        names=[key + ".npy" for key in keys],
        types=np.full(n, REGULAR, np.uint8),
        header_offsets=starts,
        data_offsets=starts + 512,
        sizes=np.full(n, 16, np.int64),
        end_offset=n * SAMPLE_BYTES,
        file_size=size,
    )
    grouping = group_members(scan, shard=str(path))
    st = path.stat()
    meta = IndexMeta.describe(
        scan,
        grouping,
        shard_name=path.name,
        shard_size=st.st_size,
        shard_mtime_ns=st.st_mtime_ns,
        fingerprint=file_fingerprint(path, st.st_size),
    )
    write_index(index_path(path), meta, scan, grouping)


def make_sides(folder: Path, count: int, report: Report) -> tuple[list[str], list[str]]:
    """Left: ``count`` keys in shards of 1e6 (or 10 shards); right: the same keys
    shuffled, in shards of 0.7 as many samples (other boundaries)."""
    marker = folder / f"sides-{count}.json"
    if marker.exists():
        listed = json.loads(marker.read_text())
        return listed["left"], listed["right"]
    started = time.perf_counter()
    rng = np.random.default_rng(30)
    numbers = np.arange(count)
    per_shard = max(1, min(1_000_000, count // 10))
    sides: dict[str, list[str]] = {}
    for side, order, size in (
        ("left", numbers, per_shard),
        ("right", rng.permutation(numbers), max(1, int(per_shard * 0.7))),
    ):
        paths = []
        for n, first in enumerate(range(0, count, size)):
            keys = [f"images/{i:010d}" for i in order[first : first + size].tolist()]
            path = folder / f"{side}-{count}-{n:04d}.tar"
            synthetic_shard(path, keys)
            paths.append(str(path))
        sides[side] = paths
    marker.write_text(json.dumps(sides))
    report(
        f"(made 2 x {count:,} keys of synthetic indexes in {time.perf_counter() - started:.0f} s)"
    )
    return sides["left"], sides["right"]


_CHILD = """
import json, sys, time
started = time.perf_counter()
import indextar
imported = time.perf_counter()
left = indextar.IndexedTarDataset(json.loads(sys.argv[1]), build_missing=False)
right = indextar.IndexedTarDataset(json.loads(sys.argv[2]), build_missing=False)
opened = time.perf_counter()
joined = left.join(right, prefix="clip.", cache_dir=sys.argv[3])
done = time.perf_counter()
print(json.dumps({"open": opened - imported, "join": done - opened, "samples": len(joined)}))
"""


def _child_join(left: list[str], right: list[str], cache: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(left), json.dumps(right), str(cache)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def _drop_page_cache(paths: list[str]) -> None:
    """Advise the kernel to drop the indexes' pages (cold indexes without root)."""
    for shard in paths:
        path = index_path(Path(shard))
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bench_planning(folder: Path, count: int, report: Report) -> dict[str, Any]:
    left, right = make_sides(folder, count, report)
    cache = folder / f"cache-{count}"
    if cache.exists():
        for path in cache.rglob("*"):
            if path.is_file():
                path.unlink()
    _drop_page_cache(left + right)
    cold = _child_join(left, right, cache)
    cached = min((_child_join(left, right, cache) for _ in range(3)), key=lambda r: r["join"])
    report(
        f"| {count:,} keys a side ({len(left)} + {len(right)} shards) | "
        f"{cold['join']:.2f} s | {cached['join'] * 1e3:.1f} ms |"
    )
    return {"keys": count, "cold_s": cold["join"], "cached_s": cached["join"],
            "shards": [len(left), len(right)]}  # fmt: skip


# -- reading and writing on real shards --------------------------------------------------


def _embedding(i: int) -> np.ndarray:
    return np.random.default_rng(i).random(128, dtype=np.float32)


EMBEDDINGS: np.ndarray | None = None  # set before write_sidecar forks its workers


def embed(sample: dict[str, Any]) -> dict[str, Any]:
    """The precomputed embedding of a sample (the sidecar benchmark's function)."""
    assert EMBEDDINGS is not None
    return {"npy": EMBEDDINGS[sample["__index__"]]}


def real_sides(folder: Path, count: int) -> tuple[list[str], list[str], np.ndarray]:
    """``count`` images of 2 KB in shards of 10,000, and their embeddings in shards of
    7,000 in a shuffled order (written by ShardWriter)."""
    embeddings = np.random.default_rng(1).random((count, 128), dtype=np.float32)
    marker = folder / f"real-{count}.json"
    if marker.exists():
        listed = json.loads(marker.read_text())
        return listed["left"], listed["right"], embeddings
    payload = bytes(range(256)) * 8
    with indextar.ShardWriter(str(folder / f"img-{count}-%04d.tar"), maxcount=10_000) as sink:
        for i in range(count):
            sink.write({"__key__": f"k{i:08d}", "jpg": payload, "cls": i % 10})
    left = list(sink.shards)
    order = np.random.default_rng(2).permutation(count)
    with indextar.ShardWriter(str(folder / f"emb-{count}-%04d.tar"), maxcount=7_000) as sink:
        for i in order.tolist():
            sink.write({"__key__": f"k{i:08d}", "npy": embeddings[i]})
    right = list(sink.shards)
    marker.write_text(json.dumps({"left": left, "right": right}))
    return left, right, embeddings


def bench_reading(folder: Path, count: int, rounds: int, report: Report) -> dict[str, Any]:
    left_paths, right_paths, _ = real_sides(folder, count)
    left = indextar.IndexedTarDataset(left_paths, build_missing=False)
    right = indextar.IndexedTarDataset(right_paths, build_missing=False)
    joined = left.join(right, prefix="clip.", cache_dir=folder / "cache-real")
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, len(joined), 64).tolist() for _ in range(200)]
    lefts = [joined.sides(b)[0].tolist() for b in batches]
    rights = [joined.sides(b)[1].tolist() for b in batches]
    for b in batches[:20]:  # open every shard once
        joined.__getitems__(b)

    def read_joined() -> None:
        for b in batches:
            joined.__getitems__(b)

    def read_sides() -> None:
        for lb, rb in zip(lefts, rights):
            left.__getitems__(lb)
            right.__getitems__(rb)

    joined_s: list[float] = []
    sides_s: list[float] = []
    for round_no in range(rounds):
        # the order alternates: whichever reads second finds the same samples' pages and
        # the allocator just warmed by the first (in a fixed order the sides read 0.75 of
        # the joined view's time where cProfile finds 1.05 of its work)
        pair = [(read_joined, joined_s), (read_sides, sides_s)]
        for read, times in pair if round_no % 2 == 0 else pair[::-1]:
            started = time.perf_counter()
            read()
            times.append(time.perf_counter() - started)
    per_sample = 1e6 / (len(batches) * 64)
    # The best round of each over the best: the least disturbed by other jobs; the
    # median of the rounds' own ratios is returned too.
    ratio = min(joined_s) / min(sides_s)
    median = float(np.median(np.array(joined_s) / np.array(sides_s)))
    report(
        f"| random joined[i], batches of 64 | {min(joined_s) * per_sample:.1f} us | "
        f"{min(sides_s) * per_sample:.1f} us | {ratio:.2f}x |"
    )
    return {"joined_us": min(joined_s) * per_sample, "sides_us": min(sides_s) * per_sample,
            "ratio": ratio, "median_ratio": median}  # fmt: skip


def bench_sidecar(folder: Path, count: int, rounds: int, report: Report) -> dict[str, Any]:
    """``write_sidecar`` in this process and with its default workers (one per CPU),
    against ``ShardWriter`` writing the same samples, in interleaved rounds."""
    global EMBEDDINGS
    left_paths, _, embeddings = real_sides(folder, count)
    EMBEDDINGS = embeddings
    left = indextar.IndexedTarDataset(left_paths, build_missing=False)
    keys = [f"k{i:08d}" for i in range(count)]
    times: dict[str, list[float]] = {"sidecar": [], "parallel": [], "writer": []}
    for _ in range(rounds):
        out = Path(tempfile.mkdtemp(dir=folder))
        started = time.perf_counter()
        indextar.write_sidecar(left, embed, str(out / "side-%04d.tar"), workers=0)
        times["sidecar"].append(time.perf_counter() - started)
        started = time.perf_counter()
        indextar.write_sidecar(left, embed, str(out / "par-%04d.tar"))
        times["parallel"].append(time.perf_counter() - started)
        started = time.perf_counter()
        with indextar.ShardWriter(str(out / "plain-%04d.tar"), maxcount=10_000) as sink:
            for i, key in enumerate(keys):
                sink.write({"__key__": key, "npy": embeddings[i]})
        times["writer"].append(time.perf_counter() - started)
        for path in out.iterdir():
            path.unlink()
        out.rmdir()
    best = {name: min(seconds) for name, seconds in times.items()}
    # Rates, the best round of each over the best: the least disturbed by other jobs.
    ratio, parallel = best["writer"] / best["sidecar"], best["writer"] / best["parallel"]
    report(
        f"| sidecar of {count:,} 128-float embeddings, 1 process | "
        f"{count / best['sidecar']:,.0f} samples/s | {count / best['writer']:,.0f} samples/s | "
        f"{ratio:.2f}x |"
    )
    report(
        f"| the same, {os.cpu_count()} worker processes | {count / best['parallel']:,.0f} "
        f"samples/s | {count / best['writer']:,.0f} samples/s | {parallel:.2f}x |"
    )
    return {"sidecar_per_s": count / best["sidecar"], "writer_per_s": count / best["writer"],
            "parallel_per_s": count / best["parallel"], "ratio": ratio,
            "parallel_ratio": parallel}  # fmt: skip


def run(
    report: Report = print, *, quick: bool = False, keys: tuple[int, ...] = (1_000_000, 10_000_000)
) -> dict[str, Any]:
    sizes = (20_000,) if quick else keys
    real = 5_000 if quick else 100_000
    rounds = 1 if quick else 3
    folder = Path(os.environ.get("INDEXTAR_BENCH_JOIN_DIR") or tempfile.mkdtemp(prefix="join-"))
    folder.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"planning": []}
    report("| join of | cold indexes | cached |")
    report("|---|---:|---:|")
    for count in sizes:
        results["planning"].append(bench_planning(folder, count, report))
    report("")
    report("| reading | joined view | the two sides | ratio |")
    report("|---|---:|---:|---:|")
    results["reading"] = bench_reading(folder, real, rounds, report)
    report("")
    report("| writing | write_sidecar | ShardWriter | rate ratio |")
    report("|---|---:|---:|---:|")
    results["sidecar"] = bench_sidecar(folder, real, rounds, report)
    report("")
    largest = results["planning"][-1]
    targets = [
        (f"join of {largest['keys']:,} keys < 10 s from cold indexes", largest["cold_s"] < 10),
        ("cached join opens < 50 ms", largest["cached_s"] < 0.05),
        ("joined read <= 1.1x the two sides'", results["reading"]["ratio"] <= 1.1),
        ("sidecar >= 0.8x ShardWriter's rate", results["sidecar"]["ratio"] >= 0.8),
    ]
    for what, ok in targets:
        report(f"- {'PASS' if ok else 'FAIL'} {what}")
    report("")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--keys", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report: Report = (lambda line: print(line, file=sys.stderr)) if args.json else print
    results = run(report, quick=args.quick, keys=tuple(args.keys))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
