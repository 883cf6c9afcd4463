"""One Lightning training run over indexed shards, for tests/train/test_lightning_resume.py.

``python _lightning_run.py RUN PATTERN [--devices 2] [--workers 1] [--kill-at-step S]
[--no-glue] [--shuffle-loader]``: trains a tiny model, ``ModelCheckpoint`` saving
``last.ckpt`` every 4 steps, from ``ckpt_path="last"`` (a fresh start if there is
none). Logs every trained key (see trainruns.py).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

import indextar
from indextar.train.lightning import ResumableDataLoader

BATCH, EVERY, EPOCHS = 4, 4, 2


def collate(batch: list[tuple[bytes, str]]) -> tuple[torch.Tensor, list[str]]:
    return torch.tensor([[float(cls)] for cls, _ in batch]), [key for _, key in batch]


class Shards(pl.LightningDataModule):
    def __init__(self, pattern: str, workers: int, glue: bool, shuffle_loader: bool) -> None:
        super().__init__()
        self.pattern, self.workers = pattern, workers
        self.glue, self.shuffle_loader = glue, shuffle_loader

    def train_dataloader(self) -> DataLoader[Any]:
        dataset = indextar.IndexedTarDataset(self.pattern, keys=("cls", "__key__"))
        if self.shuffle_loader:  # what Lightning users write without indextar's sampler
            return DataLoader(dataset, batch_size=BATCH, shuffle=True, collate_fn=collate)
        sampler = indextar.ResumableSampler(dataset, seed=7)  # rank, world from dist
        loader = ResumableDataLoader if self.glue else DataLoader
        return loader(
            dataset, batch_size=BATCH, sampler=sampler, num_workers=self.workers, collate_fn=collate
        )


class Tiny(pl.LightningModule):
    def __init__(self, run: Path, kill_at_step: int) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.run, self.kill_at_step = run, kill_at_step
        self.log_file: Any = None

    def training_step(self, batch: tuple[torch.Tensor, list[str]], batch_idx: int) -> torch.Tensor:
        if self.log_file is None:
            self.log_file = open(self.run / f"seen-rank{self.global_rank}.txt", "a", buffering=1)
        x, keys = batch
        self.log_file.write("".join(f"{self.global_step} {key}\n" for key in keys))
        return nn.functional.mse_loss(self.layer(x), x)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step == self.kill_at_step:  # every rank has finished this step
            if dist.is_initialized():
                dist.barrier()
            print(f"killed at step {self.global_step}", flush=True)
            os.killpg(os.getpgid(0), signal.SIGKILL)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("pattern")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--kill-at-step", type=int, default=-1)
    parser.add_argument("--no-glue", action="store_true", help="a plain DataLoader")
    parser.add_argument("--shuffle-loader", action="store_true", help="DataLoader(shuffle=True)")
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    checkpoint = ModelCheckpoint(
        dirpath=args.run / "ckpt", every_n_train_steps=EVERY, save_top_k=0, save_last=True
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=EPOCHS,
        callbacks=[checkpoint],
        use_distributed_sampler=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    model = Tiny(args.run, args.kill_at_step)
    trainer.fit(
        model,
        Shards(args.pattern, args.workers, not args.no_glue, args.shuffle_loader),
        ckpt_path="last",
    )


if __name__ == "__main__":
    main()
