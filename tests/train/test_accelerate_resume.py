"""Accelerate: SIGKILL after the last ``save_state``, ``load_state``, same batches.

Runs ``_accelerate_run.py`` (a DataLoader over indexed shards through
``indextar.train.accelerate.prepare_loader``, a tiny model, ``save_state`` every 4
steps) on 1 process and on 2 as torchrun starts them, SIGKILLed mid-epoch with DataLoader
workers and resumed with another worker count or number of processes; and checks in
process what Accelerate's own wrapping does to the sampler.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import trainruns
from torch.utils.data import DataLoader
from trainruns import global_order, keep_before, make_shards, run, seen

import indextar

pytest.importorskip("accelerate")

SCRIPT = Path(__file__).with_name("_accelerate_run.py")
BATCH, N = 4, 48


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[tuple[int, str]]]:
    """Shards and the log of an uninterrupted run on 1 process: 2 epochs of 12 steps."""
    return trainruns.uninterrupted(tmp_path_factory.mktemp("accelerate"), SCRIPT, N)


@pytest.mark.timeout(240)
def test_one_process_resumes_batch_for_batch_and_plain_prepare_does_not(
    uninterrupted: tuple[str, list[tuple[int, str]]], tmp_path: Path
) -> None:
    pattern, expected = uninterrupted
    glue, plain = tmp_path / "glue", tmp_path / "plain"
    for folder, extra in ((glue, ()), (plain, ("--no-glue",))):
        folder.mkdir()
        run(
            SCRIPT,
            str(folder),
            pattern,
            "--workers=1",
            "--kill-at-step=6",
            *extra,
            expect_kill=True,
        )
        assert (folder / "step").read_text() == "4"
        keep_before(folder, 1, 4)
        run(SCRIPT, str(folder), pattern, "--workers=0", *extra)
    assert seen(glue, 1) == [expected]
    # Accelerate by itself restarts the loader at the first batch of epoch 0: the 16
    # samples trained before the checkpoint are trained twice, and the run is 4 steps
    # longer.
    [log] = seen(plain, 1)
    order = [key for _, key in expected]
    assert [key for _, key in log] == order[:16] + order
    assert log[-1][0] == 27


@pytest.mark.timeout(300)
def test_two_processes_resume_on_two_and_on_one(
    uninterrupted: tuple[str, list[tuple[int, str]]], tmp_path: Path
) -> None:
    """2 processes as torchrun starts them (gloo), killed at step 5 of 6 after save_state at
    step 4,
    resumed on 2 and, from a copy of the same state, on 1 process."""
    pattern, expected = uninterrupted
    order = [key for _, key in expected]
    killed, elastic = tmp_path / "killed", tmp_path / "elastic"
    killed.mkdir()
    run(
        SCRIPT,
        str(killed),
        pattern,
        "--workers=1",
        "--kill-at-step=5",
        processes=2,
        expect_kill=True,
    )
    assert (killed / "step").read_text() == "4"
    keep_before(killed, 2, 4)
    shutil.copytree(killed, elastic)

    run(SCRIPT, str(killed), pattern, "--workers=0", processes=2)
    logs = seen(killed, 2)
    assert [step for step, _ in logs[0]] == [s for s in range(12) for _ in range(BATCH)]
    # Accelerate gives process p the global batches p, p + 2, ...: batch for batch.
    assert global_order(logs, chunk=BATCH) == order

    run(SCRIPT, str(elastic), pattern, "--workers=1")
    before = [[line for line in log if line[0] < 4] for log in seen(elastic, 2)]
    after = [line for line in seen(elastic, 1)[0] if line[0] >= 4]
    assert global_order(before, chunk=BATCH) + [key for _, key in after] == order
    assert [step for step, _ in after] == [s for s in range(4, 20) for _ in range(BATCH)]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(("processes", "middle", "last_round"), [(2, 4, 6), (3, 2, 4)])
def test_a_resumed_epoch_is_padded_as_the_uninterrupted_one(
    tmp_path: Path, processes: int, middle: int, last_round: int
) -> None:
    """50 samples in batches of 4 are 13 batches, not whole rounds on 2 or 3 processes:
    Accelerate (``even_batches=True``) pads the last round of each epoch with the epoch's
    first positions. Killed after a step in the middle of epoch 0, then after its last
    round, each time resumed from the save before, every rank trains on the keys of the
    uninterrupted run step for step, the padding included."""
    samples = 50
    pattern = make_shards(tmp_path / "data", per_shard=samples // 2)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    straight.mkdir()
    run(SCRIPT, str(straight), pattern, processes=processes)
    expected = seen(straight, processes)
    steps = -(-samples // (BATCH * processes))
    epoch0 = global_order([log[: steps * BATCH] for log in expected], chunk=BATCH)
    assert len(set(epoch0)) == samples and epoch0[samples:] == epoch0[: len(epoch0) - samples]

    resumed.mkdir()
    save_at = f"--save-at={middle},{last_round}"
    for saved in (middle, last_round):
        run(
            SCRIPT,
            str(resumed),
            pattern,
            save_at,
            f"--kill-at-step={saved + 1}",
            "--workers=1",
            processes=processes,
            expect_kill=True,
        )
        assert (resumed / "step").read_text() == str(saved)
        keep_before(resumed, processes, saved)
    run(SCRIPT, str(resumed), pattern, save_at, processes=processes)
    assert seen(resumed, processes) == expected


def loader(sampler: indextar.ResumableSampler) -> DataLoader[int]:
    return DataLoader(range(N), batch_size=BATCH, sampler=sampler)  # type: ignore[arg-type]


def batches(prepared: object) -> list[list[int]]:
    return [batch.tolist() for batch in prepared]  # type: ignore[attr-defined]


def test_accelerates_sharding_keeps_the_global_order() -> None:
    """On P processes Accelerate wraps the loader's batches in BatchSamplerShard: process
    p takes global batches p, p + P, ... of the sampler's order, which stays indextar's;
    its seedable sampler replaces only a RandomSampler."""
    from accelerate.data_loader import prepare_data_loader

    sampler = indextar.ResumableSampler(N, seed=7, num_replicas=1, rank=0)
    order = sampler.indices(0, N).tolist()
    shards = []
    for process in range(2):
        prepared = prepare_data_loader(
            loader(sampler), num_processes=2, process_index=process, use_seedable_sampler=True
        )
        assert prepared.batch_sampler.batch_sampler.sampler is sampler
        shards.append(batches(prepared))
    assert [b for pair in zip(*shards) for b in pair] == [
        order[i : i + BATCH] for i in range(0, N, BATCH)
    ]

    # A sampler that splits the epoch over ranks itself is split again: a quarter each.
    split = [indextar.ResumableSampler(N, seed=7, num_replicas=2, rank=r) for r in range(2)]
    seen_by = [
        sum(batches(prepare_data_loader(loader(split[p]), num_processes=2, process_index=p)), [])
        for p in range(2)
    ]
    assert [len(keys) for keys in seen_by] == [N // 4, N // 4]


def test_prepare_loader_refuses_a_sampler_split_by_rank() -> None:
    from accelerate import Accelerator

    from indextar.train.accelerate import prepare_loader

    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="num_replicas=1, rank=0"):
        prepare_loader(accelerator, loader(indextar.ResumableSampler(N, num_replicas=2, rank=1)))
    with pytest.raises(TypeError, match="ResumableSampler; got RandomSampler"):
        prepare_loader(accelerator, DataLoader(range(N), batch_size=BATCH, shuffle=True))
    prepared = prepare_loader(accelerator, loader(indextar.ResumableSampler(N, seed=1)))
    first = next(iter(prepared))
    assert torch.is_tensor(first) and len(prepared) == N // BATCH
    assert prepared.state_dict()["batches"] == 1
