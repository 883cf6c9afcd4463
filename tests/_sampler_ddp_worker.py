"""One rank of a real torch.distributed (gloo) job, driven by tests/order/test_sampler_ddp.py.

It trains on nothing: a DataLoader over a dataset that returns its index, with a
ResumableSampler whose world size and rank come from torch.distributed. Every batch
is appended to ``<log_dir>/<phase>-rank<r>.jsonl`` as ``{"step", "indices"}``.

With ``--checkpoint-at K`` the job stops at a simulated crash: rank 0 saves
``{"epoch", "consumed"}`` after K steps, every rank runs ``--extra`` more steps
(lost work, redone after resume), writes ``<phase>-rank<r>.ready`` and sleeps until
the test kills it with SIGKILL. With ``--resume`` the ranks load that checkpoint and
finish the epoch.
"""

from __future__ import annotations

import json

from ddpjob import IndexDataset, finish, join, rank_arguments
from torch.utils.data import DataLoader

from indextar.atomic import write_atomic
from indextar.order.sampler import ResumableSampler


def main() -> None:
    parser = rank_arguments("workers", "batch", "size", "epoch")
    parser.add_argument("--checkpoint-at", type=int, default=None)
    parser.add_argument("--extra", type=int, default=2)
    args = parser.parse_args()
    join(args)
    sampler = ResumableSampler(args.size, seed=1234)  # world and rank from torch.distributed
    assert (sampler.num_replicas, sampler.rank) == (args.world, args.rank)
    checkpoint = args.log_dir / "checkpoint.json"
    if args.resume:
        sampler.load_state_dict(json.loads(checkpoint.read_text()))
    sampler.set_epoch(args.epoch)  # the usual top-of-epoch call; keeps a resumed position
    loader = DataLoader(
        IndexDataset(args.size), batch_size=args.batch, sampler=sampler, num_workers=args.workers
    )
    global_batch = args.batch * args.world
    start = sampler.consumed  # where this pass starts: 0, or the checkpoint's position
    log = (args.log_dir / f"{args.phase}-rank{args.rank}.jsonl").open("a", buffering=1)
    steps = 0
    for steps, batch in enumerate(loader, start=1):
        log.write(json.dumps({"step": steps, "indices": batch.tolist()}) + "\n")
        if steps == args.checkpoint_at and args.rank == 0:
            state = sampler.state_dict(consumed=start + steps * global_batch)
            write_atomic(checkpoint, json.dumps(state))
        if args.checkpoint_at is not None and steps == args.checkpoint_at + args.extra:
            break
    log.close()
    finish(args, steps, crash=args.checkpoint_at is not None)  # the simulated crash


if __name__ == "__main__":
    main()
