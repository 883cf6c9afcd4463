"""Benchmark Ray Data reads (issue 29, 2): ``indextar.ray.read_indextar`` against
``ray.data.read_webdataset`` on the same shards, with and without a selection.

8 shards of 1,250 samples each (10,000): a 10 KiB ``jpg`` of random bytes, a ``cls``
and a ``json`` label from 0 to 99, indexed with ``attributes_from="json"``. On a local
Ray (``ray.init(num_cpus=2)``), each dataset is read to the end on the driver
(``iter_batches``, Arrow batches), rows counted:

* every sample: ``read_indextar(paths)`` against ``read_webdataset(paths, decoder=None)``;
* one in ten (``label < 10``): ``read_indextar(paths, where="label < 10")``, which
  reads only those samples, against ``read_webdataset(...)`` filtered row by row
  (``.filter(fn)``) and a batch at a time (``.map_batches``), which read every sample
  and parse its ``json`` to keep it or not. The target is judged against the faster.

Rows/s: the best of 3 rounds, the cases interleaved, after one warm-up read of each (a
warm page cache, Ray's workers started). The target: at least 5x with the filter.

Run ``python tools/bench_ray.py [--quick]`` or ``python tools/bench.py ray``. Shards are
generated once into ``bench-data/ray-*``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

import pyarrow as pa  # noqa: E402
import ray  # noqa: E402
from benchlib import interleaved  # noqa: E402

import indextar  # noqa: E402
import indextar.ray  # noqa: E402

SHARDS, SIZE = 8, 10 * 1024
WHERE = "label < 10"


def _write(folder: Path, per_shard: int) -> list[str]:
    paths = [folder / f"part-{s}.tar" for s in range(SHARDS)]
    if not all(p.exists() for p in paths):
        folder.mkdir(parents=True, exist_ok=True)
        for s, path in enumerate(paths):
            with indextar.TarWriter(path, index=False) as sink:
                for i in range(s * per_shard, (s + 1) * per_shard):
                    sink.write(
                        {
                            "__key__": f"s{i:07d}",
                            "jpg": random.Random(i).randbytes(SIZE),
                            "cls": str(i % 1000).encode(),
                            "json": json.dumps({"label": i % 100}).encode(),
                        }
                    )
    for path in paths:
        indextar.build_index(path, attributes_from="json")
    return [str(p) for p in paths]


def _kept(row: dict[str, Any]) -> bool:
    label: int = json.loads(row["json"])["label"]
    return label < 10


def _kept_rows(batch: pa.Table) -> pa.Table:
    """The rows of a batch whose ``json`` label is below 10: ``filter`` a batch at a time."""
    labels = [json.loads(data)["label"] for data in batch.column("json").to_pylist()]
    return batch.filter(pa.array([label < 10 for label in labels]))


def _rows_per_s(make: Callable[[], Any]) -> Callable[[], float]:
    def case() -> float:
        start = time.perf_counter()
        rows = sum(len(b) for b in make().iter_batches(batch_size=None, batch_format="pyarrow"))
        return rows / (time.perf_counter() - start)

    return case


def run(report: Callable[[str], None] = print, *, quick: bool = False) -> dict[str, Any]:
    per_shard = 100 if quick else 1_250
    paths = _write(REPO / "bench-data" / f"ray-{per_shard}", per_shard)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        cases = {
            "indextar": lambda: indextar.ray.read_indextar(paths),
            "webdataset": lambda: ray.data.read_webdataset(paths, decoder=None),
            "indextar where": lambda: indextar.ray.read_indextar(paths, where=WHERE),
            "webdataset filter": lambda: ray.data.read_webdataset(paths, decoder=None).filter(
                _kept
            ),
            "webdataset map_batches": lambda: ray.data.read_webdataset(
                paths, decoder=None
            ).map_batches(_kept_rows, batch_format="pyarrow"),
        }
        for make in cases.values():  # warm-up: workers, page cache, selection cache
            _rows_per_s(make)()
        figures = interleaved({n: _rows_per_s(m) for n, m in cases.items()}, 1 if quick else 3)
    finally:
        if started:
            ray.shutdown()
    best = {name: max(f) for name, f in figures.items()}
    report(f"{SHARDS} shards of {per_shard:,} samples (a {SIZE // 1024} KiB jpg, cls, json)")
    report("")
    report("| rows | indextar.ray.read_indextar | ray.data.read_webdataset | ratio |")
    report("|---|---:|---:|---:|")
    for label, ours, theirs in (
        ("all", "indextar", "webdataset"),
        (f"`{WHERE}` (10%), `.filter(row)`", "indextar where", "webdataset filter"),
        (f"`{WHERE}` (10%), `.map_batches`", "indextar where", "webdataset map_batches"),
    ):
        ratio = best[ours] / best[theirs]
        report(
            f"| {label} | {best[ours]:,.0f} rows/s | {best[theirs]:,.0f} rows/s | {ratio:.2f}x |"
        )
    # Judged against webdataset's faster way to filter.
    theirs = max(best["webdataset filter"], best["webdataset map_batches"])
    ratio = best["indextar where"] / theirs
    report(f"- {'PASS' if ratio >= 5 else 'FAIL'} with the 10% where: indextar >= 5x: {ratio:.2f}x")
    report("")
    return {"rows_per_s": best, "figures": figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    run(quick=parser.parse_args().quick)


if __name__ == "__main__":
    main()
