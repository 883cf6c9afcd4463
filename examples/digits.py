"""A walkthrough on real images: scikit-learn's handwritten digits, as indexed shards.

scikit-learn ships 1,797 real 8x8 scans of handwritten digits (``load_digits``; no
download). This script writes them as a folder tree of PNG and ``cls`` files, and trains
a small classifier on CPU with a ``DataLoader`` and ``ResumableSampler`` over the shards
that ``indextar create`` makes of that tree. A run can stop after any step with a
checkpoint, and a later run resumes from it. docs/walkthrough.md runs it::

    python examples/digits.py images digits/      # digits/{train,test}/<digit>/<n>.{png,cls}
    indextar create digits/train 'train-%06d.tar' --maxcount 400
    indextar create digits/test 'test-%06d.tar'
    indextar index 'train-*.tar' --manifest train.json
    indextar index 'test-*.tar' --manifest test.json
    python examples/digits.py train . --run full       # an uninterrupted run
    python examples/digits.py train . --run resumed --stop-after 50   # stops, checkpointed
    python examples/digits.py train . --run resumed    # resumes from the checkpoint
    python examples/digits.py compare full resumed     # same sample order, same model

Each run folder gets ``order.txt`` (the keys of the samples of each step, one line per
step), ``checkpoint.pt`` and, when the run finishes, ``result.json`` with the test
accuracy.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

import indextar

BATCH = 32
SEED = 0


def write_tree(root: Path) -> dict[str, int]:
    """The digits as ``root/{train,test}/<digit>/<n>.png`` and ``.cls``; every 5th is test."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    counts = {"train": 0, "test": 0}
    for n, (image, label) in enumerate(zip(digits.images, digits.target)):
        split = "test" if n % 5 == 0 else "train"
        folder = root / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        png = io.BytesIO()
        # Pixel values are 0..16; spread them over 0..240 for an ordinary grayscale PNG.
        Image.fromarray((image * 15).astype(np.uint8), mode="L").save(png, format="PNG")
        (folder / f"{n:04d}.png").write_bytes(png.getvalue())
        (folder / f"{n:04d}.cls").write_text(str(label))
        counts[split] += 1
    return counts


def make_model() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )


def accuracy(model: torch.nn.Module, data: Path) -> float:
    test = indextar.IndexedTarDataset(data / "test.json", decode="torchl", keys=("png", "cls"))
    correct = 0
    with torch.no_grad():
        for images, labels in DataLoader(test, batch_size=256):
            correct += int((model(images).argmax(1) == labels).sum())
    return correct / len(test)


def train(
    data: Path, run: Path, *, epochs: int, workers: int, stop_after: int | None
) -> float | None:
    """Train, resuming from ``run/checkpoint.pt`` if it exists; return the test accuracy.

    With ``stop_after``, stop after that many optimiser steps of this run, checkpoint and
    return ``None``, as a preempted job would.
    """
    run.mkdir(parents=True, exist_ok=True)
    ds = indextar.IndexedTarDataset(
        data / "train.json", decode="torchl", keys=("png", "cls", "__key__")
    )
    model = make_model()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = indextar.ResumableSampler(ds, seed=SEED)
    checkpoint_path = run / "checkpoint.pt"
    if checkpoint_path.exists():
        checkpoint = torch.load(checkpoint_path)
        model.load_state_dict(checkpoint["model"])
        optimiser.load_state_dict(checkpoint["optimiser"])
        sampler.load_state_dict(checkpoint["sampler"])
        print(f"resuming from epoch {sampler.epoch}, sample {sampler.consumed} of {len(ds)}")
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers)
    steps = 0
    with open(run / "order.txt", "a") as order:
        for epoch in range(sampler.epoch, epochs):
            sampler.set_epoch(epoch)  # keeps a restored position in the same epoch
            start = sampler.consumed
            for step, (images, labels, keys) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                order.write(" ".join(keys) + "\n")
                steps += 1
                if steps == stop_after:
                    # The loop, not the sampler, knows how far training got: DataLoader
                    # workers draw indices ahead of it.
                    state = sampler.state_dict(consumed=start + (step + 1) * BATCH)
                    save(checkpoint_path, model, optimiser, state)
                    print(f"stopped after {steps} steps in epoch {epoch}; checkpoint {state}")
                    return None
            print(f"epoch {epoch}: loss {loss.item():.3f}")
    save(checkpoint_path, model, optimiser, {"epoch": epochs, "consumed": 0})
    result = accuracy(model, data)
    (run / "result.json").write_text(json.dumps({"accuracy": result, "epochs": epochs}))
    print(f"test accuracy: {result:.3f} (epochs: {epochs})")
    return result


def save(
    path: Path, model: torch.nn.Module, optimiser: torch.optim.Optimizer, sampler: dict
) -> None:
    """Write the checkpoint to a temporary file and rename it: a crash never leaves half of one."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"model": model.state_dict(), "optimiser": optimiser.state_dict(), "sampler": sampler}, tmp
    )
    os.replace(tmp, path)


def compare(first: Path, second: Path) -> None:
    """Check that two finished runs trained on the same samples in the same order, to one model."""
    order_a, order_b = (run.joinpath("order.txt").read_text().split() for run in (first, second))
    assert order_a == order_b, "the runs trained on different samples or in another order"
    weights_a, weights_b = (torch.load(run / "checkpoint.pt")["model"] for run in (first, second))
    assert all(torch.equal(weights_a[name], weights_b[name]) for name in weights_a)
    accuracies = [
        json.loads(run.joinpath("result.json").read_text())["accuracy"] for run in (first, second)
    ]
    print(
        f"{first.name} and {second.name}: the same {len(order_a)} samples in the same order, "
        f"identical weights, test accuracy {accuracies[0]:.3f} and {accuracies[1]:.3f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("images", help="write the digits as a tree of PNG and cls files")
    p.add_argument("dir", type=Path)
    p = commands.add_parser("train", help="train (resuming from a checkpoint if the run has one)")
    p.add_argument("data", type=Path, help="the folder of train.json and test.json")
    p.add_argument("--run", type=Path, default=Path("run"), help="the run's folder")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--stop-after", type=int, help="stop after this many steps, with a checkpoint")
    p = commands.add_parser("compare", help="check that two finished runs match")
    p.add_argument("runs", nargs=2, type=Path)
    args = parser.parse_args(argv)
    if args.command == "images":
        counts = write_tree(args.dir)
        print(f"wrote {counts['train']} training and {counts['test']} test digits to {args.dir}/")
    elif args.command == "train":
        train(
            args.data,
            args.run,
            epochs=args.epochs,
            workers=args.workers,
            stop_after=args.stop_after,
        )
    else:
        compare(*args.runs)


if __name__ == "__main__":
    main()
