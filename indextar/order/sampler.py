"""ResumableSampler: shuffled, distributed and exactly resumable, at any dataset size.

One epoch has a *global order*: positions ``0 .. N-1`` map to dataset indices through
an :class:`~indextar.order.epoch.EpochOrder` chosen by ``(seed, epoch)``. Ranks
interleave over it: rank ``r`` of ``R`` takes positions ``s + r, s + r + R, ...`` where
``s`` is where the pass starts (0, or the resume point). After every rank has handed
out ``k`` indices, the first ``s + k * R`` positions are used, whatever the world size;
that count is ``consumed`` in the state dict, and resuming from it on any world size
hands out each remaining position exactly once.

Every rank gets the same count, ``ceil((N - s) / R)``. With ``drop_last=False`` the last
round of positions runs past ``N`` and wraps to the first positions of the epoch's
order (padding, as :class:`torch.utils.data.DistributedSampler` does); with
``drop_last=True`` the count is ``floor((N - s) / R)`` and the tail is dropped.

With ``weights=`` (or ``epoch_length=``) the data source is a mixture of parts (a
``MixtureDataset`` or torch's ``ConcatDataset``) and an epoch is ``epoch_length`` draws
split between the parts by weight: :mod:`indextar.order.mixture` is its order and
:mod:`indextar.order.weights` its counts and weight schedule. Ranks, padding and
resume work on its positions exactly as above.

The sampler does not need torch: it is a plain iterable with ``__len__``, which
:class:`torch.utils.data.DataLoader` accepts as ``sampler=``. It is not an instance of
``torch.utils.data.Sampler``, so that ``import indextar`` never imports torch.
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..errors import SamplerStateError
from .epoch import DEFAULT_BLOCK_SIZE, EpochOrder, check_shard_sizes, plain_order
from .state import (
    STATE_VERSION,
    as_int,
    check_consumed,
    config_drift,
    selection_of,
    state_consumed,
    state_epoch,
)
from .weights import MixturePlan, WeightsArg
from .world import resolve_world

__all__ = ["ResumableSampler", "DEFAULT_BLOCK_SIZE"]

logger = logging.getLogger(__name__)

_CHUNK = 1 << 16
"""Indices computed per numpy call while iterating."""
_FIRST_CHUNK = 1 << 12
"""The first call's: the first index (start-up, resume) comes after a small chunk."""

Order = Literal["global", "blocks"]


@dataclass(slots=True)
class _Pass:
    """Progress of one ``iter(sampler)``: where it started and how far this rank got."""

    start: int
    count: int
    finished: bool = False


class ResumableSampler:
    """Sample indices of a map-style dataset: shuffled, distributed, resumable.

    Parameters
    ----------
    data_source_or_len
        The dataset (anything with ``len()``) or its length. If it has a
        ``shard_sizes`` attribute (per-shard sample counts), ``order="blocks"`` uses
        shards as blocks by default.
    shuffle
        ``False`` gives the identity order ``0 .. N-1`` in every epoch.
    seed
        Selects the orders; only ``seed mod 2**64`` matters. Must be the same on every
        rank.
    num_replicas, rank
        World size and this process's rank. Default to ``torch.distributed``'s when it
        is initialised, else 1 and 0.
    drop_last
        ``False``: every rank gets ``ceil(remaining / num_replicas)`` indices, padded by
        repeating the first positions of the epoch's order. ``True``: ``floor``, and
        the last ``remaining % num_replicas`` positions are skipped.
    order
        ``"global"``: a uniform pseudorandom permutation of all indices each epoch, in
        O(1) memory. ``"blocks"``: blocks in a random order, indices shuffled within
        each window of ``window_blocks`` consecutive blocks, for shard-local reads.
    block_size
        Samples per block for ``order="blocks"``. Default: the data source's shards if
        it exposes ``shard_sizes``, else :data:`DEFAULT_BLOCK_SIZE`.
    window_blocks
        Number of consecutive blocks shuffled together for ``order="blocks"``.
    strict
        If true, :meth:`load_state_dict` refuses a state saved with another dataset
        size, seed, order, weights or shuffling configuration; if false it logs a
        warning and resumes with this sampler's configuration.
    weights
        Blend the parts of a mixture (``MixtureDataset``, or torch's ``ConcatDataset``
        with a list): by part name (``{"laion": 0.8, "cc12m": 0.2}``), by part number
        (a list), or a callable of the epoch giving either. Each epoch draws exactly
        ``round(w_s / sum(w) * epoch_length)`` from part ``s`` (largest remainders),
        interleaved at random; each part walks its own shuffled passes across epochs.
        When every part counts its tokens (``token_count``: a mixture of
        :class:`~indextar.PackedDataset` parts), the weights are shares of tokens: part
        ``s`` draws ``w_s * len_s / tokens_s`` in proportion, packs being fuller in one
        part than another. Default: the parts' sizes, when ``epoch_length`` is given.
    epoch_length
        Draws per epoch of a mixture (then :attr:`num_samples`). Default: the sum of
        the parts' lengths.

    Notes
    -----
    ``num_samples`` is the dataset size ``N`` (also a state-dict field); ``len(sampler)``
    is this rank's count for the current or next pass.

    Examples
    --------
    >>> sampler = ResumableSampler(10, seed=1, num_replicas=2, rank=0)
    >>> len(sampler), len(list(sampler))
    (5, 5)
    """

    def __init__(
        self,
        data_source_or_len: Any,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        order: Order = "global",
        block_size: int | None = None,
        window_blocks: int = 4,
        strict: bool = True,
        weights: WeightsArg | None = None,
        epoch_length: int | None = None,
    ) -> None:
        if isinstance(data_source_or_len, bool):
            raise TypeError("data_source_or_len must be a dataset or an int; got a bool")
        if isinstance(data_source_or_len, int | np.integer):
            self.num_samples = int(data_source_or_len)
            shard_sizes = None
        else:
            self.num_samples = len(data_source_or_len)
            shard_sizes = getattr(data_source_or_len, "shard_sizes", None)
        # A where-view's (or a mixture's parts') selection: recorded, and checked on load.
        self._selection = selection_of(data_source_or_len)
        if self.num_samples < 0:
            raise ValueError(f"data_source_or_len must be >= 0; got {self.num_samples}")
        if order not in ("global", "blocks"):
            raise ValueError(f"order must be 'global' or 'blocks'; got {order!r}")
        if block_size is not None and (as_int("block_size", block_size) < 1):
            raise ValueError(f"block_size must be >= 1; got {block_size}")
        if as_int("window_blocks", window_blocks) < 1:
            raise ValueError(f"window_blocks must be >= 1; got {window_blocks}")
        self.shuffle = bool(shuffle)
        self.seed = as_int("seed", seed)
        self.drop_last = bool(drop_last)
        self.order: Order = order
        self.block_size = block_size
        self.window_blocks = int(window_blocks)
        self.strict = bool(strict)
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        self._mixture: MixturePlan | None = None
        if weights is not None or epoch_length is not None:
            self._mixture = MixturePlan.make(data_source_or_len, weights, epoch_length)
            self.num_samples, shard_sizes = self._mixture.epoch_length, None
        self._shard_sizes = (
            check_shard_sizes(shard_sizes, self.num_samples) if block_size is None else None
        )

        self._epoch = 0
        self._next_start = 0
        self._current: _Pass | None = None
        # The list iterator being handed out and where it sits in the pass, so that
        # ``consumed`` is exact without a per-index counter.
        self._slice: Iterator[int] = iter(())
        self._slice_first = 0
        self._slice_size = 0
        self._order_cache: tuple[int, EpochOrder] | None = None

    # -- epoch and progress -------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch whose order is handed out."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next pass.

        A different epoch starts at position 0. The current epoch is a no-op, so a
        training loop that calls ``set_epoch`` at the top of every epoch keeps a
        position restored by :meth:`load_state_dict`.
        """
        epoch = as_int("epoch", epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0; got {epoch}")
        if epoch != self._epoch:
            self._epoch = epoch
            self._next_start = 0
            self._current = None

    def set_weights(self, weights: Any, *, epoch: int | None = None) -> None:
        """Blend the parts by ``weights`` from ``epoch`` on: by default the next epoch
        to begin (this one if no pass of it has started, else the one after).

        Earlier epochs keep their weights, so each part's passes continue where they
        were; the change is part of the state dict. For curricula; ``weights=`` may also
        be a callable of the epoch.
        """
        if self._mixture is None:
            raise ValueError("set_weights needs a sampler built with weights= or epoch_length=")
        started = self._current is not None or self._next_start > 0
        first = self._epoch + started
        if epoch is not None and as_int("epoch", epoch) < first:
            raise ValueError(
                f"weights can change from epoch {first} on (epoch {self._epoch} has "
                f"{'begun' if started else 'not begun'}); got epoch={epoch}"
            )
        self._mixture.set_weights(weights, first if epoch is None else epoch)
        self._order_cache = None

    @property
    def weights(self) -> tuple[float, ...] | None:
        """This epoch's weights, one per part (``None`` without ``weights=``)."""
        return None if self._mixture is None else self._mixture.weights_at(self._epoch)

    @property
    def consumed(self) -> int:
        """Positions of this epoch's global order handed out across all ranks.

        Counts what this sampler's current pass has handed out, assuming every rank
        keeps pace (``start + num_replicas * handed_out``), capped at ``num_samples``;
        ``num_samples`` once the pass is over. Before a pass, the position it starts at.
        """
        current = self._current
        if current is None:
            return self._next_start
        handed_out = self._slice_first + self._slice_size - operator.length_hint(self._slice)
        if current.finished or handed_out >= current.count:
            return self.num_samples  # a dropped tail (drop_last=True) counts as used
        return current.start + self.num_replicas * handed_out

    def __len__(self) -> int:
        """This rank's number of indices in the current pass, or in the next one."""
        start = self._current.start if self._current is not None else self._next_start
        return self.count_from(start)

    def count_from(self, start: int) -> int:
        """This rank's number of indices in a pass that begins at position ``start`` of
        the epoch's order (``count_from(0)``: a whole epoch's)."""
        remaining = self.num_samples - start
        if self.drop_last:
            return remaining // self.num_replicas
        return -(-remaining // self.num_replicas)

    # -- iteration ----------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        """Yield this rank's indices, from :attr:`consumed` to the end of the epoch.

        The pass begins at the first ``next()``, not at ``iter()``: DataLoader creates
        index iterators it never uses.
        """
        # chain hands out each index in C: the generator below resumes once a chunk, not
        # once an index (a generator's resume costs about as much as computing an index).
        return itertools.chain.from_iterable(self._chunks())

    def _chunks(self) -> Iterator[Iterator[int]]:
        """This pass's indices, a chunk at a time, each an iterator over a list."""
        start = self._next_start
        self._next_start = 0  # the pass after this one starts the epoch afresh
        current = _Pass(start=start, count=self.count_from(start))
        self._current = current
        self._set_slice(iter(()), 0, 0)
        order = self._epoch_order()
        stride = self.num_replicas
        first = current.start + self.rank
        chunk_start, chunk = 0, _FIRST_CHUNK
        while chunk_start < current.count:
            chunk_end = min(chunk_start + chunk, current.count)
            positions = first + stride * np.arange(chunk_start, chunk_end, dtype=np.int64)
            if first + stride * (chunk_end - 1) >= self.num_samples:
                positions %= self.num_samples  # padding wraps to the epoch's first positions
            indices = iter(order.indices(positions).tolist())
            if self._current is current:
                self._set_slice(indices, chunk_start, chunk_end - chunk_start)
            yield indices
            chunk_start, chunk = chunk_end, _CHUNK
        current.finished = True

    def _set_slice(self, indices: Iterator[int], first: int, size: int) -> None:
        self._slice, self._slice_first, self._slice_size = indices, first, size

    def indices(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """Return the dataset indices at global positions ``start .. stop-1`` of this epoch.

        Positions at or past ``num_samples`` wrap around (the padding). Useful to
        inspect the order without iterating; independent of rank and progress.
        """
        if not 0 <= start <= stop:
            raise ValueError(f"need 0 <= start <= stop; got start={start}, stop={stop}")
        positions = np.arange(start, stop, dtype=np.int64)
        if self.num_samples == 0:
            if positions.size:
                raise ValueError("the dataset is empty; there are no positions")
            return positions
        return self._epoch_order().indices(positions % self.num_samples)

    def _epoch_order(self) -> EpochOrder:
        cached = self._order_cache
        if cached is not None and cached[0] == self._epoch:
            return cached[1]
        order: EpochOrder
        if self._mixture is not None:
            order = self._mixture.order(
                self._epoch,
                seed=self.seed,
                shuffle=self.shuffle,
                order=self.order,
                block_size=self.block_size,
                window_blocks=self.window_blocks,
            )
        else:
            order = plain_order(
                self.num_samples,
                seed=self.seed,
                epoch=self._epoch,
                shuffle=self.shuffle,
                blocks=self.order == "blocks",
                block_size=self.block_size,
                window_blocks=self.window_blocks,
                shard_sizes=self._shard_sizes,
            )
        self._order_cache = (self._epoch, order)
        return order

    # -- state --------------------------------------------------------------------

    def state_dict(self, *, consumed: int | None = None) -> dict[str, Any]:
        """Return a JSON-serialisable snapshot: the epoch, the position, the config.

        Parameters
        ----------
        consumed
            The position to record instead of :attr:`consumed`. A DataLoader with
            workers draws indices ahead of the training loop, so a loop that checkpoints
            by itself records what it has trained on: the position at which its pass
            started plus ``steps * global_batch_size``.

        Returns
        -------
        dict
            ``version``, ``epoch``, ``consumed``, the fields that must match on load
            (``num_samples``, ``seed``, ``shuffle``, ``order``, ``drop_last``,
            ``block_size``, ``window_blocks``; for a mixture ``part_sizes`` and the
            ``weights`` history, ``[{"epoch", "weights"}, ...]``; for a ``where`` view,
            or a mixture of some, ``selection``) and, for information,
            ``num_replicas``.
        """
        if consumed is None:
            consumed = self.consumed
        else:
            consumed = check_consumed(consumed, self.num_samples)
        state = {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "consumed": consumed,
            "num_replicas": self.num_replicas,
            **self._config(),
        }
        if self._mixture is not None:
            state["weights"] = self._mixture.state(self._epoch)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state["consumed"]`` of ``state["epoch"]``, on this world size.

        ``state`` is a :meth:`state_dict` or any mapping with at least ``epoch`` and
        ``consumed``; configuration fields present in it must match this sampler's
        (unless ``strict=False``). The next ``iter()`` hands out the remaining
        positions, split over this sampler's ``num_replicas``. O(1): nothing is replayed.

        Raises
        ------
        SamplerStateError
            For a missing ``epoch`` or ``consumed``, an unknown key, a value of the
            wrong type or range, or (``strict=True``) a configuration mismatch.
        """
        epoch = state_epoch(state)
        messages = list(config_drift(state, self._config()))
        weights_drift = MixturePlan.drift_of(self._mixture, state)
        messages += [weights_drift] if weights_drift else []
        adopt = "weights" in state and weights_drift is None
        for message in messages:
            if self.strict:
                raise SamplerStateError(message + " (pass strict=False to resume anyway)")
            logger.warning("%s; resuming with this sampler's value (strict=False)", message)
        consumed = state_consumed(state, self.num_samples)
        if adopt and self._mixture is not None:  # the saved set_weights history
            self._mixture.adopt(state["weights"])
        self._order_cache = None
        self._epoch = epoch
        self._next_start = consumed
        self._current = None

    def _config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "num_samples": self.num_samples,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "order": self.order,
            "drop_last": self.drop_last,
            "block_size": self.block_size,
            "window_blocks": self.window_blocks,
        }
        if self._mixture is not None:
            config["part_sizes"] = list(self._mixture.part_sizes)
        if self._selection is not None:
            config["selection"] = self._selection
        return config

    def __repr__(self) -> str:
        return (
            f"ResumableSampler(num_samples={self.num_samples}, shuffle={self.shuffle}, "
            f"seed={self.seed}, num_replicas={self.num_replicas}, rank={self.rank}, "
            f"order={self.order!r}, epoch={self._epoch}, consumed={self.consumed})"
        )
