"""Benchmark IndexedTarDataset against wids, tarfile, an os.pread floor and webdataset.

Run as ``python tools/bench_dataset.py [--samples 20000] [--out docs/benchmarks-dataset.md]``.
It writes an image set (JPEG + cls + json per sample, with webdataset's TarWriter) into
``bench-data/dataset/`` on first use, then measures, side by side in one run:

* raw random access in one process: a random permutation of every sample, read as
  bytes, through indextar (``ds[i]`` and ``__getitems__`` batches of 64), wids'
  ``ShardListDataset``, ``tarfile`` with prebuilt members, and the ``os.pread``
  floor (one pread per sample span, offsets precomputed in a Python list);
* a DataLoader end to end: 2 workers, batch 64, JPEG decoded to a float CHW tensor
  (webdataset's ``torchrgb``), shuffled, for indextar, webdataset's streaming
  pipeline and decode alone over bytes already in memory (the limit);

with the time to first batch and the RSS of the (worker) processes. Prints a
Markdown table and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import random
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import indextar  # noqa: E402
from indextar.read.decode import make_decoder  # noqa: E402

SHARDS = 10
BATCH = 64
WORKERS = 2
PAGE = os.sysconf("SC_PAGE_SIZE")


def anon_rss_mib(pid: int | str = "self") -> float:
    """Resident memory not backed by files (statm resident - shared), in MiB: the
    mapped shard pages that mmap readers add to RSS are page cache, not counted."""
    with open(f"/proc/{pid}/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * PAGE / 2**20


# -- data ---------------------------------------------------------------------------


def make_data(folder: Path, samples: int) -> list[str]:
    """Write (once) ``SHARDS`` shards of jpg+cls+json samples; return their paths."""
    import webdataset
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / f"done-{samples}"
    paths = [str(folder / f"images-{n:06d}.tar") for n in range(SHARDS)]
    if stamp.exists():
        return paths
    rng = np.random.default_rng(0)
    # A few distinct photos-like images (smooth gradients plus noise), re-encoded at
    # varying quality so sizes vary as in real data.
    base = [
        (
            np.linspace(0, 255, 160)[None, :, None] * rng.random((120, 1, 3))
            + rng.integers(0, 40, (120, 160, 3))
        )
        .clip(0, 255)
        .astype(np.uint8)
        for _ in range(16)
    ]
    per_shard = -(-samples // SHARDS)
    for shard_no, path in enumerate(paths):
        with webdataset.TarWriter(path) as sink:
            for i in range(shard_no * per_shard, min(samples, (shard_no + 1) * per_shard)):
                buf = io.BytesIO()
                Image.fromarray(base[i % 16]).save(buf, format="JPEG", quality=60 + i % 35)
                sink.write(
                    {
                        "__key__": f"sample{i:08d}",
                        "jpg": buf.getvalue(),
                        "cls": str(i % 1000).encode(),
                        "json": json.dumps({"id": i, "caption": f"image number {i}"}).encode(),
                    }
                )
    for path in paths:
        Path(path + indextar.index.shard.INDEX_SUFFIX).unlink(missing_ok=True)
    stamp.touch()
    return paths


# -- raw random access -----------------------------------------------------------


@dataclass
class Row:
    name: str
    rate: float  # samples/s
    first: float | None = None  # s to first sample / batch
    rss: float | None = None  # MiB
    note: str = ""


REPEATS = 5


@dataclass
class RawReader:
    """One row of the raw-access table: ``make()`` returns a fresh ``get(i)`` (cold tables).

    ``per_call`` is how many samples one call returns (batches).
    """

    name: str
    make: Callable[[], Callable[[int], Any]]
    order: list[int]
    per_call: int = 1

    def once(self) -> Row:
        get = self.make()
        before = anon_rss_mib()
        start = time.perf_counter()
        get(self.order[0])
        first = time.perf_counter() - start
        for i in self.order[1:]:
            get(i)
        elapsed = time.perf_counter() - start
        return Row(
            self.name, len(self.order) * self.per_call / elapsed, first, anon_rss_mib() - before
        )


def time_raw(readers: list[RawReader]) -> list[Row]:
    """Best of ``REPEATS`` passes of each reader, interleaved: load that comes and goes on
    this shared machine then hits every reader alike, and the ratios hold."""
    best: dict[str, Row] = {}
    for _ in range(REPEATS):
        for reader in readers:
            row = reader.once()
            if reader.name not in best or row.rate > best[reader.name].rate:
                best[reader.name] = row
    return [best[reader.name] for reader in readers]


def raw_indextar(paths: list[str], order: list[int]) -> list[RawReader]:
    single = RawReader(
        "indextar `ds[i]`", lambda: indextar.IndexedTarDataset(paths).__getitem__, order
    )

    def make_loaded() -> Callable[[int], Any]:
        ds = indextar.IndexedTarDataset(paths)
        for start in ds._starts_list[:-1]:
            ds[start]  # load every shard's tables before the clock starts
        return ds.__getitem__

    loaded = RawReader("indextar `ds[i]`, tables already loaded", make_loaded, order)
    batches = [order[i : i + BATCH] for i in range(0, len(order), BATCH)]

    def make_batched() -> Callable[[int], Any]:
        ds = indextar.IndexedTarDataset(paths)
        return lambda b: ds.__getitems__(batches[b])

    batched = RawReader(
        "indextar `__getitems__` (64)",
        make_batched,
        list(range(len(batches))),
        len(order) // len(batches),
    )
    return [single, loaded, batched]


def raw_wids(paths: list[str], order: list[int]) -> RawReader:
    import wids

    counts = [indextar.open_index(p).meta.num_samples for p in paths]

    def make() -> Callable[[int], Any]:
        with contextlib.redirect_stderr(io.StringIO()):  # wids prints its configuration
            ds = wids.ShardListDataset(
                [{"url": p, "nsamples": n} for p, n in zip(paths, counts)],
                transformations=[],
                lru_size=SHARDS,
            )
        return ds.__getitem__

    return RawReader("wids `ShardListDataset`", make, order)


def raw_tarfile(paths: list[str], order: list[int], stack: contextlib.ExitStack) -> RawReader:
    files = [stack.enter_context(tarfile.open(p)) for p in paths]
    samples: list[list[tarfile.TarInfo]] = []
    owners: list[int] = []
    for n, tf in enumerate(files):
        current: dict[str, list[tarfile.TarInfo]] = {}
        for info in tf.getmembers():
            current.setdefault(info.name.split(".", 1)[0], []).append(info)
        samples.extend(current.values())
        owners.extend([n] * len(current))

    def get(i: int) -> dict[str, bytes]:
        tf = files[owners[i]]
        return {m.name.split(".", 1)[1]: tf.extractfile(m).read() for m in samples[i]}  # type: ignore[union-attr]

    return RawReader("tarfile, prebuilt members", lambda: get, order)


def raw_pread(paths: list[str], order: list[int], stack: contextlib.ExitStack) -> RawReader:
    spans: list[tuple[int, int, int]] = []
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        stack.callback(os.close, fd)
        samples = indextar.open_index(p).load_arrays().samples  # start, end, ...
        spans.extend(
            (fd, start, end - start)
            for start, end in zip(samples[:, 0].tolist(), samples[:, 1].tolist())
        )
    pread = os.pread

    def get(i: int) -> bytes:
        fd, offset, length = spans[i]
        return pread(fd, length, offset)

    return RawReader("`os.pread` floor (one read per sample)", lambda: get, order)


# -- DataLoader end to end ----------------------------------------------------------


def child_rss_mib() -> float:
    """Mean anonymous RSS of this process's children (the DataLoader workers), in MiB."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            pids.extend(f.read().split())
    sizes = []
    for pid in pids:
        try:
            sizes.append(anon_rss_mib(pid))
        except OSError:
            pass
    return sum(sizes) / max(1, len(sizes))


def loader_rows(paths: list[str], samples: int) -> list[Row]:
    import torch
    import webdataset
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)

    def run(name: str, make: Callable[[], Any], note: str) -> Row:
        loader = make()
        start = time.perf_counter()
        it = iter(loader)
        first_batch = next(it)
        first = time.perf_counter() - start
        count = len(first_batch[0])
        rss = 0.0
        for batch in it:
            count += len(batch[0])
            if not rss and count >= samples * 0.9:
                rss = child_rss_mib()
        elapsed = time.perf_counter() - start
        del it, loader
        return Row(name, count / elapsed, first, rss, note)

    def indextar_loader() -> Any:
        ds = indextar.IndexedTarDataset(paths, decode="torchrgb", keys=("jpg", "cls"))
        return DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS)

    def webdataset_loader() -> Any:
        pipeline = (
            webdataset.WebDataset(paths, shardshuffle=False, empty_check=False)
            .shuffle(1000)
            .decode("torchrgb")
            .to_tuple("jpg", "cls")
            .batched(BATCH)
        )
        return webdataset.WebLoader(pipeline, batch_size=None, num_workers=WORKERS)

    raw = indextar.IndexedTarDataset(paths, keys=("jpg", "cls"))
    in_memory = InMemory([raw[i] for i in range(len(raw))])

    def decode_only_loader() -> Any:
        return DataLoader(in_memory, batch_size=BATCH, shuffle=True, num_workers=WORKERS)

    pipelines = [
        ("indextar + DataLoader", indextar_loader, "global shuffle"),
        ("webdataset streaming", webdataset_loader, "shuffle buffer 1000"),
        ("decode only (bytes in memory)", decode_only_loader, "the limit"),
    ]
    best: dict[str, Row] = {}
    for _ in range(3):  # interleaved, best of three: this machine is shared
        for name, make, note in pipelines:
            row = run(name, make, note)
            if name not in best or row.rate > best[name].rate:
                best[name] = row
    return [best[name] for name, _, _ in pipelines]


class InMemory:
    """Samples already in memory; decoding them is all a loader can do at best."""

    def __init__(self, samples: list[tuple[bytes, bytes]]):
        self.samples = samples
        self.decoder = make_decoder("torchrgb")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        jpg, cls = self.samples[i]
        assert self.decoder is not None
        return self.decoder("jpg", jpg), self.decoder("cls", cls)


# -- report -------------------------------------------------------------------------


def table(raw: list[Row], loaders: list[Row], samples: int) -> str:
    by_name = {row.name: row for row in raw + loaders}
    wids_rate = by_name["wids `ShardListDataset`"].rate
    floor = by_name["`os.pread` floor (one read per sample)"].rate
    limit = by_name["decode only (bytes in memory)"].rate
    lines = [
        f"Raw random access, one process: a random permutation of all {samples} samples "
        "(jpg+cls+json), read as bytes.",
        "",
        "| reader | samples/s | × wids | % of pread floor | first sample (ms) "
        "| anon RSS growth (MiB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in raw:
        lines.append(
            f"| {row.name} | {row.rate:,.0f} | {row.rate / wids_rate:.1f} "
            f"| {100 * row.rate / floor:.0f}% "
            f"| {1000 * (row.first or 0):.1f} | {row.rss or 0:.1f} |"
        )
    lines += [
        "",
        f"DataLoader end to end: {WORKERS} workers, batch {BATCH}, JPEG → float CHW tensor "
        "(`torchrgb`), shuffled.",
        "",
        "| pipeline | samples/s | % of decode-only limit | first batch (s) "
        "| worker anon RSS (MiB) | order |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in loaders:
        lines.append(
            f"| {row.name} | {row.rate:,.0f} | {100 * row.rate / limit:.0f}% "
            f"| {row.first or 0:.2f} "
            f"| {row.rss or 0:.0f} | {row.note} |"
        )
    return "\n".join(lines) + "\n"


NOTES = """
## Reading the numbers

- The machine is shared (2 cores, other jobs running): rates move by ±30% between
  runs, so each raw row is the best of 5 passes and each DataLoader row the best of 3
  runs, interleaved across readers so that passing load hits them alike. Since a
  sample's members are copied straight out of the map in C (`indextar/source/_mapread.c`),
  cold `ds[i]` has measured 64-65% of the pread floor and 5.6× wids, and
  `__getitems__` 68-72% (before: 44-55% and 59-65%); the DataLoader 95-98% of the
  decode-only limit. Runs while tests used both cores went as low as 42% of the
  floor and 67% of the limit.
- Opening a shard reads its reader arrays from the index's `arrays` table (one query,
  `np.frombuffer`): about 0.15 ms for a 2,000-sample shard, where converting the
  `samples` and `members` rows took 6-7.5 ms, more than reading all of its samples.
  Checking the index against the shard on first open (size, mtime, fingerprint of
  the first and last 64 KiB) adds about 0.3 ms.
- The floor is one `os.pread` per sample from a Python list of precomputed offsets:
  no lookup, no key, no split into members. What `ds[i]` adds, in CPU time per
  sample: an `fstat` of the mapped file per read, in C, that refuses a shard changed
  in place (about 0.6 µs); the check that the span still begins with the sample's
  own tar headers, a checksum of 512 bytes and a name compare (issue 12: about 0.2
  µs, mostly the 8 cache lines of the header); locating the shard, the C copy of
  each member and building the dict (about 1.6 µs). With both checks on, `ds[i]`
  has measured 56-63% of the floor over five runs on a shared machine, 62% once
  `_mapread.members` parsed its arguments by hand (64-65% before the checks; an
  interleaved A/B on one shard puts `ds[i]` now 1-7% faster than with the checks and
  the old argument parsing). A truncation landing between the `fstat` and the copy
  raises the same error: the copy catches the `SIGBUS`.
- `__getitems__` reads a batch shard by shard: one `fstat` per shard and batch, not
  per sample.
- "anon RSS" is resident memory not backed by files (statm resident - shared). Mapped
  shard pages are page cache and show up in plain RSS as the file is read; they are
  shared between workers and released when a shard leaves the LRU.
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--data", type=Path, default=ROOT / "bench-data" / "dataset")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-dataset.md")
    parser.add_argument(
        "--skip-loader", action="store_true", help="only the raw random-access part"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    paths = make_data(args.data, args.samples)
    for path in paths:  # (re)build indexes outside the timings, in this indextar's format
        indextar.build_index(path, force=True)
    order = list(range(args.samples))
    random.Random(0).shuffle(order)
    for path in paths:  # warm the page cache so every reader sees the same state
        Path(path).read_bytes()

    with contextlib.ExitStack() as stack:
        raw = time_raw(
            [
                *raw_indextar(paths, order),
                raw_wids(paths, order),
                raw_tarfile(paths, order, stack),
                raw_pread(paths, order, stack),
            ]
        )
    loaders = [] if args.skip_loader else loader_rows(paths, args.samples)
    if args.skip_loader:
        for row in raw:
            print(f"{row.name}: {row.rate:,.0f} samples/s")
        return
    report = table(raw, loaders, args.samples)
    print(report)
    header = (
        "# IndexedTarDataset benchmarks\n\n"
        f"Made by `python tools/bench_dataset.py` on {os.cpu_count()} cores "
        f"(Python {sys.version.split()[0]}). Targets: raw access ≥ 4× wids and ≥ 50% of the "
        "pread floor; DataLoader ≥ 95% of the decode-only limit and not below webdataset.\n\n"
    )
    args.out.write_text(header + report + NOTES)


if __name__ == "__main__":
    main()
