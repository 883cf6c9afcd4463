"""indextar.train without a trainer run: imports, refusals, and the loader's count."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader
from trainruns import ROOT

import indextar
from indextar.errors import SamplerStateError
from indextar.train.lightning import ResumableDataLoader


def test_import_indextar_imports_no_trainer() -> None:
    code = (
        "import sys, indextar\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in "
        "('pytorch_lightning', 'lightning', 'accelerate', 'indextar.train')]\n"
        "assert not loaded and 'indextar.train' not in sys.modules, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_loader_saves_what_the_loop_received_not_what_workers_prefetched() -> None:
    sampler = indextar.ResumableSampler(40, seed=3)
    loader = ResumableDataLoader(range(40), batch_size=4, sampler=sampler, num_workers=1)
    iterator = iter(loader)
    received = [next(iterator).tolist() for _ in range(3)]
    state = loader.state_dict()  # workers have drawn further: the sampler's count is ahead
    assert state["batches"] == 3 and state["sampler"]["consumed"] == 12
    assert sampler.consumed > 12
    del iterator

    resumed = ResumableDataLoader(
        range(40), batch_size=2, sampler=indextar.ResumableSampler(40, seed=3)
    )
    resumed.load_state_dict(state)
    # Lightning counts on from the 3 batches done: 3 + 14 of the new size would end the
    # epoch, but a whole epoch of batches of 2 is longer, and the next one needs it.
    assert len(resumed) == max(3 + 14, 40 // 2)
    rest = [b.tolist() for b in resumed]
    order = sampler.indices(0, 40).tolist()
    assert sum(received, []) + sum(rest, []) == order
    assert resumed.state_dict()["sampler"]["consumed"] == 40


def test_the_loader_refuses_other_samplers_and_bad_states() -> None:
    with pytest.raises(TypeError, match="ResumableSampler; got RandomSampler"):
        ResumableDataLoader(range(8), batch_size=2, shuffle=True)
    # What Lightning puts in its place under DDP with use_distributed_sampler=True.
    from lightning_fabric.utilities.distributed import DistributedSamplerWrapper

    wrapped = DistributedSamplerWrapper(indextar.ResumableSampler(8), num_replicas=2, rank=0)
    with pytest.raises(TypeError, match=r"use_distributed_sampler=False"):
        ResumableDataLoader(range(8), batch_size=2, sampler=wrapped)
    loader = ResumableDataLoader(range(8), batch_size=2, sampler=indextar.ResumableSampler(8))
    with pytest.raises(SamplerStateError, match="'sampler'"):
        loader.load_state_dict({"epoch": 0, "consumed": 4})  # a bare sampler state
    assert torch.equal(
        next(iter(loader)),
        next(iter(DataLoader(range(8), batch_size=2, sampler=indextar.ResumableSampler(8)))),
    )
