"""One rank of a real torch.distributed (gloo) job, driven by tests/read/test_readahead.py.

Each rank reads remote shards through ``ReadAheadBatches`` over its own
``ResumableSampler`` (world and rank from torch.distributed), with real DataLoader
workers, and appends every batch's keys to ``<log_dir>/<phase>-rank<r>.jsonl``.
"""

from __future__ import annotations

import json

from ddpjob import finish, join, rank_arguments
from torch.utils.data import DataLoader

from indextar import IndexedTarDataset, ReadAheadBatches, ResumableSampler


def main() -> None:
    parser = rank_arguments("workers", "batch", "seed")
    parser.add_argument("--url", action="append", required=True)
    parser.add_argument("--index-dir", required=True)
    args = parser.parse_args()
    join(args)
    ds = IndexedTarDataset(args.url, index_dir=args.index_dir, keys=("__key__",))
    sampler = ResumableSampler(ds, seed=args.seed)
    assert (sampler.num_replicas, sampler.rank) == (args.world, args.rank)
    loader = DataLoader(
        ds, batch_sampler=ReadAheadBatches(sampler, args.batch, depth=6),
        num_workers=args.workers, multiprocessing_context="fork" if args.workers else None,
        collate_fn=list,
    )  # fmt: skip
    steps = 0
    with (args.log_dir / f"{args.phase}-rank{args.rank}.jsonl").open("a", buffering=1) as log:
        for steps, batch in enumerate(loader, start=1):
            log.write(json.dumps({"step": steps, "keys": [key for (key,) in batch]}) + "\n")
    finish(args, steps, crash=False)


if __name__ == "__main__":
    main()
