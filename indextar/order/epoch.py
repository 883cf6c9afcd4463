"""The order of one epoch: a map from global positions ``[0, N)`` to dataset indices.

:class:`~indextar.order.sampler.ResumableSampler` hands out positions and asks an
:class:`EpochOrder` which index sits at each, a numpy chunk at a time. Nothing here
knows about ranks, workers or resume; see :mod:`indextar.order.sampler` for those.

Three orders:

- :class:`SequentialOrder`: position ``p`` is index ``p`` (``shuffle=False``).
- :class:`GlobalOrder`: a keyed pseudorandom permutation of all ``N`` indices
  (:class:`~indextar.order.permutation.KeyedPermutation`), O(1) memory.
- :class:`BlockOrder`: blocks (shards, or runs of ``block_size`` indices) in a shuffled
  order, and indices shuffled within each window of ``window_blocks`` consecutive
  blocks of that order, so that reading stays local to a few shards at a time. Memory
  is O(number of blocks).
- :class:`UniformBlockOrder`: the same order as :class:`BlockOrder` over
  :func:`uniform_blocks`, computed from positions alone: O(1) memory and start-up at
  any size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from .permutation import KeyedPermutation

__all__ = [
    "EpochOrder",
    "SequentialOrder",
    "GlobalOrder",
    "BlockOrder",
    "UniformBlockOrder",
    "uniform_blocks",
    "plain_order",
    "check_shard_sizes",
    "DEFAULT_BLOCK_SIZE",
]

DEFAULT_BLOCK_SIZE = 1024
"""Block size for ``order="blocks"`` when the data source does not expose ``shard_sizes``."""

# Purpose tags mixed into the round keys, so that the global permutation, the block
# permutation and the window permutations of one (seed, epoch) are independent.
_TAG_GLOBAL = 1
_TAG_BLOCKS = 2
_TAG_WINDOW = 3

Positions = npt.NDArray[np.int64]


class EpochOrder(Protocol):
    """Maps positions of one epoch's order to dataset indices."""

    def indices(self, positions: Positions) -> Positions:
        """Return the dataset index at each position (all in ``[0, N)``)."""
        ...


@dataclass(frozen=True, slots=True)
class SequentialOrder:
    """Position ``p`` is index ``p``."""

    def indices(self, positions: Positions) -> Positions:
        """Return ``positions`` unchanged, as int64."""
        return np.asarray(positions, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class GlobalOrder:
    """A pseudorandom permutation of all ``size`` indices for ``(seed, epoch)``."""

    size: int
    seed: int
    epoch: int
    _permutation: KeyedPermutation = field(init=False, repr=False)

    def __post_init__(self) -> None:
        permutation = KeyedPermutation.from_seed(self.size, self.seed, _TAG_GLOBAL, self.epoch)
        object.__setattr__(self, "_permutation", permutation)

    def indices(self, positions: Positions) -> Positions:
        """Return the permuted index at each position."""
        return self._permutation.permute(positions)


def uniform_blocks(size: int, block_size: int) -> npt.NDArray[np.int64]:
    """Return the sizes of consecutive blocks of ``block_size`` covering ``range(size)``.

    The last block holds the remainder.
    """
    full, rest = divmod(size, block_size)
    sizes = np.full(full + (rest > 0), block_size, dtype=np.int64)
    if rest:
        sizes[-1] = rest
    return sizes


@dataclass(frozen=True, slots=True)
class BlockOrder:
    """Shuffled blocks, with indices shuffled within windows of consecutive blocks.

    Parameters
    ----------
    block_sizes
        Number of indices in each block, in index order; blocks are contiguous, the
        first starting at index 0. Empty blocks are allowed and skipped.
    seed, epoch
        Select the block order and the in-window orders.
    window_blocks
        How many consecutive blocks of the shuffled block order are mixed together.
    """

    block_sizes: npt.NDArray[np.int64]
    seed: int
    epoch: int
    window_blocks: int
    # Stream layout, all in the shuffled block order (empty blocks removed):
    _first_index: npt.NDArray[np.int64] = field(init=False, repr=False)
    _stream_start: npt.NDArray[np.int64] = field(init=False, repr=False)
    _window_start: npt.NDArray[np.int64] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        sizes = np.asarray(self.block_sizes, dtype=np.int64)
        if sizes.ndim != 1 or (sizes.size and int(sizes.min()) < 0):
            raise ValueError("block_sizes must be a 1-d array of non-negative counts")
        if self.window_blocks < 1:
            raise ValueError(f"window_blocks must be >= 1; got {self.window_blocks}")
        first_index = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        nonempty = np.flatnonzero(sizes)
        sizes, first_index = sizes[nonempty], first_index[nonempty]
        if sizes.size:
            shuffle = KeyedPermutation.from_seed(sizes.size, self.seed, _TAG_BLOCKS, self.epoch)
            order = shuffle.permute(np.arange(sizes.size, dtype=np.int64))
            sizes, first_index = sizes[order], first_index[order]
        stream_start = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        window_start = stream_start[:: self.window_blocks]
        if window_start[-1] != stream_start[-1]:
            window_start = np.append(window_start, stream_start[-1])
        object.__setattr__(self, "_first_index", first_index)
        object.__setattr__(self, "_stream_start", stream_start)
        object.__setattr__(self, "_window_start", window_start)

    def indices(self, positions: Positions) -> Positions:
        """Return the index at each position of the shuffled block stream."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return positions.copy()
        window = np.searchsorted(self._window_start, positions, side="right") - 1
        shuffled = _shuffle_in_windows(
            positions, window, self._window_start.__getitem__, self.seed, self.epoch
        )
        slot = np.searchsorted(self._stream_start, shuffled, side="right") - 1
        return self._first_index[slot] + (shuffled - self._stream_start[slot])


def _shuffle_in_windows(
    positions: Positions,
    window: Positions,
    window_start: Callable[[int], Any],
    seed: int,
    epoch: int,
) -> Positions:
    """Each position shuffled within its window, windows ``[start(w), start(w + 1))``."""
    shuffled = np.empty_like(positions)
    # Positions handed out together are close and mostly increasing, so a chunk is a
    # few runs of one window each; permute run by run.
    run_starts = np.concatenate(([0], np.flatnonzero(np.diff(window)) + 1, [window.size]))
    for begin, end in zip(run_starts[:-1].tolist(), run_starts[1:].tolist()):
        w = int(window[begin])
        start, stop = int(window_start(w)), int(window_start(w + 1))
        in_window = KeyedPermutation.from_seed(stop - start, seed, _TAG_WINDOW, epoch, w)
        shuffled[begin:end] = start + in_window.permute(positions[begin:end] - start)
    return shuffled


@dataclass(frozen=True, slots=True)
class UniformBlockOrder:
    """:class:`BlockOrder` over ``uniform_blocks(size, block_size)``, in O(1) memory.

    Blocks of ``block_size`` indices (the last one holding the remainder) are shuffled
    by the same keyed permutation, and windows of ``window_blocks`` consecutive blocks
    by the same per-window permutations, so the indices are identical to
    ``BlockOrder(uniform_blocks(size, block_size), seed, epoch, window_blocks)``.
    Where that stores a few arrays per block (hundreds of MB at ``size = 1e10``), every
    block's place here follows from the block permutation and from where the short
    last block landed in the stream (found once, by the permutation's inverse).
    """

    size: int
    block_size: int
    seed: int
    epoch: int
    window_blocks: int
    _blocks: KeyedPermutation | None = field(init=False, repr=False)
    _count: int = field(init=False, repr=False)  # number of blocks
    _short_slot: int = field(init=False, repr=False)  # stream slot of the last block
    _shortfall: int = field(init=False, repr=False)  # block_size - the last block's size

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.window_blocks < 1 or self.size < 0:
            raise ValueError(
                "block_size and window_blocks must be >= 1 and size >= 0; got "
                f"{self.block_size}, {self.window_blocks}, {self.size}"
            )
        count = -(-self.size // self.block_size)
        blocks = None
        if count:
            blocks = KeyedPermutation.from_seed(count, self.seed, _TAG_BLOCKS, self.epoch)
        object.__setattr__(self, "_blocks", blocks)
        object.__setattr__(self, "_count", count)
        object.__setattr__(self, "_short_slot", blocks.position_of(count - 1) if blocks else 0)
        object.__setattr__(self, "_shortfall", count * self.block_size - self.size)

    def indices(self, positions: Positions) -> Positions:
        """Return the index at each position of the shuffled block stream."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0 or self._blocks is None:
            return positions.copy()
        block = self.block_size
        windows = -(-self._count // self.window_blocks)
        # The window of each position: its window if all blocks were full, or the next
        # one where the short block, earlier in the stream, moved that one's start back.
        window = np.minimum(positions // (block * self.window_blocks), windows - 1)
        window += self._window_start(window + 1) <= positions
        shuffled = _shuffle_in_windows(
            positions, window, lambda w: self._window_start(np.array(w)), self.seed, self.epoch
        )
        # The stream slot of each shuffled position: full blocks before the short one,
        # the short one, then full blocks shifted back by its shortfall.
        short_start = self._short_slot * block
        slot = np.where(
            shuffled < short_start,
            shuffled // block,
            np.where(
                shuffled < short_start + block - self._shortfall,
                self._short_slot,
                (shuffled + self._shortfall) // block,
            ),
        )
        offset = shuffled - self._slot_start(slot)
        return self._blocks.permute(slot) * block + offset

    def _slot_start(self, slots: Positions) -> Positions:
        """Where the block in each stream slot starts in the stream."""
        return slots * self.block_size - self._shortfall * (slots > self._short_slot)

    def _window_start(self, windows: Positions) -> Positions:
        """Where each window starts in the stream (``size`` past the last one)."""
        slots = windows * self.window_blocks
        return np.where(
            slots >= self._count,
            np.int64(self.size),
            self._slot_start(np.minimum(slots, self._count)),
        )


def plain_order(
    size: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    blocks: bool,
    block_size: int | None,
    window_blocks: int,
    shard_sizes: Positions | None,
) -> EpochOrder:
    """The order of one epoch of a dataset of ``size`` samples (not a mixture), as
    ``ResumableSampler`` configures it: blocks of ``block_size``, else the shards of
    ``shard_sizes``, else :data:`DEFAULT_BLOCK_SIZE`."""
    if not shuffle or size == 0:
        return SequentialOrder()
    if not blocks:
        return GlobalOrder(size, seed, epoch)
    if shard_sizes is None:  # runs of block_size: the same order as BlockOrder, in O(1)
        block = block_size or DEFAULT_BLOCK_SIZE
        return UniformBlockOrder(size, block, seed, epoch, window_blocks)
    return BlockOrder(shard_sizes, seed, epoch, window_blocks)


def check_shard_sizes(shard_sizes: Any, size: int) -> Positions | None:
    """A data source's ``shard_sizes`` as an array, checked against its length."""
    if shard_sizes is None:
        return None
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    if sizes.ndim != 1 or int(sizes.sum()) != size or (sizes < 0).any():
        raise ValueError(
            f"data source's shard_sizes must be non-negative and sum to its length "
            f"{size}; got {sizes.size} shards summing to {int(sizes.sum())}"
        )
    return sizes
