"""One rank of a real gloo job over a weighted mixture, driven by tests/order/test_mixture_ddp.py.

A DataLoader over a MixtureDataset of two index datasets, with a ResumableSampler
blending them by weight; every batch's indices go to ``<phase>-rank<r>.jsonl``. With
``--checkpoint-at K`` rank 0 saves the sampler's state after K steps, every rank runs
two steps more (work lost in the crash), writes ``<phase>-rank<r>.ready`` and waits for
SIGKILL. With ``--resume`` the ranks load that state and finish the epoch.
"""

from __future__ import annotations

import json

from ddpjob import IndexDataset, finish, join, rank_arguments
from torch.utils.data import DataLoader

import indextar
from indextar.atomic import write_atomic

SIZES, WEIGHTS, EPOCH_LENGTH, EPOCH, SEED = (23, 61), {"a": 0.7, "b": 0.3}, 150, 1, 77


def mixture() -> indextar.MixtureDataset:
    return indextar.MixtureDataset(
        {"a": IndexDataset(SIZES[0]), "b": IndexDataset(SIZES[1], start=SIZES[0])}
    )


def main() -> None:
    parser = rank_arguments("workers", "batch")
    parser.add_argument("--checkpoint-at", type=int, default=None)
    args = parser.parse_args()
    join(args)
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
                write_atomic(checkpoint, json.dumps(state))
            if args.checkpoint_at is not None and steps == args.checkpoint_at + 2:
                break
    finish(args, steps, crash=args.checkpoint_at is not None)


if __name__ == "__main__":
    main()
