"""Read-ahead benchmark: remote="ranges" with and without ``ReadAheadBatches``.

Writes shards of ~100 KB samples, serves them from the loopback HTTP server
(tools/loopback_servers.py) with ``--delay-ms`` added to every response, and reads one
epoch in i.i.d. order through a DataLoader (0 and 2 fork workers), batches of 64:
plainly (each batch's spans in flight together, batches one after another) and with
read-ahead (``ReadAheadBatches`` + ``prefetch_bytes``). ``--s3`` reads the same shards
from SeaweedFS S3 behind the same server as a delaying proxy.

For each run: samples/s with the DataLoader's start included, client CPU per sample
(this process and its reaped workers), bytes fetched per sample as counted at the
server against the samples' spans. Run A/B in one invocation; the machine's load is
printed with the table. ``python tools/bench_readahead.py --delay-ms 0 20``.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loopback_servers import HttpServer, SeaweedServer  # noqa: E402
from procstats import cpu_seconds  # noqa: E402

from indextar.source import prefetch  # noqa: E402


def write_shards(folder: Path, shards: int, per_shard: int, size: int) -> list[Path]:
    rng = random.Random(0)
    paths = []
    for s in range(shards):
        path = folder / f"ra-{s:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per_shard):
                for ext, data in (("jpg", rng.randbytes(size)), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"s{s:03d}_{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def one_run(
    urls: list[str], index_dir: Path, options: dict[str, Any], workers: int, ahead: bool,
    batch: int, budget: int,
) -> tuple[float, float, int]:  # fmt: skip
    from torch.utils.data import DataLoader

    from indextar import IndexedTarDataset, ReadAheadBatches, ResumableSampler

    cpu, start = cpu_seconds(), time.perf_counter()
    ds = IndexedTarDataset(
        urls, index_dir=index_dir, keys=("jpg", "cls"), storage_options=options,
        prefetch_bytes=budget,
    )  # fmt: skip
    sampler = ResumableSampler(ds, seed=1)
    chosen: dict[str, Any] = (
        {"batch_sampler": ReadAheadBatches(sampler, batch)}
        if ahead
        else {"sampler": sampler, "batch_size": batch}
    )
    loader = DataLoader(
        ds, num_workers=workers, collate_fn=list,
        multiprocessing_context="fork" if workers else None, **chosen,
    )  # fmt: skip
    count = sum(len(b) for b in loader)
    del loader  # its workers are reaped: their CPU counts
    elapsed = time.perf_counter() - start
    assert count == len(ds), (count, len(ds))
    return count / elapsed, (cpu_seconds() - cpu) / count * 1000, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--per-shard", type=int, default=200)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0.0, 20.0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--prefetch-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case; median kept")
    parser.add_argument("--chunk", type=int, nargs="+", default=[16], help="spans per fetch call")
    parser.add_argument("--in-flight", type=int, default=128)
    parser.add_argument("--s3", action="store_true", help="SeaweedFS S3 behind the delay proxy")
    args = parser.parse_args()
    budget = args.prefetch_mib << 20
    prefetch.DEFAULT_IN_FLIGHT = args.in_flight
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_shards(folder, args.shards, args.per_shard, args.size)
        span = sum(p.stat().st_size for p in paths) / (args.shards * args.per_shard)
        seaweed = SeaweedServer(folder / "weed").__enter__() if args.s3 else None
        try:
            if seaweed is not None:
                seaweed.upload("shards", paths)
            rows = []
            for delay in args.delay_ms:
                upstream = (
                    seaweed.storage_options()["client_kwargs"]["endpoint_url"] if seaweed else ""
                )
                with HttpServer(folder, delay_ms=delay, upstream=upstream) as http:
                    if seaweed is not None:
                        urls = [f"s3://shards/{p.name}" for p in paths]
                        options = {**seaweed.storage_options()}
                        options["endpoint_url"] = f"http://127.0.0.1:{http.port}"
                    else:
                        urls, options = [http.url(p.name) for p in paths], {}
                    index_dir = folder / f"ix-{delay}"
                    one_run(urls, index_dir, options, 0, False, args.batch, budget)  # indexes
                    cases = [(w, c) for w in args.workers for c in [0, *args.chunk]]
                    runs: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
                    for _ in range(args.repeat):  # A/B interleaved: the load drifts
                        for workers, chunk in cases:
                            prefetch.DEFAULT_CHUNK = chunk or prefetch.DEFAULT_CHUNK
                            http.reset()
                            speed, cpu_ms, count = one_run(
                                urls, index_dir, options, workers, chunk > 0, args.batch, budget
                            )
                            fetched = sum(e["bytes"] for e in http.stats().values())
                            runs.setdefault((workers, chunk), []).append(
                                (speed, cpu_ms, fetched / count / span)
                            )
                            print(".", end="", file=sys.stderr, flush=True)
                    for (workers, chunk), measured in runs.items():
                        middle = sorted(measured)[len(measured) // 2]
                        rows.append((delay, workers, chunk, *middle))
        finally:
            if seaweed is not None:
                seaweed.__exit__(None, None, None)
    print(file=sys.stderr)
    store = "SeaweedFS S3 behind the proxy" if args.s3 else "aiohttp HTTP"
    load = os.getloadavg()[0]
    print(f"{args.shards} shards x {args.per_shard} samples of {args.size} B, batches of "
          f"{args.batch}, {store}; load average {load:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    print(f"medians of {args.repeat} interleaved runs; read-ahead: {args.in_flight} in flight, "
          f"prefetch_bytes {args.prefetch_mib} MiB")  # fmt: skip
    print("\n| delay | workers | read-ahead | samples/s | CPU ms/sample | bytes/span |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for delay, workers, chunk, speed, cpu_ms, ratio in rows:
        ahead = f"chunks of {chunk}" if chunk else "no"
        print(f"| {delay:g} ms | {workers} | {ahead} | {speed:,.0f} | {cpu_ms:.2f} | "
              f"{ratio:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
