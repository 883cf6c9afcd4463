"""BucketBatchSampler: batches of one bucket each, shuffled, distributed, resumable.

Every sample has a bucket (an aspect-ratio or length class, computed by the caller, for
example with :func:`indextar.read.selection.bucket_ids`). One epoch:

1. Within bucket ``k`` of ``n_k`` samples, a keyed permutation of ``range(n_k)`` (seed,
   epoch, ``k``) orders its samples; consecutive runs of ``batch_size`` of that order
   are its ``b_k`` batches. ``b_k = ceil(n_k / batch_size)``, the last batch completed
   with the bucket's first samples of this epoch's order; with ``drop_last=True``,
   ``floor``, and the incomplete run left out this epoch.
2. The ``B = sum(b_k)`` batches are put in one uniformly shuffled order (a keyed
   permutation of ``range(B)``): a batch's bucket is uniformly random, in proportion
   to the buckets' sizes, and samples within a bucket are a fresh shuffle each epoch.
3. Ranks interleave over that order as :class:`~indextar.ResumableSampler` does over
   positions: rank ``r`` of ``R`` takes batch positions ``s + r, s + r + R, ...``, every
   rank the same count (``ceil((B - s) / R)``, wrapping to the epoch's first batches; or
   ``floor`` with ``drop_last``). ``consumed`` counts batch positions used across all
   ranks, so a state saved on one world size resumes on another.

Nothing per epoch is stored: each batch is computed when handed out. What the sampler
holds is the samples grouped by bucket, one array of sample numbers (uint32 below
2**32 samples, else int64): 4 GB at 1e9 samples, besides the caller's bucket ids.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SamplerStateError
from .permutation import KeyedPermutation, derive_round_keys, permute_grouped
from .state import as_int, check_consumed, config_drift, selection_of
from .world import resolve_world

__all__ = ["BucketBatchSampler"]

logger = logging.getLogger(__name__)

STATE_VERSION = 1
_TAG_BATCHES = 21
_TAG_BUCKET = 22
_CONFIG_FIELDS = (  # checked in this order: the first that differs is reported
    "selection",
    "batch_size",
    "seed",
    "shuffle",
    "drop_last",
    "bucket_sizes",
    "buckets_digest",
    "num_batches",
)
_KNOWN = frozenset(_CONFIG_FIELDS + ("version", "epoch", "consumed", "num_replicas"))


class BucketBatchSampler:
    """Batch sampler whose every batch holds samples of one bucket (DataLoader's
    ``batch_sampler=``); see the module docstring for the order.

    Parameters
    ----------
    buckets
        The bucket of each sample (any integers), one per sample of the dataset, in its
        order: ``indextar.read.selection.bucket_ids(ds, "width * 1.0 / height", [...])``.
    batch_size
        Samples per batch (per rank).
    seed
        Selects the orders; the same on every rank.
    shuffle
        ``False``: buckets in order, each in sample order (batches still one bucket each).
    num_replicas, rank
        World size and this process's rank; default from ``torch.distributed``.
    drop_last
        ``False``: a bucket's last batch is completed with its first samples, and the
        ranks' last round wraps to the epoch's first batches, so every rank gets
        ``ceil`` batches. ``True``: incomplete batches are left out, and the ranks' tail.
    data
        The dataset (or view) the buckets belong to: its length is checked, and its
        ``selection`` (a ``where`` view's) is recorded in the state and checked on load.
    strict
        Refuse (``True``) or warn about (``False``) a state saved with another
        configuration.
    """

    def __init__(
        self,
        buckets: npt.ArrayLike,
        *,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        data: Any = None,
        strict: bool = True,
    ) -> None:
        ids = np.asarray(buckets)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise TypeError(f"buckets must be a 1-D array of integers; got {ids.dtype} {ids.shape}")
        self.batch_size = as_int("batch_size", batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}")
        if data is not None and len(data) != ids.size:
            raise ValueError(f"{ids.size} bucket ids for a dataset of {len(data)} samples")
        self.seed = as_int("seed", seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.strict = bool(strict)
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        self._selection = selection_of(data) if data is not None else None
        self.labels, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
        self._digest = hashlib.blake2b(
            np.ascontiguousarray(ids, dtype="<i8").tobytes(), digest_size=16
        ).hexdigest()
        index_type = np.uint32 if ids.size < 1 << 32 else np.int64
        # The samples grouped by bucket (stable: each bucket in sample order).
        self._members = np.argsort(inverse, kind="stable").astype(index_type)
        self._sizes = counts.astype(np.int64)
        self._starts = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)
        per_bucket = self._sizes // self.batch_size
        if not self.drop_last:
            per_bucket = -(-self._sizes // self.batch_size)
        self._batches = per_bucket
        self._batch_starts = np.concatenate([[0], np.cumsum(per_bucket)]).astype(np.int64)
        self.num_batches = int(self._batch_starts[-1])
        """Batches in one epoch, across all ranks."""
        self._epoch = 0
        self._next_start = 0
        self._handed_out = 0  # by this rank, in the current pass
        self._pass_start: int | None = None
        self._keys: tuple[int, npt.NDArray[np.uint64]] | None = None

    # -- epochs ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch whose order is handed out."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass; the current epoch is a no-op (keeps a
        position restored by :meth:`load_state_dict`)."""
        epoch = as_int("epoch", epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0; got {epoch}")
        if epoch != self._epoch:
            self._epoch, self._next_start, self._pass_start = epoch, 0, None

    @property
    def consumed(self) -> int:
        """Batch positions of this epoch's order handed out across all ranks (assuming
        every rank keeps pace), capped at :attr:`num_batches`."""
        if self._pass_start is None:
            return self._next_start
        if self._handed_out >= self._count_from(self._pass_start):
            return self.num_batches
        return min(self.num_batches, self._pass_start + self.num_replicas * self._handed_out)

    def _count_from(self, start: int) -> int:
        remaining = self.num_batches - start
        if self.drop_last:
            return remaining // self.num_replicas
        return -(-remaining // self.num_replicas)

    def __len__(self) -> int:
        """This rank's batches in the current pass, or in the next one."""
        return self._count_from(
            self._pass_start if self._pass_start is not None else self._next_start
        )

    # -- the order --------------------------------------------------------------------

    def batch(self, position: int) -> list[int]:
        """The sample numbers of the batch at ``position`` of this epoch's order (any
        rank's); positions at or past :attr:`num_batches` wrap."""
        return self._batches_at(np.array([position], dtype=np.int64))[0]

    def _batches_at(self, positions: npt.NDArray[np.int64]) -> list[list[int]]:
        positions = positions % self.num_batches
        if self.shuffle:
            order = KeyedPermutation.from_seed(
                self.num_batches, self.seed, _TAG_BATCHES, self._epoch
            )
            batch_ids = order.permute(positions)
        else:
            batch_ids = positions
        bucket = np.searchsorted(self._batch_starts, batch_ids, side="right") - 1
        within = batch_ids - self._batch_starts[bucket]
        slots = within[:, None] * self.batch_size + np.arange(self.batch_size, dtype=np.int64)
        sizes = self._sizes[bucket][:, None]
        slots = slots % sizes  # a bucket's last batch wraps to its first samples
        groups = np.broadcast_to(bucket[:, None], slots.shape).reshape(-1)
        flat = slots.reshape(-1)
        if self.shuffle:
            flat = permute_grouped(flat, groups, self._sizes, self._round_keys())
        samples = self._members[self._starts[groups] + flat].astype(np.int64)
        return [row.tolist() for row in samples.reshape(slots.shape)]

    def _round_keys(self) -> npt.NDArray[np.uint64]:
        if self._keys is None or self._keys[0] != self._epoch:
            keys = [
                derive_round_keys(self.seed, _TAG_BUCKET, self._epoch, k)
                for k in range(self._sizes.size)
            ]
            self._keys = (self._epoch, np.array(keys, dtype=np.uint64))
        return self._keys[1]

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's batches, from :attr:`consumed` to the end of the epoch."""
        start = self._next_start
        self._next_start = 0
        self._pass_start, self._handed_out = start, 0
        count = self._count_from(start)
        chunk = 256
        for first in range(0, count, chunk):
            steps = np.arange(first, min(first + chunk, count), dtype=np.int64)
            for batch in self._batches_at(start + self.rank + self.num_replicas * steps):
                self._handed_out += 1
                yield batch

    # -- state --------------------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "num_batches": self.num_batches,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "bucket_sizes": self._sizes.tolist(),
            "buckets_digest": self._digest,
        }
        if self._selection is not None:
            config["selection"] = self._selection
        return config

    def state_dict(self, *, consumed: int | None = None) -> dict[str, Any]:
        """A JSON-serialisable snapshot: ``epoch``, ``consumed`` (batch positions across
        all ranks; pass ``steps * num_replicas`` plus where the pass began when the
        DataLoader's workers prefetch), and the configuration checked on load."""
        consumed = self.consumed if consumed is None else check_consumed(consumed, self.num_batches)
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "consumed": consumed,
            "num_replicas": self.num_replicas,
            **self._config(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state["consumed"]`` of ``state["epoch"]`` on this world size.

        Raises
        ------
        SamplerStateError
            For a malformed state, or (``strict=True``) another configuration: batch
            size, seed, buckets or selection.
        """
        if not isinstance(state, Mapping) or "epoch" not in state or "consumed" not in state:
            raise SamplerStateError(f"bucket sampler state needs epoch and consumed; got {state!r}")
        unknown = sorted(set(state) - _KNOWN, key=str)
        if unknown:
            raise SamplerStateError(f"bucket sampler state has unknown keys {unknown}")
        if state.get("version", STATE_VERSION) != STATE_VERSION:
            raise SamplerStateError(f"bucket sampler state has version {state['version']!r}")
        drift = config_drift(
            state, self._config(), fields=_CONFIG_FIELDS, what="bucket sampler state"
        )
        for message in drift:
            if self.strict:
                raise SamplerStateError(message + " (pass strict=False to resume anyway)")
            logger.warning("%s; resuming with this sampler's value", message)
        try:
            epoch = as_int("epoch", state["epoch"])
            consumed = check_consumed(as_int("consumed", state["consumed"]), self.num_batches)
        except (TypeError, ValueError) as e:
            raise SamplerStateError(f"bucket sampler state: {e}") from e
        if epoch < 0:
            raise SamplerStateError(f"bucket sampler state has epoch={epoch}; expected >= 0")
        self._epoch, self._next_start, self._pass_start = epoch, consumed, None

    def __repr__(self) -> str:
        return (
            f"BucketBatchSampler({self._sizes.size} buckets, {self.num_batches} batches of "
            f"{self.batch_size}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"epoch={self._epoch}, consumed={self.consumed})"
        )
