"""Benchmark ``indextar convert`` from parquet with image bytes (issue 29).

The source: parquet files with an ``image`` column of JPEG-sized bytes and the columns
img2dataset writes beside it (``caption``, ``width``, ``height``, ``similarity``). Timed:

- ``indextar convert`` on 1 process and on 2 (each shard indexed, with the columns in
  each index's attribute table);
- img2dataset-style writing: each parquet file read with pyarrow, and every row written
  sample by sample (``jpg``, ``txt``, ``json``) with webdataset's ``ShardWriter``, one
  file per process, on 1 process and on 2.

Throughput is MB/s of shards written. Cases run interleaved, round by round; the best
round counts. Target: indextar at least 2x the webdataset writer on the same processes.

Usage::

    python tools/bench_convert.py [--quick] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import webdataset as wds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import interleaved, timed  # noqa: E402

from indextar.write.convert import convert  # noqa: E402

ROWS, QUICK_ROWS = 4_000, 400
FILES = 2
IMAGE_BYTES = (10_000, 60_000)
MAXCOUNT = 500


def make_source(folder: Path, rows: int) -> Path:
    """``FILES`` parquet files of ``rows`` rows in all, row groups of 100 rows."""
    rng = np.random.default_rng(0)
    pool = [rng.bytes(int(n)) for n in rng.integers(*IMAGE_BYTES, size=200)]
    per_file = rows // FILES
    for f in range(FILES):
        numbers = range(f * per_file, (f + 1) * per_file)
        table = pa.table(
            {
                "key": [f"{i:09d}" for i in numbers],
                "image": pa.array([pool[i % len(pool)] for i in numbers], pa.binary()),
                "caption": [f"a photo of thing number {i}" for i in numbers],
                "width": [256 + i % 7 for i in numbers],
                "height": [256 + i % 5 for i in numbers],
                "similarity": [0.25 + (i % 100) / 400 for i in numbers],
            }
        )
        pq.write_table(table, folder / f"part-{f:05d}.parquet", row_group_size=100)
    return folder


def _webdataset_file(job: tuple[str, str]) -> int:
    """One parquet file to shards, as img2dataset writes: row by row with ShardWriter."""
    source, pattern = job
    written = 0
    with wds.ShardWriter(pattern, maxcount=MAXCOUNT, verbose=0) as sink:
        parquet = pq.ParquetFile(source)
        for group in range(parquet.num_row_groups):
            for row in parquet.read_row_group(group).to_pylist():
                meta = {k: row[k] for k in ("key", "caption", "width", "height", "similarity")}
                sink.write(
                    {
                        "__key__": row["key"],
                        "jpg": row["image"],
                        "txt": row["caption"],
                        "json": json.dumps(meta).encode(),
                    }
                )
                written += 1
    return written


def webdataset_writer(source: Path, out: Path, processes: int) -> None:
    jobs = [
        (str(file), str(out / f"{file.stem}-%06d.tar")) for file in sorted(source.glob("*.parquet"))
    ]
    if processes == 1:
        for job in jobs:
            _webdataset_file(job)
        return
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        pool.map(_webdataset_file, jobs)


def indextar_convert(source: Path, out: Path, processes: int) -> None:
    convert(
        source,
        str(out / "d-%06d.tar"),
        key="key",
        members={"jpg": "image"},
        maxcount=MAXCOUNT,
        jobs=processes,
    )


def _case(
    write: Callable[[Path, Path, int], None], source: Path, scratch: Path, processes: int
) -> Callable[[], float]:
    def run() -> float:
        out = scratch / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        seconds, _ = timed(lambda: write(source, out, processes))
        written = sum(p.stat().st_size for p in out.glob("*.tar"))
        return written / seconds / 1e6

    return run


def run(
    report: Callable[[str], None] = print, *, quick: bool = False, folder: str | None = None
) -> dict[str, float]:
    rows = QUICK_ROWS if quick else ROWS
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        scratch = Path(tmp)
        source = make_source(Path(tmp), rows)
        size = sum(p.stat().st_size for p in source.glob("*.parquet"))
        cases = {}
        for processes in (1, 2):
            cases[f"webdataset ShardWriter, {processes} proc"] = _case(
                webdataset_writer, source, scratch, processes
            )
            cases[f"indextar convert, {processes} proc"] = _case(
                indextar_convert, source, scratch, processes
            )
        figures = interleaved(cases, rounds=1 if quick else 3)
    best = {name: max(values) for name, values in figures.items()}
    report(
        f"{rows:,} rows of parquet ({size / 1e6:.0f} MB, {FILES} files, image bytes "
        f"{IMAGE_BYTES[0] // 1000}-{IMAGE_BYTES[1] // 1000} KB), {MAXCOUNT} rows a shard; "
        "MB/s of shards written, best of the rounds:"
    )
    report("")
    report("| writer | MB/s | vs webdataset, same processes |")
    report("| --- | ---: | ---: |")
    for name, value in best.items():
        processes = name.rsplit(", ", 1)[1]
        base = best[f"webdataset ShardWriter, {processes}"]
        report(f"| {name} | {value:,.0f} | {value / base:.2f}x |")
    report("")
    for processes in ("1 proc", "2 proc"):
        ratio = (
            best[f"indextar convert, {processes}"] / best[f"webdataset ShardWriter, {processes}"]
        )
        report(
            f"{'PASS' if ratio >= 2 else 'FAIL'}: convert on {processes} is {ratio:.2f}x the "
            "webdataset writer (target 2x)"
        )
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", help="where the data is written (default: the temp folder)")
    args = parser.parse_args()
    run(quick=args.quick, folder=args.dir)


if __name__ == "__main__":
    main()
