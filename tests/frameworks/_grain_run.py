"""A Grain pipeline over indexed shards that checkpoints every batch: run by
test_grain.py in a process of its own, to be killed and resumed.

``python _grain_run.py SHARDS RUN_DIR [--kill-after N] [--workers W]``: reads
``grain.MapDataset.source(indextar.grain.source(ds)).shuffle(seed).batch(4)`` through
``mp_prefetch`` (W worker processes). After each batch it writes ``step-<n>.json`` (the
batch's keys and the iterator's state after it) atomically. With ``--kill-after N`` it
SIGKILLs its whole process group (itself and Grain's workers) once step N is written.
A run finding step files resumes from the last one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import grain

import indextar
import indextar.grain

SEED, BATCH = 11, 4


def keys(sample: dict[str, object]) -> object:
    return sample["__key__"]


def pipeline(shards: str) -> grain.MapDataset:
    ds = indextar.IndexedTarDataset(shards, build_missing=False)
    return (
        grain.MapDataset.source(indextar.grain.source(ds)).shuffle(seed=SEED).map(keys).batch(BATCH)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    steps = sorted(args.run_dir.glob("step-*.json"))
    dataset = pipeline(args.shards).to_iter_dataset()
    if args.workers:
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=args.workers))
    iterator = iter(dataset)
    step = 0
    if steps:
        last = json.loads(steps[-1].read_text())
        iterator.set_state(last["state"])
        step = last["step"] + 1
    for batch in iterator:
        record = {"step": step, "keys": batch.tolist(), "state": iterator.get_state()}
        path = args.run_dir / f"step-{step:05d}.json"
        path.with_suffix(".tmp").write_text(json.dumps(record))
        os.replace(path.with_suffix(".tmp"), path)
        if step == args.kill_after:
            os.killpg(0, signal.SIGKILL)
        step += 1
    iterator.close()


if __name__ == "__main__":
    main()
