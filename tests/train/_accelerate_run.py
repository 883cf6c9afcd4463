"""One Accelerate training run over indexed shards, for tests/train/test_accelerate_resume.py.

``[torchrun --nproc-per-node 2] _accelerate_run.py RUN PATTERN [--workers 1]
[--kill-at-step S] [--save-at 4,6] [--no-glue]``: trains a tiny model,
``accelerator.save_state`` every 4 steps (or after the steps ``--save-at`` lists) into
``RUN/state`` and ``load_state`` from it first if it exists. Logs
every trained key (see trainruns.py). ``--no-glue`` prepares the loader with
``accelerator.prepare`` alone, as Accelerate's docs do without ``skip_first_batches``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader

import indextar
from indextar.train.accelerate import prepare_loader

BATCH, EVERY, EPOCHS = 4, 4, 2


def collate(batch: list[tuple[bytes, str]]) -> tuple[torch.Tensor, list[str]]:
    return torch.tensor([[float(cls)] for cls, _ in batch]), [key for _, key in batch]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("pattern")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--kill-at-step", type=int, default=-1)
    parser.add_argument("--save-at", type=lambda text: {int(s) for s in text.split(",")})
    parser.add_argument("--no-glue", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    dataset = indextar.IndexedTarDataset(args.pattern, keys=("cls", "__key__"))
    sampler = indextar.ResumableSampler(dataset, seed=7, num_replicas=1, rank=0)
    loader = DataLoader(
        dataset, batch_size=BATCH, sampler=sampler, num_workers=args.workers, collate_fn=collate
    )
    model = nn.Linear(1, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimiser = accelerator.prepare(model, optimiser)
    train = accelerator.prepare(loader) if args.no_glue else prepare_loader(accelerator, loader)
    state = args.run / "state"
    step = 0
    if state.exists():
        accelerator.load_state(state)
        step = int((args.run / "step").read_text())  # the trainer's own step counter
    log = open(args.run / f"seen-rank{accelerator.process_index}.txt", "a", buffering=1)
    start_epoch = 0 if args.no_glue else train.epoch
    for _ in range(start_epoch, EPOCHS):
        for x, keys in train:
            log.write("".join(f"{step} {key}\n" for key in keys))
            optimiser.zero_grad()
            accelerator.backward(nn.functional.mse_loss(model(x), x))
            optimiser.step()
            step += 1
            if step in args.save_at if args.save_at else step % EVERY == 0:
                accelerator.save_state(state)
                if accelerator.is_main_process:
                    (args.run / "step").write_text(str(step))
                accelerator.wait_for_everyone()
            if step == args.kill_at_step:
                accelerator.wait_for_everyone()  # every process has finished this step
                print(f"killed at step {step}", flush=True)
                os.killpg(os.getpgid(0), signal.SIGKILL)
    # The DDP model goes first, while the process group is registered: freed with the
    # model's Reducer, the group joins gloo's threads holding the GIL, which one of them
    # may still need to free the last gradient all-reduce (its saved thread-local state
    # holds a Python object): a hang at exit, 5 jobs in 30 on a loaded machine (torch
    # issue 56297). Freed by end_training's destroy_process_group, it lets go of the GIL.
    model = optimiser = None
    accelerator.free_memory()
    accelerator.end_training()
    assert not gloo_threads(), f"gloo's threads outlive destroy_process_group: {gloo_threads()}"


def gloo_threads() -> list[str]:
    """This process's threads of a gloo process group (Linux names them)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            names.append((task / "comm").read_text().strip())
    return [name for name in names if name.startswith("pt_gloo")]


if __name__ == "__main__":
    main()
