"""Remote-shard benchmark against loopback HTTP servers (tools/loopback_servers.py).

Measures, on shards it writes itself:

* streaming samples/s: StreamingTarDataset vs webdataset's WebDataset, same URLs;
* random access samples/s: remote="ranges" (1 process, batches of 64 via __getitems__;
  DataLoader with 2 workers), remote="cache" after warm-up, and local files;
* bytes fetched per sample against the sample's span;
* with 20 ms added to every response: ranges one request at a time vs 64 in flight;
* bytes fetched per shard by a remote index build: streamed (small members), and
  the ranged header scan of a shard of 256 KiB members (target: under 1%).

Prints a Markdown table and writes it into docs/benchmarks-remote.md between the
``bench_remote_loopback`` markers (``--no-write`` to skip). Run:
``python tools/bench_remote.py --loopback``.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import random
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_remote import write_doc, write_shards  # noqa: E402
from loopback_servers import HttpServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def rate(count: int, run: Callable[[], int]) -> float:
    print(".", end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    done = run()
    assert done == count, (done, count)
    return count / (time.perf_counter() - start)


def row(what: str, rate: float, baseline: float, unit: str) -> tuple[str, str, str]:
    """A table row: a rate in samples/s and its ratio to ``baseline``."""
    return (what, f"{rate:,.0f} samples/s", f"{rate / baseline:.2f}{unit}")


def index_builds(folder: Path, http: HttpServer, small: Path) -> list[tuple[str, str, str]]:
    """Bytes each remote index build fetches: streamed, and by ranged reads of the headers."""
    from indextar.index.remote import scan_remote_shard

    rng = random.Random(2)
    big = folder / "k256.tar"
    with tarfile.open(big, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(256):
            info = tarfile.TarInfo(f"k{i:05d}.bin")
            info.size = 256 << 10
            tf.addfile(info, io.BytesIO(rng.randbytes(info.size)))
    rows = []
    for shard, mode in ((small, "auto"), (big, "auto"), (big, "ranged")):
        start = time.perf_counter()
        build = scan_remote_shard(
            http.url(shard.name),
            index_dir=folder / f"build-{mode}",
            mode=mode,  # type: ignore[arg-type]
        )
        seconds = time.perf_counter() - start
        size = shard.stat().st_size
        rows.append(
            (
                f"index build of {shard.name} ({size / 1e6:.0f} MB), {mode} -> {build.mode}",
                f"{build.bytes_fetched / 1e6:,.2f} MB fetched in {seconds:.2f} s",
                f"{build.bytes_fetched / size:.2%} of the shard",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=500)
    parser.add_argument(
        "--size", type=int, default=10_000, help="bytes of each sample's jpg member"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch.utils.data
    import webdataset as wds

    from indextar import IndexedTarDataset, StreamingTarDataset

    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_shards(folder, args.shards, args.per_shard, args.size)
        total = args.shards * args.per_shard
        with HttpServer(folder) as http, HttpServer(folder, delay_ms=20) as slow:
            urls = [http.url(p.name) for p in paths]

            # -- streaming -------------------------------------------------------------
            ours = max(
                rate(total, lambda: sum(1 for _ in StreamingTarDataset(urls))) for _ in range(2)
            )
            theirs = max(
                rate(total, lambda: sum(1 for _ in wds.WebDataset(urls, shardshuffle=False)))
                for _ in range(2)
            )
            rows.append(
                (
                    "streaming, indextar",
                    f"{ours:,.0f} samples/s",
                    f"{ours / theirs:.2f}x webdataset",
                )
            )
            rows.append(("streaming, webdataset 1.0.2", f"{theirs:,.0f} samples/s", "1.00x"))

            # -- random access -------------------------------------------------------
            order = list(range(total))
            random.Random(1).shuffle(order)
            batches = [order[i : i + 64] for i in range(0, total, 64)]
            local = IndexedTarDataset([str(p) for p in paths], index_dir=folder / "local-ix")

            def batched(ds: IndexedTarDataset) -> int:
                return sum(len(ds.__getitems__(b)) for b in batches)

            batched(local)
            local_rate = max(rate(total, lambda: batched(local)) for _ in range(2))
            ranges = IndexedTarDataset(urls, remote="ranges", index_dir=folder / "ix")
            http.reset()
            ranges_rate = rate(total, lambda: batched(ranges))
            fetched = sum(v["bytes"] for v in http.stats().values())
            spans = 0
            for n in range(args.shards):
                samples = ranges.shard_index(n).load_arrays().samples
                spans += int((samples[:, 1] - samples[:, 0]).sum())
            loader = torch.utils.data.DataLoader(
                ranges, batch_size=64, sampler=order, num_workers=2, collate_fn=lambda b: len(b)
            )
            sum(loader)  # start-up once
            loader_rate = rate(total, lambda: sum(loader))
            cache = IndexedTarDataset(
                urls,
                remote="cache",
                index_dir=folder / "ix",
                cache_dir=folder / "cache",
                cache_limit="10GB",
            )
            batched(cache)  # warm-up: downloads every shard
            # Cache and local files interleaved, best of three each: a run of one right
            # after the other (or after the HTTP tests) meets a different machine.
            cache_rate = 0.0
            for _ in range(3):
                cache_rate = max(cache_rate, rate(total, lambda: batched(cache)))
                local_rate = max(local_rate, rate(total, lambda: batched(local)))
            rows += [
                ("random, local files (batches of 64)", f"{local_rate:,.0f} samples/s", "1.00x"),
                row("random, ranges, 1 process", ranges_rate, local_rate, "x local"),
                row("random, ranges, DataLoader 2 workers", loader_rate, local_rate, "x local"),
                row("random, cache (warm)", cache_rate, local_rate, "x local"),
                (
                    "bytes fetched per sample (ranges)",
                    f"{fetched / total:,.0f} B",
                    f"{fetched / spans:.3f}x the sample's span",
                ),
            ]

            # -- 20 ms per response --------------------------------------------------
            delayed = IndexedTarDataset(
                [slow.url(p.name) for p in paths], remote="ranges", index_dir=folder / "slow-ix"
            )
            delayed[0]  # opens the index; the per-process HEAD is paid once
            one = order[:50]
            single = rate(len(one), lambda: sum(1 for i in one if delayed[i]))
            many = order[: 64 * 10]
            in_flight = rate(
                len(many),
                lambda: sum(
                    len(delayed.__getitems__(many[i : i + 64])) for i in range(0, len(many), 64)
                ),
            )
            rows += [
                ("20 ms delay: ranges, one request at a time", f"{single:,.1f} samples/s", "1.00x"),
                (
                    "20 ms delay: ranges, 64 in flight",
                    f"{in_flight:,.1f} samples/s",
                    f"{in_flight / single:.1f}x one at a time",
                ),
            ]

            # -- building the index of a remote shard: bytes fetched ------------------
            rows += index_builds(folder, http, paths[0])

    table = "\n".join(
        ["| case | rate | ratio |", "| --- | ---: | ---: |"]
        + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    )
    print(table)
    if not args.no_write:
        machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        text = f"""Measured by `tools/bench_remote.py --loopback` against aiohttp servers on
127.0.0.1 ({args.shards} shards x {args.per_shard} samples of {args.size:,} + 1 bytes;
{machine}). Loopback has no latency, so the last two rows add 20 ms to every response.

{table}

Targets: streaming at least 1.5x webdataset's; with 20 ms delay, 64 ranges in flight at
least 20x one at a time; `cache` after warm-up within 10% of local files."""
        write_doc(text, "bench_remote_loopback")


if __name__ == "__main__":
    main()
