"""examples/digits.py: real digits -> indextar create -> index -> train, stop, resume.

Runs the walkthrough's steps in this process (one torch import, no interpreter
start-ups) with small settings; docs/walkthrough.md runs the same commands from a shell.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from indextar.cli import commands as cli

ROOT = Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH = -(-1437 // 32)  # 1437 training digits in batches of 32


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("digits_example", ROOT / "examples" / "digits.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_digits_trains_stops_and_resumes_in_the_same_order(tmp_path: Path) -> None:
    digits = load_example()
    digits.main(["images", str(tmp_path / "images")])
    for split in ("train", "test"):
        images, shards = tmp_path / "images" / split, tmp_path / f"{split}-%06d.tar"
        assert cli.main(["create", str(images), str(shards), "--maxcount", "400", "-q"]) == 0
        made, manifest = str(tmp_path / f"{split}-*.tar"), str(tmp_path / f"{split}.json")
        assert cli.main(["index", made, "--manifest", manifest, "-q"]) == 0
    assert len(list(tmp_path.glob("train-*.tar"))) == 4

    full, resumed = tmp_path / "full", tmp_path / "resumed"

    def train(run: Path, *options: str) -> None:
        digits.main(["train", str(tmp_path), "--run", str(run), "--epochs", "2", *options])

    train(full, "--workers", "1")
    stop = STEPS_PER_EPOCH + 15  # in the middle of the second epoch
    train(resumed, "--workers", "1", "--stop-after", str(stop))
    assert len((resumed / "order.txt").read_text().splitlines()) == stop
    assert not (resumed / "result.json").exists()
    train(resumed, "--workers", "0")

    accuracy = [
        json.loads((run / "result.json").read_text())["accuracy"] for run in (full, resumed)
    ]
    assert accuracy[0] > 0.85  # a small MLP after two epochs; chance is 0.1
    assert accuracy[1] == accuracy[0]
    digits.main(["compare", str(full), str(resumed)])  # same order, identical weights

    steps = (full / "order.txt").read_text().splitlines()
    assert len(steps) == 2 * STEPS_PER_EPOCH
    for epoch in (steps[:STEPS_PER_EPOCH], steps[STEPS_PER_EPOCH:]):
        keys = " ".join(epoch).split()
        assert len(keys) == len(set(keys)) == 1437  # every training digit once per epoch
    assert steps[0] != steps[STEPS_PER_EPOCH]  # a new order in the next epoch

    # compare() does fail on runs that differ.
    (resumed / "order.txt").write_text("\n".join(steps[1:] + steps[:1]) + "\n")
    with pytest.raises(AssertionError, match="different samples or in another order"):
        digits.main(["compare", str(full), str(resumed)])
