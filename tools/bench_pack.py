"""Benchmark sequence packing (issue 27): padding against the peers, planning, reading.

1. **Padding** on the same lengths, three distributions at ``max_length=4096``: a
   log-normal like web text (median 400 tokens), a bimodal one like SFT data (70%
   of 20-200 tokens, 30% of 1,500-4,000) and a uniform one (1-4,096). Each packer runs
   through its own API on the same lengths: indextar's ``plan_packs`` (best-fit,
   first-fit, concat-split), Grain's ``BestFitPackIterDataset`` and
   ``FirstFitPackIterDataset``, TRL's ``pack_dataset(strategy="bfd")`` and
   torchtune's ``PackedDataset``, where they import (from ``--peers``, a folder they
   were installed into with ``pip install --target``, appended to ``sys.path`` so
   that the venv's numpy and torch stay first). Padding is the fraction of the packs'
   slots without a token; tokens a packer drops (truncation) are counted apart.
2. **Planning** ``plan_packs`` (each strategy) at 1e6 and 1e7 log-normal lengths
   (1e8 with ``--large``), each in a fresh process: seconds, and the peak resident
   memory the planning added over the lengths themselves, per document.
3. **Reading**: tokens per second through a DataLoader with 2 workers, packs
   (``PackedDataset`` + ``collate_packs``, int64 and int32) against the same documents
   read unpacked from the same shards: made into the same tensors (end to end, no
   padding), padded to each batch's longest, and bare (tokens concatenated, no tensors).

4. **Opening** a ``PackedDataset`` of 1e6 documents, planned against loaded from the
   plan cache.

Run ``python tools/bench_pack.py [--quick] [--peers DIR] [--large] [--tables ...]`` or
``python tools/bench.py pack``. The machine may be shared: the reading rows are
interleaved rounds, and their ratio is what to read.
"""

from __future__ import annotations

import argparse
import json
import logging
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

sys.path.insert(0, str(REPO / "tools"))
from benchlib import interleaved  # noqa: E402
from procstats import rate_and_cpu  # noqa: E402

MAX_LENGTH = 4096
log = logging.getLogger("bench_pack")
Report = Callable[[str], None]


def distributions(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lognormal = np.clip(rng.lognormal(np.log(400), 1.0, n), 1, 4 * MAX_LENGTH).astype(np.int64)
    short = rng.random(n) < 0.7
    bimodal = np.where(short, rng.integers(20, 201, n), rng.integers(1500, 4001, n))
    uniform = rng.integers(1, MAX_LENGTH + 1, n)
    return {"log-normal": lognormal, "bimodal": bimodal, "uniform": uniform}


# -- the packers: each gives (packs, tokens in them) ----------------------------------


def indextar_packer(strategy: str) -> Callable[[np.ndarray], tuple[int, int]]:
    def pack(lengths: np.ndarray) -> tuple[int, int]:
        plan = indextar.plan_packs(lengths, MAX_LENGTH, strategy=strategy)  # type: ignore[arg-type]
        return len(plan), plan.tokens

    return pack


def grain_packer(kind: str) -> Callable[[np.ndarray], tuple[int, int]] | None:
    try:
        from grain import experimental as gx
        from grain import python as gp
    except Exception:  # noqa: BLE001 - a peer that does not import is left out
        return None
    make = getattr(gx, f"{kind}PackIterDataset", None)
    if make is None:
        return None

    def pack(lengths: np.ndarray) -> tuple[int, int]:
        docs = gp.MapDataset.source(lengths.tolist()).map(
            lambda n: {"tokens": np.ones(min(int(n), MAX_LENGTH), np.int32)}
        )
        packed = make(
            docs.to_iter_dataset(), length_struct={"tokens": MAX_LENGTH}, num_packing_bins=64
        )
        packs = tokens = 0
        for example in packed:
            packs += 1
            tokens += int(np.count_nonzero(example["tokens_segment_ids"]))
        return packs, tokens

    return pack


def trl_packer() -> Callable[[np.ndarray], tuple[int, int]] | None:
    try:
        from datasets import Dataset
        from trl import pack_dataset
    except Exception:  # noqa: BLE001
        return None

    def pack(lengths: np.ndarray) -> tuple[int, int]:
        ds = Dataset.from_dict({"input_ids": [[1] * int(n) for n in lengths]})
        packed = pack_dataset(ds, seq_length=MAX_LENGTH, strategy="bfd")
        sizes = [len(row) for row in packed["input_ids"]]
        return len(sizes), int(sum(sizes))

    return pack


def torchtune_packer() -> Callable[[np.ndarray], tuple[int, int]] | None:
    try:
        from torchtune.datasets import PackedDataset
    except Exception:  # noqa: BLE001
        return None

    class Docs:
        def __init__(self, lengths: np.ndarray) -> None:
            self.lengths = lengths

        def __len__(self) -> int:
            return len(self.lengths)

        def __getitem__(self, i: int) -> dict[str, list[int]]:
            n = min(int(self.lengths[i]), MAX_LENGTH)  # torchtune refuses longer ones
            return {"tokens": [1] * n, "labels": [1] * n}

    def pack(lengths: np.ndarray) -> tuple[int, int]:
        packed = PackedDataset(Docs(lengths), max_seq_len=MAX_LENGTH, split_across_pack=False)
        tokens = sum(int((p["labels"] != -100).sum()) for p in packed.packs)
        return len(packed.packs), tokens

    return pack


def padding_table(n: int, report: Report) -> dict[str, Any]:
    packers: dict[str, Callable[[np.ndarray], tuple[int, int]] | None] = {
        "indextar best-fit": indextar_packer("best-fit"),
        "indextar first-fit": indextar_packer("first-fit"),
        "indextar concat-split": indextar_packer("concat-split"),
        "Grain best_fit": grain_packer("BestFit"),
        "Grain first_fit": grain_packer("FirstFit"),
        "TRL pack_dataset bfd": trl_packer(),
        "torchtune PackedDataset": torchtune_packer(),
    }
    dists = distributions(n)
    report(f"Padding fraction at max_length={MAX_LENGTH}, {n:,} documents (time in seconds):")
    report("")
    report("| packer | " + " | ".join(dists) + " |")
    report("|---|" + "---|" * len(dists))
    results: dict[str, Any] = {}
    for name, pack in packers.items():
        if pack is None:
            report(f"| {name} | " + " | ".join("not installed" for _ in dists) + " |")
            continue
        cells = []
        for dist, lengths in dists.items():
            start = time.perf_counter()
            packs, tokens = pack(lengths)
            seconds = time.perf_counter() - start
            total = int(lengths.sum())
            padding = 1 - tokens / (packs * MAX_LENGTH)
            dropped = 1 - tokens / total
            results[f"{name}/{dist}"] = {"packs": packs, "padding": padding, "dropped": dropped}
            note = f", {dropped:.1%} dropped" if dropped > 0.0005 else ""
            cells.append(f"{padding:.2%} ({packs:,} packs{note}; {seconds:.2f} s)")
        report(f"| {name} | " + " | ".join(cells) + " |")
    report("")
    return results


# -- planning once against planning every epoch --------------------------------------


def _neighbours(plan: Any, n: int) -> set[int]:
    """Pairs of documents side by side in a pack, as ``low * n + high``."""
    pack_of = np.repeat(np.arange(len(plan)), np.diff(plan.offsets))
    documents = plan.documents.astype(np.int64)
    same = pack_of[1:] == pack_of[:-1]
    a, b = documents[:-1][same], documents[1:][same]
    return set((np.minimum(a, b) * n + np.maximum(a, b)).tolist())


def replan_table(n: int, report: Report) -> dict[str, Any]:
    report(
        f"Planning once against every epoch, {n:,} documents at max_length={MAX_LENGTH}: "
        "packs and padding of epochs 0 and 1, and the share of epoch 0's neighbouring "
        "pairs that share a pack again in epoch 1's plan (the single plan: 100%):"
    )
    report("")
    report("| lengths | strategy | packs | padding | pairs met again |")
    report("|---|---|---|---|---|")
    results = {}
    for dist, lengths in distributions(n).items():
        for strategy in ("best-fit", "concat-split"):
            plans = [
                indextar.plan_packs(lengths, MAX_LENGTH, strategy=strategy, epoch=e)  # type: ignore[arg-type]
                for e in (0, 1)
            ]
            first, second = (_neighbours(p, n) for p in plans)
            again = len(first & second) / max(1, len(first))
            results[f"{dist}/{strategy}"] = again
            report(
                f"| {dist} | {strategy} | {len(plans[0]):,} / {len(plans[1]):,} | "
                f"{plans[0].padding:.4%} / {plans[1].padding:.4%} | {again:.2%} |"
            )
    report("")
    return results


# -- planning time and memory, each size in a fresh process ----------------------------

_PLAN_CHILD = """
import sys, time, json
import numpy as np
sys.path.insert(0, {repo!r})
import indextar
n = {n}
rng = np.random.default_rng(0)
lengths = np.empty(n, np.int32)
for at in range(0, n, 1 << 20):  # in chunks: no float64 temporary of n sets the baseline
    chunk = lengths[at : at + (1 << 20)]
    chunk[:] = np.clip(rng.lognormal(np.log(400), 1.0, chunk.size), 1, 4 * 4096)
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:  # resets the peak (VmHWM) to the current RSS
    f.write("5")
base = status("VmRSS")
start = time.perf_counter()
plan = indextar.plan_packs(lengths, 4096, strategy={strategy!r})
seconds = time.perf_counter() - start
peak = status("VmHWM")
print(json.dumps({{"seconds": seconds, "added": peak - base, "plan": plan.nbytes,
                   "packs": len(plan), "padding": plan.padding}}))
"""


def planning_table(
    sizes: list[int],
    report: Report,
    strategies: tuple[str, ...] = ("best-fit", "first-fit", "concat-split"),
) -> dict[str, Any]:
    report(
        "Planning log-normal lengths (int32) at max_length=4096, each in a fresh process "
        "(peak memory: the resident set's high-water mark over the lengths, reset before "
        "planning through /proc/self/clear_refs):"
    )
    report("")
    report("| documents | strategy | seconds | peak memory added | per document | plan |")
    report("|---|---|---|---|---|---|")
    results = {}
    for n in sizes:
        for strategy in strategies:
            code = _PLAN_CHILD.format(repo=str(REPO), n=n, strategy=strategy)
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if done.returncode:
                report(f"| {n:.0e} | {strategy} | failed: {done.stderr.strip()[-200:]} | | | |")
                continue
            r = json.loads(done.stdout)
            results[f"{n}/{strategy}"] = r
            report(
                f"| {n:.0e} | {strategy} | {r['seconds']:.2f} | {r['added'] / 2**20:.0f} MiB "
                f"| {r['added'] / n:.1f} B | {r['plan'] / n:.1f} B/doc |"
            )
    report("")
    return results


# -- reading: packed against unpacked ---------------------------------------------------


def _tokens(sample: tuple[bytes]) -> np.ndarray:
    return np.frombuffer(sample[0], np.uint16)


def _concat(samples: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(samples)


def _padded(samples: list[np.ndarray]) -> dict[str, Any]:
    """What training unpacked takes: documents padded to the batch's longest, labels,
    an attention mask."""
    import torch

    width = max(len(s) for s in samples)
    input_ids = np.zeros((len(samples), width), np.int64)
    mask = np.zeros((len(samples), width), np.int64)
    for row, tokens in enumerate(samples):
        input_ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    labels = np.where(mask == 1, input_ids, -100)
    return {
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(mask),
        "labels": torch.from_numpy(labels),
    }


def _as_one_row(samples: list[np.ndarray]) -> dict[str, Any]:
    """The same tensors as ``collate_packs`` (ids, labels, positions, ``cu_seqlens``),
    for a batch of documents read unpacked: end to end in one row, no padding."""
    total = sum(len(s) for s in samples)
    pack = indextar.Pack(tuple(samples), np.arange(len(samples)), total)
    return indextar.collate_packs([pack])


def _collate_int32(packs: list[Any]) -> dict[str, Any]:
    import torch

    return indextar.collate_packs(packs, dtype=torch.int32)


def _collate_fresh(packs: list[Any]) -> dict[str, Any]:
    """``collate_packs(reuse=False)``: one new shared-memory block a batch."""
    return indextar.collate_packs(packs, reuse=False)


def _collate_apart(packs: list[Any]) -> dict[str, Any]:
    """``collate_packs`` as it was before 346bfc1: each tensor in its own block of memory
    (a worker shares each one apart)."""
    batch = indextar.collate_packs(packs)
    return {k: v.clone() if hasattr(v, "clone") else v for k, v in batch.items()}


def reading_table(folder: Path, documents: int, rounds: int, report: Report) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    rng = np.random.default_rng(1)
    max_length = 2048
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, documents), 1, max_length).astype(int)
    pattern = folder / "pack-%06d.tar"
    with indextar.ShardWriter(str(pattern), maxcount=5000) as sink:
        for i, n in enumerate(lengths.tolist()):
            tokens = rng.integers(1, 32000, n).astype(np.uint16)
            sink.write({"__key__": f"d{i:07d}", "tokens": tokens.tobytes()})
    shards = [str(folder / f"pack-{i:06d}.tar") for i in range(len(sink.shards))]
    ds = indextar.IndexedTarDataset(shards, keys="tokens", transform=_tokens)
    packed = indextar.PackedDataset(ds, max_length=max_length, lengths="size(tokens) / 2")
    per_batch = 8
    docs_per_batch = max(1, round(per_batch * len(ds) / len(packed)))

    def loader(data: Any, batch_size: int, collate: Callable[[Any], Any]) -> DataLoader[Any]:
        sampler = indextar.ResumableSampler(data, seed=0)
        return DataLoader(
            data, batch_size=batch_size, sampler=sampler, num_workers=2, collate_fn=collate
        )

    rows = {  # name: (loader, tokens in a batch, what the row is)
        "packed": (
            loader(packed, per_batch, indextar.collate_packs),
            lambda b: int((b["input_ids"] != 0).sum()),
            f"packed (`PackedDataset` + `collate_packs`: {len(packed):,} packs of "
            f"{max_length}, {per_batch} a batch)",
        ),
        "packed int32": (
            loader(packed, per_batch, _collate_int32),
            lambda b: int((b["input_ids"] != 0).sum()),
            "packed, `collate_packs(dtype=torch.int32)`",
        ),
        "fresh": (
            loader(packed, per_batch, _collate_fresh),
            lambda b: int((b["input_ids"] != 0).sum()),
            "packed, a new block a batch (`collate_packs(reuse=False)`)",
        ),
        "apart": (
            loader(packed, per_batch, _collate_apart),
            lambda b: int((b["input_ids"] != 0).sum()),
            "packed, each tensor in its own block (`collate_packs` before 346bfc1)",
        ),
        "same tensors": (
            loader(ds, docs_per_batch, _as_one_row),
            lambda b: b["input_ids"].numel(),
            f"unpacked, same tensors ({docs_per_batch} documents a batch end to end: ids, "
            "labels, positions, `cu_seqlens`, no padding)",
        ),
        "padded": (
            loader(ds, docs_per_batch, _padded),
            lambda b: int(b["attention_mask"].sum()),
            "unpacked, padded to the batch's longest (ids, labels, mask)",
        ),
        "raw": (
            loader(ds, docs_per_batch, _concat),
            len,
            "unpacked, bare read (tokens concatenated, no tensors)",
        ),
    }
    load = [os.getloadavg()[0]]

    def case(name: str) -> Callable[[], tuple[float, ...]]:
        batches, count, _ = rows[name]

        def one() -> tuple[float, ...]:
            # the workers are joined at the end of the pass: their CPU is counted
            figures = rate_and_cpu(lambda: (sum(count(b) for b in batches), len(batches)))
            log.info("%s: %.0f tokens/s, CPU ms a batch %.2f, %.2f", name, *figures)
            load.append(os.getloadavg()[0])
            return figures

        return one

    figures = interleaved({name: case(name) for name in rows}, rounds)
    best = {name: max(rate for rate, _, _ in runs) for name, runs in figures.items()}
    report(
        f"Reading {documents:,} documents ({int(lengths.sum()):,} tokens, {len(shards)} shards), "
        f"DataLoader with 2 workers, best of {rounds} interleaved rounds (load average "
        f"{min(load):.1f}-{max(load):.1f}); CPU a batch is the median over the rounds, of "
        "the main process and of the two workers together:"
    )
    report("")
    report("| reader | tokens/s | batches | CPU ms a batch: main | workers |")
    report("|---|---|---|---|---|")
    for name, (batches, _, what) in rows.items():
        main_ms, workers_ms = np.median(np.array(figures[name])[:, 1:], axis=0)
        report(
            f"| {what} | {best[name]:,.0f} | {len(batches):,} | {main_ms:.2f} | {workers_ms:.2f} |"
        )
    ratios = {
        "same tensors": best["packed"] / best["same tensors"],
        "raw": best["packed"] / best["raw"],
        "padded": best["packed"] / best["padded"],
    }
    report("")
    report(
        f"Packed / unpacked with the same tensors: {ratios['same tensors']:.2f}; packed / "
        f"bare read: {ratios['raw']:.2f}; packed / padded: {ratios['padded']:.2f}."
    )
    report("")
    return {**best, "ratios": ratios, "load": load}


def cache_table(folder: Path, documents: int, rounds: int, report: Report) -> dict[str, Any]:
    """Opening a ``PackedDataset`` with its lengths from an attribute column: planned
    (``cache_dir=False``, and the first open of an empty cache) against loaded."""
    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, documents), 1, 16384).astype(int)
    per_shard = 50_000
    with indextar.ShardWriter(
        str(folder / "open-%06d.tar"), maxcount=per_shard, attributes_from="json"
    ) as sink:
        for i, n in enumerate(lengths.tolist()):  # the tokens are not read: one stands in
            sink.write({"__key__": f"d{i:07d}", "tokens": b"\0\0", "json": {"num_tokens": n}})
    shards = [str(folder / f"open-{i:06d}.tar") for i in range(len(sink.shards))]
    cache = folder / "cache"

    def open_packed(cache_dir: Path | bool) -> float:
        ds = indextar.IndexedTarDataset(shards, keys="tokens")
        start = time.perf_counter()
        indextar.PackedDataset(ds, max_length=MAX_LENGTH, lengths="num_tokens", cache_dir=cache_dir)
        seconds = time.perf_counter() - start
        ds.close()
        return seconds

    load = [os.getloadavg()[0]]
    first = open_packed(cache)  # the empty cache: planned, then written
    times: dict[str, list[float]] = {"uncached": [], "cached": []}
    for _ in range(rounds):
        times["uncached"].append(open_packed(False))
        times["cached"].append(open_packed(cache))
    load.append(os.getloadavg()[0])
    size = sum(p.stat().st_size for p in (cache / "packs").glob("*.npz"))
    best = {name: min(found) for name, found in times.items()}
    report(
        f"Opening a PackedDataset of {documents:,} documents ({len(shards)} shards, lengths "
        f'from the attribute column "num_tokens", best-fit at {MAX_LENGTH}), best of '
        f"{rounds} interleaved rounds, load average {min(load):.1f}-{max(load):.1f}:"
    )
    report("")
    report("| open | seconds |")
    report("|---|---|")
    report(f"| lengths from the indexes and planned (`cache_dir=False`) | {best['uncached']:.3f} |")
    report(f"| the first open, the cache empty: planned and written | {first:.3f} |")
    report(f"| the next open, from the cache ({size / documents:.1f} bytes a document) | "
           f"{best['cached']:.3f} |")  # fmt: skip
    report("")
    return {**best, "first": first, "bytes": size, "load": load}


TABLES = ("padding", "replan", "planning", "reading", "cache")


def run(
    *,
    report: Report = print,
    quick: bool = False,
    peers: str | None = None,
    large: bool = False,
    tables: tuple[str, ...] = TABLES,
    rounds: int = 3,
) -> dict[str, Any]:
    if peers:
        sys.path.append(peers)
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    results: dict[str, Any] = {}
    if "padding" in tables:
        results["padding"] = padding_table(2_000 if quick else 20_000, report)
    if "replan" in tables:
        results["replan"] = replan_table(2_000 if quick else 200_000, report)
    if "planning" in tables:
        sizes = [10**5] if quick else [10**6, 10**7] + ([10**8] if large else [])
        results["planning"] = planning_table(sizes, report)
    if "reading" in tables:
        with tempfile.TemporaryDirectory() as scratch:
            results["reading"] = reading_table(
                Path(scratch), 2_000 if quick else 20_000, 1 if quick else rounds, report
            )
    if "cache" in tables:
        with tempfile.TemporaryDirectory() as scratch:
            results["cache"] = cache_table(
                Path(scratch), 20_000 if quick else 1_000_000, 1 if quick else rounds, report
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--peers", help="a folder the peers were pip-installed into (--target)")
    parser.add_argument("--large", action="store_true", help="also plan 1e8 lengths")
    parser.add_argument(
        "--tables", nargs="+", choices=TABLES, default=TABLES, help="which tables (default: all)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="reading: interleaved rounds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("indextar").setLevel(logging.WARNING)
    run(
        quick=args.quick,
        peers=args.peers,
        large=args.large,
        tables=tuple(args.tables),
        rounds=args.rounds,
    )


if __name__ == "__main__":
    main()
