"""One rank of a real torch.distributed (gloo) job, driven by tests/order/test_buckets_ddp.py.

A DataLoader with real workers over a dataset that returns its index, batched by a
BucketBatchSampler whose world size and rank come from torch.distributed. Every batch
is appended to ``<log_dir>/<phase>-rank<r>.jsonl``. With ``--stop-at K`` rank 0 saves
the sampler's state after K steps (``consumed = K * world``) and every rank stops there;
with ``--resume`` the ranks load it and finish the epoch. The ranks check with an
all-gather that they got the same number of batches.
"""

from __future__ import annotations

import json

import numpy as np
import torch.distributed as dist
from ddpjob import IndexDataset, join, rank_arguments
from torch.utils.data import DataLoader

from indextar.order.buckets import BucketBatchSampler


def bucket_ids(size: int) -> np.ndarray:
    return np.random.default_rng(7).choice([0, 1, 2], size=size, p=[0.6, 0.3, 0.1])


def main() -> None:
    parser = rank_arguments("workers", "batch", "size")
    parser.add_argument("--stop-at", type=int, default=None)
    args = parser.parse_args()
    join(args)
    sampler = BucketBatchSampler(bucket_ids(args.size), batch_size=args.batch, seed=42)
    assert (sampler.num_replicas, sampler.rank) == (args.world, args.rank)
    checkpoint = args.log_dir / "checkpoint.json"
    if args.resume:
        sampler.load_state_dict(json.loads(checkpoint.read_text()))
    sampler.set_epoch(0)
    counts = [None] * args.world
    dist.all_gather_object(counts, len(sampler))
    assert len(set(counts)) == 1, counts
    loader = DataLoader(IndexDataset(args.size), batch_sampler=sampler, num_workers=args.workers)
    start = sampler.consumed
    steps = 0
    with (args.log_dir / f"{args.phase}-rank{args.rank}.jsonl").open("w") as log:
        for steps, batch in enumerate(loader, start=1):
            log.write(json.dumps(batch.tolist()) + "\n")
            if steps == args.stop_at:
                if args.rank == 0:
                    state = sampler.state_dict(consumed=start + steps * args.world)
                    checkpoint.write_text(json.dumps(state))
                break
    done = [None] * args.world
    dist.all_gather_object(done, steps)
    assert len(set(done)) == 1, done
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
