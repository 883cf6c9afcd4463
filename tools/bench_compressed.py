"""Compressed shards (issue 15): per-sample gzip and zstd next to plain tars, and a
foreign ``.tar.gz`` read in place by indextar and by ratarmountcore.

Run as ``python tools/bench.py compressed`` (or this file). Two corpora, each as plain
shards and as the same samples rewritten with ``indextar recompress`` into per-sample
``.tar.gz`` and ``.tar.zst``:

* the dataset benchmark's 20k images (JPEG + cls + json, ``tools/bench_dataset.py``);
* 200k tiny text samples (a caption and a small JSON each), in 4 shards.

For each, side by side in one run: the size on disk as a ratio to the plain shards,
index build members/s (``build_index(force=True)``: a compressed shard is decompressed
once), random ``ds[i]`` samples/s over one permutation (best of 3, formats
interleaved) and a DataLoader (2 workers, batch 64, shuffled; images decoded to
tensors, text as bytes).

The foreign ``.tar.gz`` is the 20k images as one ``gzip -6`` file (GNU gzip, one
stream). indextar indexes it with its default seek spacing (128 KiB); ratarmountcore's
``SQLiteIndexedTar`` with its defaults (seek points every 16 MiB). Both build a new
index (best of 3) and then read the JPEG of the same samples: random ones through one
open archive and from freshly opened ones, runs of 16 consecutive samples (block
order), and DataLoader batches of 64 (indextar's ``__getitems__``).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from benchlib import best_of  # noqa: E402

import indextar  # noqa: E402
from indextar.write.recompress import recompress  # noqa: E402
from indextar.write.reshard import reshard  # noqa: E402

Report = Callable[[str], None]
VERSION = 1
TEXT_SHARDS, TEXT_SAMPLES = 4, 200_000
FORMATS = (("plain", None, "tar"), ("gzip", "gzip", "tar.gz"), ("zstd", "zstd", "tar.zst"))
BATCH, WORKERS = 64, 2


# -- data --------------------------------------------------------------------------


def text_shards(folder: Path, samples: int) -> list[Path]:
    """Plain shards of tiny text samples (written once)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"text-plain-{n:03d}.tar" for n in range(TEXT_SHARDS)]
    stamp = folder / f"text-done-{samples}"
    if stamp.exists():
        return paths
    rng = random.Random(0)
    words = ["a", "photo", "of", "the", "red", "small", "dog", "cat", "on", "grass", "at", "night"]
    per = -(-samples // TEXT_SHARDS)
    for n, path in enumerate(paths):
        with indextar.TarWriter(path) as sink:
            for i in range(n * per, min(samples, (n + 1) * per)):
                caption = " ".join(rng.choice(words) for _ in range(rng.randint(5, 12)))
                sink.write(
                    {
                        "__key__": f"t{i:08d}",
                        "txt": caption,
                        "json": {"id": i, "width": 640 + i % 7, "height": 480, "score": i % 100},
                    }
                )
    stamp.touch()
    return paths


def recompressed(plain: list[Path], folder: Path, codec: str, suffix: str) -> list[Path]:
    """Each plain shard rewritten with a frame per sample (once)."""
    out = []
    for path in plain:
        stem = path.name.removesuffix(".tar").replace("-plain", "")
        target = folder / f"{stem}-{codec}.{suffix}"
        if not target.exists():
            recompress(path, target, compress=codec)
        out.append(target)
    return out


def foreign_targz(plain: list[Path], folder: Path) -> Path:
    """All the plain image shards' samples as one tar, gzipped by GNU gzip (once)."""
    target = folder / "images-all.tar.gz"
    if target.exists():
        return target
    single = folder / "images-all.tar"
    if not single.exists():
        reshard([str(p) for p in plain], str(folder / "images-all-%d.tar"),
                         maxcount=10**9, maxsize=1e15)  # fmt: skip
        os.replace(folder / "images-all-0.tar", single)
        Path(str(folder / "images-all-0.tar") + ".idx.sqlite").unlink(missing_ok=True)
    with open(target.with_suffix(".tmp"), "wb") as out:
        subprocess.run(["gzip", "-6", "-c", str(single)], stdout=out, check=True)
    os.replace(target.with_suffix(".tmp"), target)
    single.unlink()
    return target


# -- measurements ------------------------------------------------------------------


@dataclass
class Formatted:
    corpus: str
    name: str
    paths: list[Path]
    size: int = 0
    build_members_per_s: float = 0.0
    index_bytes: int = 0
    get_per_s: float = 0.0
    loader_per_s: float = 0.0


def time_build(paths: list[Path]) -> tuple[float, int]:
    """Best of 3 ``build_index(force=True)`` over the shards: members/s and index bytes."""
    best, indexes = best_of(lambda: [indextar.build_index(p, force=True) for p in paths], 3)
    members = sum(ix.meta.num_members for ix in indexes)
    index_bytes = sum(ix.path.stat().st_size for ix in indexes)
    return members / best, index_bytes


def time_gets(rows: list[Formatted], reads: int) -> None:
    """Random ``ds[i]`` samples/s, best of 3 passes, formats interleaved."""
    datasets = {r.name: indextar.IndexedTarDataset([str(p) for p in r.paths]) for r in rows}
    n = len(next(iter(datasets.values())))
    order = random.Random(1).sample(range(n), min(reads, n))
    for ds in datasets.values():  # tables loaded before the clock starts
        for start in ds._starts_list[:-1]:
            ds[start]
    for _ in range(3):
        for row in rows:
            get = datasets[row.name].__getitem__
            start = time.perf_counter()
            for i in order:
                get(i)
            row.get_per_s = max(row.get_per_s, len(order) / (time.perf_counter() - start))


def time_loader(row: Formatted, samples: int, decode: str | None, keys: tuple[str, ...]) -> None:
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    ds = indextar.IndexedTarDataset([str(p) for p in row.paths], decode=decode, keys=keys)
    sampler = RandomSampler(
        ds, num_samples=min(samples, len(ds)), generator=torch.Generator().manual_seed(0)
    )
    loader = DataLoader(
        ds, batch_size=BATCH, sampler=sampler, num_workers=WORKERS,
        collate_fn=None if decode else list,
    )  # fmt: skip
    start = time.perf_counter()
    count = sum(len(batch[0]) if decode else len(batch) for batch in loader)
    row.loader_per_s = count / (time.perf_counter() - start)


def ratarmount_open(path: Path, scratch: Path, *, fresh: bool) -> tuple[float, Any]:
    """ratarmountcore's ``SQLiteIndexedTar`` of ``path``: a new index (``fresh``), or the
    one it wrote before; and the seconds it took."""
    from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar

    logging.getLogger("ratarmountcore").setLevel(logging.ERROR)
    index_file = scratch / "ratarmount.index.sqlite"
    if fresh:
        index_file.unlink(missing_ok=True)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        archive = SQLiteIndexedTar(str(path), indexFilePath=str(index_file), writeIndex=fresh)
    return time.perf_counter() - start, archive


def cold_reads(path: Path, scratch: Path, keys: list[str], order: list[int]) -> tuple[float, float]:
    """Median seconds of one sample's read from a freshly opened archive, for each reader:
    no decompressed data cached, as when the data set is far larger than memory. The
    open (and a first read at the file's start, which loads the seek points) is not
    timed."""
    ours, theirs = [], []
    for i in order:
        ds = indextar.IndexedTarDataset(str(path))
        ds[0]
        start = time.perf_counter()
        ds[i]["jpg"]
        ours.append(time.perf_counter() - start)
        ds.close()
        _, archive = ratarmount_open(path, scratch, fresh=False)
        with archive.open(archive.lookup(f"/{keys[0]}.jpg")) as f:
            f.read()
        start = time.perf_counter()
        with archive.open(archive.lookup(f"/{keys[i]}.jpg")) as f:
            f.read()
        theirs.append(time.perf_counter() - start)
        archive.close()
    return statistics.median(ours), statistics.median(theirs)


def rss_mb() -> float:
    """This process's resident memory, MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def ratarmount_reads(archive: Any, names: list[str]) -> float:
    start = time.perf_counter()
    for name in names:
        with archive.open(archive.lookup(name)) as f:
            f.read()
    return time.perf_counter() - start


def ordered_reads(
    path: Path, scratch: Path, keys: list[str], orders: list[list[int]]
) -> tuple[float, float]:
    """Seconds for each reader to read the JPEGs of ``orders`` (lists of samples: a
    DataLoader batch, read by indextar with one ``__getitems__``, by ratarmountcore one
    by one in the same order), through archives opened afresh."""
    ds = indextar.IndexedTarDataset(str(path), keys=("jpg",))
    ds[0]
    start = time.perf_counter()
    for batch in orders:
        ds.__getitems__(batch)
    ours = time.perf_counter() - start
    ds.close()
    _, archive = ratarmount_open(path, scratch, fresh=False)
    ratarmount_reads(archive, [f"/{keys[0]}.jpg"])
    theirs = ratarmount_reads(archive, [f"/{keys[i]}.jpg" for batch in orders for i in batch])
    archive.close()
    return ours, theirs


def foreign(
    path: Path, scratch: Path, reads: int, report: Report, cold: int = 20
) -> dict[str, Any]:
    from indextar.source.spancache import SPAN_CACHE

    best_ours = best_theirs = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        index = indextar.build_index(path, force=True)
        best_ours = min(best_ours, time.perf_counter() - start)
        seconds, built = ratarmount_open(path, scratch, fresh=True)
        built.close()
        best_theirs = min(best_theirs, seconds)
    # Reads from indexes opened afresh, as in a new process: the build's own object
    # would still hold what it decompressed (rapidgzip caches its chunks).
    _, archive = ratarmount_open(path, scratch, fresh=False)
    members = index.meta.num_members
    ds = indextar.IndexedTarDataset(str(path))
    keys = indextar.open_index(path).keys()
    order = random.Random(2).sample(range(len(ds)), min(reads, len(ds)))
    ds[0]
    start = time.perf_counter()
    for i in order:
        ds[i]["jpg"]
    ours = len(order) / (time.perf_counter() - start)
    ours_cache_mb = SPAN_CACHE.size / 1e6
    start = time.perf_counter()  # the same reads again: what each reader kept serves them
    for i in order:
        ds[i]["jpg"]
    ours_again = len(order) / (time.perf_counter() - start)
    samples = len(ds)
    ds.close()
    names = [f"/{keys[i]}.jpg" for i in order]
    rss_before = rss_mb()
    theirs = len(order) / ratarmount_reads(archive, names)
    theirs_cache_mb = rss_mb() - rss_before
    theirs_again = len(order) / ratarmount_reads(archive, names)
    archive.close()
    cold_ours, cold_theirs = cold_reads(path, scratch, keys, order[:cold])
    # Block order (a shard-aware sampler: runs of 16 consecutive samples from random
    # places) and DataLoader batches (64 random samples, one __getitems__ each).
    rng = random.Random(3)
    runs = [list(range(s, s + 16)) for s in rng.sample(range(samples - 16), reads // 16)]
    batches = [rng.sample(range(samples), 64) for _ in range(reads // 64)]
    block_ours, block_theirs = ordered_reads(path, scratch, keys, runs)
    batch_ours, batch_theirs = ordered_reads(path, scratch, keys, batches)
    block_reads, batch_reads = sum(map(len, runs)), sum(map(len, batches))
    result = {
        "file_bytes": path.stat().st_size,
        "uncompressed_bytes": index.meta.uncompressed_size,
        "index_bytes": index.path.stat().st_size,
        "seek_spacing": index.meta.seek_spacing,
        "members": members,
        "indextar_build_s": best_ours,
        "ratarmountcore_build_s": best_theirs,
        "indextar_reads_per_s": ours,
        "ratarmountcore_reads_per_s": theirs,
        "reads": len(order),
        "indextar_again_reads_per_s": ours_again,
        "ratarmountcore_again_reads_per_s": theirs_again,
        "indextar_span_cache_mb": ours_cache_mb,
        "ratarmountcore_rss_growth_mb": theirs_cache_mb,
        "indextar_cold_read_ms": cold_ours * 1e3,
        "ratarmountcore_cold_read_ms": cold_theirs * 1e3,
        "cold_reads": cold,
        "indextar_block_reads_per_s": block_reads / block_ours,
        "ratarmountcore_block_reads_per_s": block_reads / block_theirs,
        "indextar_batch_reads_per_s": batch_reads / batch_ours,
        "ratarmountcore_batch_reads_per_s": batch_reads / batch_theirs,
    }
    report(
        f"Foreign `.tar.gz`: {result['file_bytes'] / 1e6:,.0f} MB (gzip -6, one stream) of "
        f"{result['uncompressed_bytes'] / 1e6:,.0f} MB of tar, {members:,} members; "
        f"indextar's index {result['index_bytes'] / 1e6:.1f} MB (seek points every "
        f"{index.meta.seek_spacing // 1024} KiB)."
    )
    report("")
    report("| | indextar | ratarmountcore | ratio |")
    report("|---|---:|---:|---:|")
    report(
        f"| index build, s (best of 3) | {best_ours:.2f} | {best_theirs:.2f} | "
        f"{best_theirs / best_ours:.1f}x |"
    )
    report(
        f"| random sample reads/s ({len(order)} JPEGs, one open archive) | {ours:,.0f} | "
        f"{theirs:,.0f} | {ours / theirs:.1f}x |"
    )
    report(
        f"| the same {len(order)} reads again, reads/s (what each kept serves them) | "
        f"{ours_again:,.0f} | {theirs_again:,.0f} | {ours_again / theirs_again:.1f}x |"
    )
    report(
        f"| a random read from a fresh open, ms (median of {cold}) | {cold_ours * 1e3:.2f} | "
        f"{cold_theirs * 1e3:.2f} | {cold_theirs / cold_ours:.1f}x |"
    )
    for what, n, mine, its in (
        (f"block order, reads/s ({len(runs)} runs of 16 samples)", block_reads, block_ours,
         block_theirs),
        (f"DataLoader batches, reads/s ({len(batches)} batches of 64)", batch_reads, batch_ours,
         batch_theirs),
    ):  # fmt: skip
        report(f"| {what} | {n / mine:,.0f} | {n / its:,.0f} | {its / mine:.1f}x |")
    report("")
    report(
        f"Memory the reads left behind: indextar's span cache {ours_cache_mb:.1f} MB (budget "
        f"{SPAN_CACHE.budget >> 20} MiB a process); ratarmountcore's process grew "
        f"{theirs_cache_mb:,.0f} MB over its {len(order)} reads (rapidgzip keeps up to 16 "
        "chunks of 16 MiB, plus 2 prefetched, per open archive)."
    )
    report("")
    return result


def table(rows: list[Formatted], unit: str, report: Report) -> None:
    plain = rows[0]
    report(
        f"| format | size, MB | size vs plain | index build, members/s | index, MB | "
        f"`ds[i]`/s | vs plain | DataLoader {unit}/s | vs plain |"
    )
    report("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        report(
            f"| {r.name} | {r.size / 1e6:,.1f} | {r.size / plain.size:.2f} | "
            f"{r.build_members_per_s:,.0f} | {r.index_bytes / 1e6:.1f} | {r.get_per_s:,.0f} | "
            f"{r.get_per_s / plain.get_per_s:.2f} | {r.loader_per_s:,.0f} | "
            f"{r.loader_per_s / plain.loader_per_s:.2f} |"
        )
    report("")


def run(report: Report = print, *, quick: bool = False) -> dict[str, Any]:
    import bench_dataset

    data = ROOT / "bench-data"
    images = 2000 if quick else 20000
    texts = 20000 if quick else TEXT_SAMPLES
    folder = data / f"compressed-v{VERSION}-{images}-{texts}"
    folder.mkdir(parents=True, exist_ok=True)
    image_folder = data / ("dataset" if images == 20000 else f"dataset-{images}")
    image_plain = [Path(p) for p in bench_dataset.make_data(image_folder, images)]
    text_plain = text_shards(folder, texts)
    corpora = {
        "images": (image_plain, "images", "torchrgb", ("jpg", "cls"), 8000, 20000),
        "text": (text_plain, "samples", None, ("txt", "json"), 50000, 50000),
    }
    out: dict[str, Any] = {}
    for corpus, (plain, unit, decode, keys, loader_samples, reads) in corpora.items():
        rows = []
        for name, codec, suffix in FORMATS:
            paths = plain if codec is None else recompressed(plain, folder, codec, suffix)
            row = Formatted(corpus, name, paths, size=sum(p.stat().st_size for p in paths))
            row.build_members_per_s, row.index_bytes = time_build(paths)
            rows.append(row)
        time_gets(rows, reads if not quick else 2000)
        for row in rows:
            time_loader(row, loader_samples if not quick else 2000, decode, keys)
        n = len(indextar.IndexedTarDataset([str(p) for p in plain]))
        report(f"{corpus.capitalize()}: {n:,} samples in {len(plain)} shards.")
        report("")
        table(rows, unit, report)
        out[corpus] = [r.__dict__ | {"paths": [str(p) for p in r.paths]} for r in rows]
    out["foreign"] = foreign(
        foreign_targz(image_plain, folder), folder, 100 if quick else 300, report
    )
    images_, text = out["images"], out["text"]
    targets = [
        (
            "per-sample zstd images: random ds[i] at least 0.5x plain",
            images_[2]["get_per_s"] / images_[0]["get_per_s"],
            0.5,
        ),
        (
            "per-sample zstd tiny text: random ds[i] at least 0.2x plain",
            text[2]["get_per_s"] / text[0]["get_per_s"],
            0.2,
        ),
        (
            "per-sample zstd tiny text: at least 2x smaller on disk",
            text[0]["size"] / text[2]["size"],
            2.0,
        ),
        (
            "foreign .tar.gz: index build at least 3x ratarmountcore",
            out["foreign"]["ratarmountcore_build_s"] / out["foreign"]["indextar_build_s"],
            3.0,
        ),
        (
            "foreign .tar.gz: random reads at least 5x ratarmountcore",
            out["foreign"]["indextar_reads_per_s"] / out["foreign"]["ratarmountcore_reads_per_s"],
            5.0,
        ),
    ]
    report("Targets:")
    report("")
    for name, value, goal in targets:
        report(f"- {'PASS' if value >= goal else 'FAIL'}: {name} ({value:.2f}x)")
    report("")
    report(f"Load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.")
    report("")
    out["targets"] = [{"name": n, "value": v, "goal": g} for n, v, g in targets]
    return out


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
