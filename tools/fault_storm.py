"""Fault storm: random remote samples through DataLoader workers, from a misbehaving server.

Writes ``--shards`` shards, serves them through the fault-injecting server of
``tools/loopback_servers.py`` (``/faulty/`` over HTTP, or with ``--s3`` a proxy in
front of SeaweedFS), and reads ``--samples`` random samples through a DataLoader
(``--batch`` per batch, ``--workers`` workers), by ``__getitems__`` and by ``ds[i]``,
under three plans: no faults; 10% 503 with ``Retry-After``; and the storm of issue 26
(10% 503, 5% resets, 5% short bodies, 5% wrong ranges, 5% whole objects). Every
sample is compared with the same sample read from the local file. Reports, per plan
and path: samples/s, faults injected by kind, wrong samples (must be 0), and reads
that failed with an error not naming its URL, range and sample (must be 0).

Each ``(object, range)`` is faulted at most ``--per-range`` times, so that every read
can succeed within the default 5 attempts; ``--per-range 0`` lifts the cap, and reads
whose retries are spent are then counted (and must name their sample).

Usage::

    python tools/fault_storm.py --samples 600                  # HTTP
    python tools/fault_storm.py --samples 600 --s3             # through SeaweedFS
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import random
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loopback_servers import FaultPlan, HttpServer, SeaweedServer  # noqa: E402

PLANS = {
    "none": FaultPlan(),
    "503": FaultPlan(busy=0.1, retry_after="1"),
    "storm": FaultPlan(
        busy=0.1,
        retry_after="1",
        reset=0.05,
        short=0.05,
        wrong_range=0.05,
        whole=0.05,
        shifts=(None, 1024, 512),
    ),  # fmt: skip
}


def write_shards(folder: Path, shards: int, per_shard: int, seed: int) -> list[Path]:
    rng = random.Random(seed)
    paths = []
    for s in range(shards):
        path = folder / f"storm-{s:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(per_shard):
                for ext, size in (("cls", 8), ("bin", rng.randrange(100, 60_000))):
                    data = rng.randbytes(size)
                    info = tarfile.TarInfo(f"s{s:03d}k{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


class Guarded:
    """A dataset whose batches come back as ``(samples, error message)``: a read whose
    retries are spent is counted, and the epoch goes on."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> Any:
        from indextar.errors import RemoteReadError

        try:
            if len(indices) == 1:
                return [self.dataset[indices[0]]], None
            return self.dataset.__getitems__(indices), None
        except RemoteReadError as e:
            return [], (str(e), e.url, e.key, e.offset)


def storm(args: argparse.Namespace, folder: Path, server: HttpServer, urls: list[str],
          options: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    from torch.utils.data import DataLoader

    from indextar import IndexedTarDataset

    local = IndexedTarDataset(sorted(str(p) for p in folder.glob("*.tar")), index_dir=folder / "l")
    server.set_faults(FaultPlan())
    remote = IndexedTarDataset(urls, index_dir=folder / "r", storage_options=options)
    order = random.Random(args.seed).choices(range(len(remote)), k=args.samples)
    results: dict[str, Any] = {}
    for name, plan in PLANS.items():
        for how, batch in (("__getitems__", args.batch), ("ds[i]", 1)):
            server.set_faults(
                FaultPlan(**{**plan.__dict__, "per_range": args.per_range, "seed": args.seed})
            )
            loader = DataLoader(
                Guarded(remote), batch_size=batch, sampler=order, num_workers=args.workers,
                collate_fn=lambda got: got,
            )  # fmt: skip
            started = time.perf_counter()
            got, errors = [], []
            for samples, error in loader:
                got.extend(samples)
                if error is not None:
                    errors.append(error)
            seconds = time.perf_counter() - started
            wrong = 0
            for sample in got:
                truth = local[sample["__index__"]]
                wrong += any(sample[k] != truth[k] for k in ("__key__", "cls", "bin"))
            unnamed = sum(
                not (url in msg and key is not None and key in msg and f"bytes {offset}-" in msg)
                for msg, url, key, offset in errors
            )
            faults: dict[str, int] = {}
            for _, _, _, fault in server.faults():
                faults[fault] = faults.get(fault, 0) + 1
            results[f"{name} {how}"] = {
                "samples": len(got), "samples_per_s": round(len(got) / seconds, 1),
                "faults": faults, "wrong": wrong, "spent": len(errors),
                "errors_not_naming_the_sample": unnamed,
            }  # fmt: skip
            print(f"{name:6} {how:13} {json.dumps(results[f'{name} {how}'])}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--per-shard", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-range", type=int, default=3)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--s3", action="store_true", help="through SeaweedFS, not /faulty/")
    parser.add_argument("--json", action="store_true", help="print the results as JSON last")
    args = parser.parse_args()
    logging.getLogger("indextar").setLevel(logging.ERROR)  # not a warning per retry
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = write_shards(folder, args.shards, args.per_shard, args.seed)
        if args.s3:
            with SeaweedServer(folder / "seaweed") as s3:
                s3.upload("shards", paths)
                upstream = f"http://127.0.0.1:{s3.port}"
                with HttpServer(folder, upstream=upstream) as proxy:
                    options = {
                        **s3.storage_options(), "endpoint_url": f"http://127.0.0.1:{proxy.port}"
                    }  # fmt: skip
                    urls = [f"s3://shards/{p.name}" for p in paths]
                    results = storm(args, folder, proxy, urls, options)
        else:
            with HttpServer(folder) as http:
                urls = [http.url(p.name, mode="faulty") for p in paths]
                results = storm(args, folder, http, urls, {})
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
