"""Where a training loop is in its sampler's epoch, counted in batches it trained on.

A DataLoader with workers, and the trainers themselves, draw indices ahead of
training, so neither the sampler nor the loader knows what has been trained on. The
trainer glue counts the batches the loop receives instead, and saves the position
``start + batches * global_batch`` (the rule of ``docs/distributed.md``). Nothing here
imports a trainer or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SamplerStateError
from ..order.sampler import ResumableSampler
from ..order.state import as_int

__all__ = ["PassProgress"]


@dataclass(slots=True)
class PassProgress:
    """The batches the training loop has received in the sampler's epoch.

    Parameters
    ----------
    sampler
        The sampler the training loader draws from.
    global_batch
        Samples of the epoch's global order that one training step uses, summed over
        all processes (per-process batch size times the number of processes).
    """

    sampler: ResumableSampler
    global_batch: int
    epoch: int = -1
    """The epoch of the pass counted; -1 before the first pass."""
    start: int = 0
    """The position of the epoch's global order at which the pass started."""
    batches: int = 0
    """Batches of the pass the loop has received (every rank receives as many)."""
    earlier: int = 0
    """Batches of the same epoch received before the pass: before a restart."""
    finished: bool = False

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise ValueError(f"global_batch must be >= 1; got {self.global_batch}")

    def begin(self) -> None:
        """Start counting a pass at the sampler's epoch and position.

        Call it before the pass draws its first index: after ``set_epoch`` or
        :meth:`load_state_dict`, before the loader's iterator draws from the sampler.
        """
        sampler = self.sampler
        continuing = sampler.epoch == self.epoch and sampler.consumed == self.consumed
        self._start_at_sampler(earlier=self.earlier + self.batches if continuing else 0)

    def _start_at_sampler(self, *, earlier: int) -> None:
        """Count a new pass from the sampler's epoch and position, after ``earlier``
        batches of that epoch."""
        self.epoch, self.start = self.sampler.epoch, self.sampler.consumed
        self.batches, self.finished, self.earlier = 0, False, earlier

    def received(self) -> None:
        """The loop received one more batch of the pass; it trains on it before any save."""
        self.batches += 1

    def finish(self) -> None:
        """The pass ended: its whole epoch counts as used (also a tail ``drop_last`` dropped)."""
        self.finished = True

    @property
    def consumed(self) -> int:
        """Positions of the epoch's global order trained on, over all processes."""
        if self.finished:
            return self.sampler.num_samples
        return min(self.start + self.batches * self.global_batch, self.sampler.num_samples)

    def state_dict(self) -> dict[str, Any]:
        """``{"sampler": the sampler's state at what was trained on, "batches": the
        batches of its epoch received so far}``."""
        if self.epoch < 0:  # no pass yet: the sampler's own position is exact
            return {"sampler": self.sampler.state_dict(), "batches": 0}
        sampler_state = self.sampler.state_dict(consumed=self.consumed)
        sampler_state["epoch"] = self.epoch  # the sampler may already be set to the next
        return {"sampler": sampler_state, "batches": self.earlier + self.batches}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the sampler from a :meth:`state_dict`; the next pass continues it."""
        try:
            sampler_state, batches = state["sampler"], as_int("batches", state["batches"])
        except (KeyError, TypeError) as error:
            raise SamplerStateError(
                f"loader state must be {{'sampler': ..., 'batches': int}}; got {dict(state)!r}"
            ) from error
        self.sampler.load_state_dict(sampler_state)
        self._start_at_sampler(earlier=batches)
