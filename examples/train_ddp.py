"""Train a tiny model with DDP over indexed shards, checkpoint, get killed, resume exactly.

Run it on CPU with the gloo backend::

    python examples/train_ddp.py --make-data run/          # once: synthetic shards
    torchrun --nproc-per-node 2 examples/train_ddp.py run/ # train; kill -9 it any time
    torchrun --nproc-per-node 2 examples/train_ddp.py run/ # resumes from the checkpoint

Every ``--checkpoint-every`` steps rank 0 saves the model, the optimiser and the
sampler position ``{"epoch", "consumed"}`` to ``run/checkpoint.pt`` (written to a
temporary file and renamed, so a kill never leaves half a checkpoint). A restarted
run loads it and carries on with exactly the samples the killed run had not yet
trained on; each rank appends the keys of every batch it trains on to
``run/seen-rank<r>.txt`` as ``epoch step key`` lines, so this can be checked.
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

import indextar

FEATURES, CLASSES = 8, 3
SHARDS, PER_SHARD = 4, 96


def make_data(run: Path) -> str:
    """Four shards of (npy feature vector, cls label) samples; returns their pattern."""
    run.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32) * 3
    for shard in range(SHARDS):
        with tarfile.open(run / f"train-{shard:06d}.tar", "w") as tf:
            for i in range(PER_SHARD):
                label = int(rng.integers(CLASSES))
                x = centres[label] + rng.normal(size=FEATURES).astype(np.float32)
                npy = io.BytesIO()
                np.save(npy, x.astype(np.float32))
                for ext, payload in (("cls", str(label).encode()), ("npy", npy.getvalue())):
                    info = tarfile.TarInfo(f"s{shard}-{i:04d}.{ext}")
                    info.size, info.mtime = len(payload), 0
                    tf.addfile(info, io.BytesIO(payload))
    pattern = str(run / f"train-{{000000..{SHARDS - 1:06d}}}.tar")
    indextar.build_index(run / "train-000000.tar")  # the rest are built on first use
    return pattern


def collate(
    batch: list[tuple[np.ndarray, int, str]],
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    xs, ys, keys = zip(*batch)
    return torch.from_numpy(np.stack(xs)), torch.tensor(ys), list(keys)


def save_atomically(obj: object, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="folder for shards, checkpoint and logs")
    parser.add_argument("--make-data", action="store_true", help="write the shards and exit")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=4, help="steps")
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds per step (demo)")
    args = parser.parse_args()
    if args.make_data:
        print(make_data(args.run))
        return

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    pattern = str(args.run / f"train-{{000000..{SHARDS - 1:06d}}}.tar")
    dataset = indextar.IndexedTarDataset(pattern, decode="l8", keys=("npy", "cls", "__key__"))
    sampler = indextar.ResumableSampler(dataset, seed=1234)  # rank and world from dist
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=collate,
        multiprocessing_context="spawn" if args.workers else None,
    )
    model = nn.parallel.DistributedDataParallel(nn.Linear(FEATURES, CLASSES))
    optimiser = torch.optim.SGD(model.parameters(), lr=0.05)
    checkpoint = args.run / "checkpoint.pt"

    start_epoch = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=True)
        model.module.load_state_dict(state["model"])
        optimiser.load_state_dict(state["optimiser"])
        sampler.load_state_dict(state["sampler"])
        start_epoch = state["sampler"]["epoch"]
        if rank == 0:
            print(
                f"resumed at epoch {start_epoch}, position {state['sampler']['consumed']}",
                flush=True,
            )

    global_batch = args.batch_size * world
    log = open(args.run / f"seen-rank{rank}.txt", "a", buffering=1)
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # keeps a restored position within the same epoch
        start = sampler.consumed
        correct = total = 0
        for step, (x, y, keys) in enumerate(loader, start=start // global_batch):
            optimiser.zero_grad()
            logits = model(x)
            nn.functional.cross_entropy(logits, y).backward()
            optimiser.step()
            correct += int((logits.argmax(1) == y).sum())
            total += len(y)
            log.write("".join(f"{epoch} {step} {key}\n" for key in keys))
            done = (step + 1) * global_batch
            if (step + 1) % args.checkpoint_every == 0 and rank == 0:
                sampler_state = sampler.state_dict(consumed=min(done, len(dataset)))
                save_atomically(
                    {
                        "model": model.module.state_dict(),
                        "optimiser": optimiser.state_dict(),
                        "sampler": sampler_state,
                    },
                    checkpoint,
                )
                print(f"checkpoint epoch {epoch} step {step + 1}", flush=True)
            if args.step_delay:
                time.sleep(args.step_delay)
        if rank == 0:
            print(
                f"epoch {epoch}: train accuracy {correct / max(total, 1):.2f} (rank 0)", flush=True
            )
    log.close()
    # Free the DDP model first: its Reducer holds the last reference to the process
    # group, and a group freed through it waits for gloo's threads with the GIL held
    # while one of them needs the GIL (a hang at exit; torch issue 56297).
    # destroy_process_group then frees the group with the GIL released.
    del model, optimiser
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
