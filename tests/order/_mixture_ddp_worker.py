"""One rank of a real gloo job over a weighted mixture, driven by test_mixture_ddp.py.

A DataLoader over a MixtureDataset of two index datasets, with a ResumableSampler
blending them by weight; every batch's indices go to ``<phase>-rank<r>.jsonl``. With
``--checkpoint-at K`` rank 0 saves the sampler's state after K steps, every rank runs
two steps more (work lost in the crash), writes ``<phase>-rank<r>.ready`` and waits for
SIGKILL. With ``--resume`` the ranks load that state and finish the epoch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import indextar

SIZES, WEIGHTS, EPOCH_LENGTH, EPOCH, SEED = (23, 61), {"a": 0.7, "b": 0.3}, 150, 1, 77


class Numbers(Dataset[int]):
    def __init__(self, start: int, size: int) -> None:
        self.start, self.size = start, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return self.start + index


def mixture() -> indextar.MixtureDataset:
    return indextar.MixtureDataset({"a": Numbers(0, SIZES[0]), "b": Numbers(SIZES[0], SIZES[1])})


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("rank", "world", "port", "workers", "batch"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--phase", required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--checkpoint-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=datetime.timedelta(seconds=120),
    )
    data = mixture()
    sampler = indextar.ResumableSampler(data, weights=WEIGHTS, epoch_length=EPOCH_LENGTH, seed=SEED)
    checkpoint = args.log_dir / "checkpoint.json"
    if args.resume:
        sampler.load_state_dict(json.loads(checkpoint.read_text()))
    sampler.set_epoch(EPOCH)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.workers)
    start, steps = sampler.consumed, 0
    with (args.log_dir / f"{args.phase}-rank{args.rank}.jsonl").open("a", buffering=1) as log:
        for steps, batch in enumerate(loader, start=1):
            log.write(json.dumps({"step": steps, "indices": batch.tolist()}) + "\n")
            if steps == args.checkpoint_at and args.rank == 0:
                state = sampler.state_dict(consumed=start + steps * args.batch * args.world)
                checkpoint.with_suffix(".tmp").write_text(json.dumps(state))
                os.replace(checkpoint.with_suffix(".tmp"), checkpoint)
            if args.checkpoint_at is not None and steps == args.checkpoint_at + 2:
                break
    counts = torch.tensor([steps])
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)  # every rank gets here: no hang
    (args.log_dir / f"{args.phase}-rank{args.rank}.ready").write_text(str(steps))
    while args.checkpoint_at is not None:  # the crash: wait for SIGKILL
        time.sleep(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
