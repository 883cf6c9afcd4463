"""Exact mid-epoch resume in PyTorch Lightning: a DataLoader Lightning checkpoints.

In the ``LightningDataModule``, build the train loader with
:class:`ResumableDataLoader` instead of ``DataLoader``::

    def train_dataloader(self):
        sampler = indextar.ResumableSampler(self.dataset, seed=0)  # rank, world from dist
        return ResumableDataLoader(self.dataset, batch_size=32, sampler=sampler, num_workers=4)

Lightning saves the ``state_dict`` of a train loader that has one in every checkpoint
and gives it back through ``load_state_dict`` when ``trainer.fit(..., ckpt_path=...)``
restarts, before the loader's first iterator is made. The state is the sampler's
position, counted in batches the loop has received: the restarted run trains on
exactly the rest of the interrupted epoch, in the same order, on any number of
devices or workers. Under DDP pass ``Trainer(use_distributed_sampler=False)``: the
sampler splits the epoch over ranks itself. Lightning by itself restarts a loader
from the beginning of the epoch (``docs/trainers.md`` measures it).

Only torch is needed to import this module; the ``lightning`` extra installs
``pytorch-lightning``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader

from ..order.sampler import ResumableSampler
from .progress import PassProgress

__all__ = ["ResumableDataLoader"]


class ResumableDataLoader(DataLoader[Any]):
    """A ``DataLoader`` over a :class:`~indextar.ResumableSampler` with ``state_dict``.

    Takes ``DataLoader``'s arguments; ``sampler=`` must be a ``ResumableSampler`` and
    ``batch_size=`` a number. :meth:`state_dict` is the sampler's state at the batches
    this loader has handed to the training loop (a trainer that checkpoints after a
    step has trained on all of them), whatever its workers have prefetched.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        sampler = self.sampler
        if not isinstance(sampler, ResumableSampler):
            hint = ""
            if isinstance(
                getattr(getattr(sampler, "dataset", None), "_sampler", None), ResumableSampler
            ):
                hint = (
                    ": Lightning replaced the ResumableSampler with its own distributed "
                    "sampler, which would split and shuffle the epoch again; pass "
                    "Trainer(use_distributed_sampler=False)"
                )
            raise TypeError(
                f"ResumableDataLoader needs sampler= a ResumableSampler; got "
                f"{type(sampler).__name__}{hint}"
            )
        if self.batch_size is None:
            raise ValueError("ResumableDataLoader needs batch_size=; it counts samples in batches")
        self._progress = PassProgress(sampler, self.batch_size * sampler.num_replicas)

    @property
    def resumable_sampler(self) -> ResumableSampler:
        """The sampler whose position this loader saves and restores."""
        return self._progress.sampler

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # A generator: the pass is counted from the first next(), after the trainer's
        # set_epoch and load_state_dict, when the sampler draws its first index.
        progress = self._progress
        progress.begin()
        for batch in super().__iter__():
            progress.received()
            yield batch
        progress.finish()

    def __len__(self) -> int:
        """Batches of this rank's epoch, as Lightning counts them.

        Lightning reads the length once and resumes counting at the batches of the
        epoch trained before the restart, so a resumed epoch is those plus the
        batches of the rest. After a resume with another global batch size, that
        differs from a whole epoch's count; the larger is given, and the end of the
        loader ends the shorter epoch, so that no batch is ever cut off.
        """
        progress, sampler = self._progress, self._progress.sampler
        per_rank = sampler.count_from(0)  # this rank's indices in a whole epoch
        batch_size = self.batch_size or 1
        whole = per_rank // batch_size if self.drop_last else -(-per_rank // batch_size)
        earlier = progress.earlier if progress.epoch == sampler.epoch else 0
        return max(whole, earlier + super().__len__())

    def state_dict(self) -> dict[str, Any]:
        """``{"sampler": the sampler's state at the batches handed to the training loop,
        "batches": how many of its epoch that is}``."""
        return self._progress.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the sampler: the next pass trains on the rest of the saved epoch."""
        self._progress.load_state_dict(state_dict)
