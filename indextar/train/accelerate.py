"""Exact mid-epoch resume in Hugging Face Accelerate: one call instead of ``prepare``.

::

    loader = prepare_loader(accelerator, DataLoader(ds, batch_size=8, sampler=sampler))
    accelerator.load_state(folder)  # when resuming: the loader continues where it was
    for epoch in range(loader.epoch, epochs):
        for batch in loader:
            ...  # the step; accelerator.save_state(folder) after it, whenever you like

Accelerate shards a loader's *batches* over its processes (``BatchSamplerShard``:
process ``p`` takes global batches ``p, p + P, ...``), so every process draws the
same global order: build the sampler with ``num_replicas=1, rank=0``.
:func:`prepare_loader` checks that, prepares the loader, checks that Accelerate kept
the sampler, and registers the loader's position for ``save_state`` / ``load_state``.

When the epoch is not a whole number of rounds (``P`` batches), Accelerate's default
``even_batches=True`` pads the last round with the first batches *of the pass*: in a
resumed pass those follow the resume point, not the epoch's start. The prepared
loader's pass is therefore padded here, before Accelerate sees it, with the epoch's
first positions, as an uninterrupted pass is padded; Accelerate then has nothing left
to pad. Needs the ``accelerate`` extra.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from accelerate import Accelerator
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler, DataLoader

from ..order.sampler import ResumableSampler
from .progress import PassProgress

__all__ = ["ResumableLoader", "prepare_loader"]


def prepare_loader(accelerator: Accelerator, loader: DataLoader[Any]) -> ResumableLoader:
    """``accelerator.prepare(loader)``, resumable with ``save_state`` / ``load_state``.

    Parameters
    ----------
    accelerator
        The run's accelerator.
    loader
        A DataLoader whose ``sampler=`` is a :class:`~indextar.ResumableSampler` built
        with ``num_replicas=1, rank=0``.

    Returns
    -------
    ResumableLoader
        The prepared loader, counting the batches the loop trains on; it is registered
        with ``accelerator.register_for_checkpointing``.

    Raises
    ------
    TypeError
        If the loader's sampler is not a ``ResumableSampler``.
    ValueError
        If the sampler splits the epoch over ranks itself: Accelerate splits its
        batches again, and each of P processes would train on 1/P² of the epoch.
    RuntimeError
        If the prepared loader no longer draws from the sampler.
    """
    sampler = loader.sampler
    if not isinstance(sampler, ResumableSampler):
        raise TypeError(
            f"prepare_loader needs a DataLoader whose sampler= is a ResumableSampler; "
            f"got {type(sampler).__name__}"
        )
    if (sampler.num_replicas, sampler.rank) != (1, 0):
        raise ValueError(
            f"the ResumableSampler has num_replicas={sampler.num_replicas}, "
            f"rank={sampler.rank}, but Accelerate shards the loader's batches over its "
            f"{accelerator.num_processes} processes itself: build the sampler with "
            f"num_replicas=1, rank=0 so that every process draws the same global order"
        )
    prepared = accelerator.prepare(loader)
    drawn_through = _samplers(prepared)
    if not any(inner is sampler for inner in drawn_through):
        raise RuntimeError(
            f"accelerator.prepare replaced the ResumableSampler: the prepared loader draws "
            f"through {[type(inner).__name__ for inner in drawn_through]}, so its order "
            f"would not be indextar's"
        )
    _pad_from_the_epochs_start(prepared, sampler)
    resumable = ResumableLoader(prepared, sampler)
    accelerator.register_for_checkpointing(resumable)
    return resumable


def _pad_from_the_epochs_start(prepared: Any, sampler: ResumableSampler) -> None:
    """Make each pass of ``prepared`` whole global batches before its
    ``BatchSamplerShard`` would pad it from the pass's own first batches."""
    shard = getattr(prepared, "batch_sampler", None)
    if not isinstance(shard, BatchSamplerShard) or not shard.even_batches or shard.drop_last:
        return  # no padding: one process, even_batches=False, or drop_last=True
    shard.batch_sampler = BatchSampler(
        _EpochPaddedPass(sampler, int(prepared.total_batch_size)),
        batch_size=shard.batch_sampler.batch_size,
        drop_last=False,
    )


class _EpochPaddedPass:
    """A sampler's pass, padded to whole global batches with the epoch's first positions.

    Accelerate pads an epoch of ``N`` positions that is not whole global batches of
    ``G`` with positions ``N, N + 1, ...`` wrapped around: the epoch's first ones. A pass
    resumed at position ``c`` (whole global batches before it, on as many processes) is
    padded to the same positions here; one resumed on another number of processes is
    padded to whole global batches of its own, also from the epoch's first positions.

    Parameters
    ----------
    sampler
        The pass to pad: a :class:`~indextar.ResumableSampler` with one replica.
    global_batch
        Positions of the epoch one training step uses over all processes.
    """

    def __init__(self, sampler: ResumableSampler, global_batch: int) -> None:
        if global_batch < 1:
            raise ValueError(f"global_batch must be >= 1; got {global_batch}")
        self.sampler = sampler
        self.global_batch = global_batch

    def _padding(self, count: int) -> int:
        return -count % self.global_batch

    def __len__(self) -> int:
        count = len(self.sampler)
        return count + self._padding(count)

    def __iter__(self) -> Iterator[int]:
        # chain, not a generator over the pass: the sampler's indices stay in C.
        return itertools.chain(self.sampler, self._padding_after_the_pass())

    def _padding_after_the_pass(self) -> Iterator[int]:
        count = len(self.sampler)  # once drawn, the pass's own count
        end = self.sampler.num_samples
        yield from self.sampler.indices(end, end + self._padding(count)).tolist()

    def set_epoch(self, epoch: int) -> None:
        """The sampler's ``set_epoch`` (Accelerate calls it on its loader's sampler)."""
        self.sampler.set_epoch(epoch)


class ResumableLoader:
    """A prepared loader that knows how far the training loop got.

    Iterate it as the prepared loader; every other attribute (``total_batch_size``,
    ``device``, ...) is the prepared loader's. Its ``state_dict`` is the sampler's at
    the batches the loop has received, which it trains on before saving: call
    ``accelerator.save_state`` after a step, not between receiving a batch and
    training on it. Do not combine it with ``accelerator.skip_first_batches``: the
    restored sampler already starts after the batches trained on.
    """

    def __init__(self, loader: Any, sampler: ResumableSampler) -> None:
        self.loader = loader
        self.sampler = sampler
        self._progress = PassProgress(sampler, int(loader.total_batch_size))

    @property
    def epoch(self) -> int:
        """The epoch the next pass runs: a restored one, or the one after a finished pass."""
        return int(getattr(self.loader, "iteration", self.sampler.epoch))

    def set_epoch(self, epoch: int) -> None:
        """Select the next pass's epoch; the epoch in progress keeps a restored position."""
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        # Accelerate calls set_epoch(iteration) when the pass starts; do it first, so
        # that the pass is counted from the position it will really start at.
        self.set_epoch(self.epoch)
        self._progress.begin()
        for batch in self.loader:
            self._progress.received()
            yield batch
        self._progress.finish()

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def state_dict(self) -> dict[str, Any]:
        """``{"sampler": the sampler's state at the batches the loop has received,
        "batches": how many of its epoch that is}``."""
        return self._progress.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the sampler; the next pass trains on the rest of the saved epoch.

        A state saved at the end of an epoch makes the next pass the following epoch.
        """
        sampler = self.sampler
        self._progress.load_state_dict(state)
        if sampler.num_samples and sampler.consumed == sampler.num_samples:
            sampler.set_epoch(sampler.epoch + 1)
        self.set_epoch(sampler.epoch)


def _samplers(loader: object) -> list[object]:
    """Every sampler and batch sampler a loader draws through, outermost first
    (Accelerate's ``BatchSamplerShard`` wraps the loader's ``BatchSampler``, which
    wraps its sampler)."""
    found: list[object] = []
    pending = [loader]
    while pending:
        outer = pending.pop(0)
        for name in ("batch_sampler", "sampler"):
            inner = getattr(outer, name, None)
            if inner is not None and inner is not outer and all(inner is not f for f in found):
                found.append(inner)
                pending.append(inner)
    return found
