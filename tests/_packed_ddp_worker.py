"""One rank of a real torch.distributed (gloo) job, driven by tests/read/test_packed_ddp.py.

A DataLoader over a PackedDataset of the corpus in ``--log-dir`` (tests/packcorpus.py),
with a ResumableSampler whose world size and rank come from torch.distributed and
``collate_packs``. Every batch's ``input_ids``, ``position_ids`` and ``cu_seqlens`` are
appended to ``<log_dir>/<phase>-rank<r>.jsonl``. ``--checkpoint-at K``: rank 0 saves
the sampler's state after K steps, every rank runs ``--extra`` more and waits for the
test's SIGKILL; ``--resume``: the ranks load that state and finish the epoch.
"""

from __future__ import annotations

import json

from ddpjob import finish, join, rank_arguments
from packcorpus import PATTERN, dataset
from torch.utils.data import DataLoader

from indextar import PackedDataset, ResumableSampler, collate_packs
from indextar.atomic import write_atomic

MAX_LENGTH, SEED = 64, 99


def packed(log_dir: object) -> PackedDataset:
    """The packs every rank (and the test's reference) plans."""
    return PackedDataset(
        dataset(f"{log_dir}/{PATTERN}"),
        max_length=MAX_LENGTH,
        lengths="size(tokens) / 2",
        seed=SEED,
    )


def main() -> None:
    parser = rank_arguments("workers", "batch", "epoch")
    parser.add_argument("--checkpoint-at", type=int, default=None)
    parser.add_argument("--extra", type=int, default=2)
    args = parser.parse_args()
    join(args)
    packs = packed(args.log_dir)
    sampler = ResumableSampler(packs, seed=1234)
    checkpoint = args.log_dir / "checkpoint.json"
    if args.resume:
        sampler.load_state_dict(json.loads(checkpoint.read_text()))
    sampler.set_epoch(args.epoch)
    loader = DataLoader(
        packs, batch_size=args.batch, sampler=sampler, num_workers=args.workers,
        collate_fn=collate_packs,
    )  # fmt: skip
    start = sampler.consumed
    log = (args.log_dir / f"{args.phase}-rank{args.rank}.jsonl").open("a", buffering=1)
    steps = 0
    for steps, batch in enumerate(loader, start=1):
        record = {k: batch[k].tolist() for k in ("input_ids", "position_ids", "cu_seqlens")}
        log.write(json.dumps({"step": steps, **record}) + "\n")
        if steps == args.checkpoint_at and args.rank == 0:
            state = sampler.state_dict(consumed=start + steps * args.batch * args.world)
            write_atomic(checkpoint, json.dumps(state))
        if args.checkpoint_at is not None and steps == args.checkpoint_at + args.extra:
            break
    log.close()
    finish(args, steps, crash=args.checkpoint_at is not None)


if __name__ == "__main__":
    main()
