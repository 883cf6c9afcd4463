"""examples/digits.py: real digits -> indextar create -> index -> train, stop, resume.

Runs the walkthrough's steps in this process (one torch import, no interpreter
start-ups) with small settings; docs/walkthrough.md runs the same commands from a shell.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from indextar import cli

ROOT = Path(__file__).resolve().parents[1]
BATCH_STEPS_PER_EPOCH = -(-1437 // 32)  # 1437 training digits in batches of 32


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
        assert cli.main(["create", str(tmp_path / "images" / split), str(tmp_path / f"{split}-%06d.tar"),
                         "--maxcount", "400", "-q"]) == 0
        assert cli.main(["index", str(tmp_path / f"{split}-*.tar"), "--manifest",
                         str(tmp_path / f"{split}.json"), "-q"]) == 0
    assert len(list(tmp_path.glob("train-*.tar"))) == 4

    full = digits.train(tmp_path, tmp_path / "full", epochs=2, workers=1, stop_after=None)
    stop = BATCH_STEPS_PER_EPOCH + 15  # in the middle of the second epoch
    assert digits.train(tmp_path, tmp_path / "resumed", epochs=2, workers=1, stop_after=stop) is None
    assert len((tmp_path / "resumed" / "order.txt").read_text().splitlines()) == stop
    resumed = digits.train(tmp_path, tmp_path / "resumed", epochs=2, workers=0, stop_after=None)

    assert full is not None and full > 0.85  # a 64-64-10 MLP after two epochs; chance is 0.1
    assert resumed == full
    digits.compare(tmp_path / "full", tmp_path / "resumed")  # same order, identical weights

    steps = (tmp_path / "full" / "order.txt").read_text().splitlines()
    assert len(steps) == 2 * BATCH_STEPS_PER_EPOCH
    for epoch in range(2):
        keys = " ".join(steps[epoch * BATCH_STEPS_PER_EPOCH : (epoch + 1) * BATCH_STEPS_PER_EPOCH]).split()
        assert len(keys) == len(set(keys)) == 1437  # every training digit once per epoch
    assert steps[0] != steps[BATCH_STEPS_PER_EPOCH]  # a new order in the next epoch

    # compare() does fail on runs that differ.
    (tmp_path / "resumed" / "order.txt").write_text("\n".join(steps[1:] + steps[:1]) + "\n")
    try:
        digits.compare(tmp_path / "full", tmp_path / "resumed")
    except AssertionError:
        pass
    else:
        raise AssertionError("compare() accepted runs with different orders")
