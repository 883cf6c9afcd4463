"""The order of one epoch of a mixture: positions to parts, to passes, to dataset indices.

An epoch has ``L`` positions (``epoch_length``); part ``s`` gets exactly ``c_s`` of them
(:func:`~indextar.order.weights.part_counts`). :class:`MixtureOrder` maps a position to
a dataset index in O(1) memory, a numpy chunk at a time, in three steps:

1. **Windows.** The epoch is cut into windows of about :data:`WINDOW` positions. Part
   ``s`` has ``F_s(k) = floor((c_s * min(k * WINDOW, L) + u_s) / L)`` of its draws
   before window ``k``, with ``u_s`` in ``[0, L)`` keyed by ``(seed, epoch, s)``: so
   ``F_s(0) = 0``, ``F_s(K) = c_s``, and every window holds each part's share to within
   one draw. Window ``k`` starts at position ``T_k = sum_s F_s(k)`` (within ``S`` of
   ``k * WINDOW``, for ``S`` parts).
2. **Interleaving.** Within window ``k`` the positions are shuffled by a keyed
   permutation (:class:`~indextar.order.permutation.KeyedPermutation`, keyed by
   ``(seed, epoch, k)``) onto the window's slots, which are laid out part by part:
   part ``s`` owns ``F_s(k+1) - F_s(k)`` consecutive slots. A position's slot names its
   part and its draw ``d`` (``F_s(k)`` plus its rank among the part's slots). Over the
   epoch this is one permutation of the positions, evaluated from the position alone.
3. **Passes.** Draw ``d`` of part ``s`` is number ``g = D_s + d`` of the part's endless
   stream of draws, ``D_s`` being its draws in earlier epochs. The stream walks the
   part's own permutations, pass ``g // n_s`` at offset ``g % n_s`` (``n_s`` the part's
   size), each pass a keyed permutation of the part keyed by ``(seed, s, pass)``, or
   with ``order="blocks"`` the part's own block order. So a part repeats no sample
   before its pass is complete, and a downsampled part continues across epochs.

Within a window a part's draws come in shuffled order; where a window holds the end of
one pass and the start of the next, that part's draws in it are ranked by position
instead (the permutation's inverse, over that part's slots alone), so passes stay in
order in time. Everything is integer arithmetic on keyed hashes: the same seed gives
the same order everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .epoch import plain_order
from .extensions import permute
from .permutation import KeyedPermutation, derive_round_keys, permute_grouped
from .windows import Array, Draws, PairTable, WindowTable, floor_product, runs

__all__ = ["WINDOW", "MixtureOrder"]

WINDOW = 15 << 12
"""Positions per window (61,440): each window holds every part's share to within one
draw. Just below ``2**16``, so that its keyed permutation needs little cycle walking."""

# Purpose tags, distinct from epoch.py's (1, 2, 3), so that no two uses share keys.
_TAG_OFFSETS = 11
_TAG_INTERLEAVE = 12
_TAG_PASS = 13
_TAG_PART = 14


_CROSSING = np.iinfo(np.int64).min
"""``mixture_window``'s mark for a part whose draws in a window cross passes."""
_NO_KEYS = np.empty(0, dtype=np.uint64)


@dataclass(frozen=True, slots=True)
class MixtureOrder:
    """One epoch of a mixture: an :class:`~indextar.order.epoch.EpochOrder`.

    Parameters
    ----------
    part_sizes
        Samples in each part; part ``s`` is dataset indices ``sum(part_sizes[:s]) + i``.
    counts
        Draws of each part in this epoch; their sum is the epoch's length.
    drawn_before
        Draws of each part in earlier epochs.
    seed, epoch, shuffle
        ``shuffle=False`` lays windows out part by part and walks parts in index order.
    blocks, block_size, window_blocks, part_shard_sizes
        ``blocks=True`` walks each part's passes in block order (its shards, if
        ``part_shard_sizes`` has them, else runs of ``block_size``).
    """

    part_sizes: tuple[int, ...]
    counts: tuple[int, ...]
    drawn_before: tuple[int, ...]
    seed: int
    epoch: int
    shuffle: bool = True
    blocks: bool = False
    block_size: int | None = None
    window_blocks: int = 4
    part_shard_sizes: tuple[npt.NDArray[np.int64] | None, ...] = ()
    _length: int = field(init=False, repr=False)
    _windows: int = field(init=False, repr=False)
    _offsets: tuple[int, ...] = field(init=False, repr=False)
    _starts: Array = field(init=False, repr=False)
    _sizes: Array = field(init=False, repr=False)
    _drawn: Array = field(init=False, repr=False)
    _cache: dict[Any, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        length = sum(self.counts)
        if length < 1 or len(self.counts) != len(self.part_sizes):
            raise ValueError(f"need one count per part summing to >= 1; got {self.counts}")
        if any(c and not n for c, n in zip(self.counts, self.part_sizes)):
            raise ValueError(f"empty parts cannot be drawn from: {self.part_sizes}, {self.counts}")
        parts = len(self.counts)
        offsets = [0] * parts
        if self.shuffle:
            offsets = [derive_round_keys(self.seed, _TAG_OFFSETS, self.epoch, s)[0] % length
                       for s in range(parts)]  # fmt: skip
        set_ = object.__setattr__
        set_(self, "_length", length)
        set_(self, "_windows", -(-length // WINDOW))
        set_(self, "_offsets", tuple(offsets))
        set_(self, "_starts", np.cumsum([0, *self.part_sizes[:-1]]).astype(np.int64))
        # An empty part has no draws; size 1 keeps its (unused) pass arithmetic finite.
        set_(self, "_sizes", np.maximum(np.array(self.part_sizes, dtype=np.int64), 1))
        set_(self, "_drawn", np.array(self.drawn_before, dtype=np.int64))
        set_(self, "_cache", {})

    def indices(self, positions: Array) -> Array:
        """The dataset index at each position (all in ``[0, epoch length)``)."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size == 0:
            return positions.copy()
        if int(positions.min()) < 0 or int(positions.max()) >= self._length:
            raise ValueError(f"positions must be in [0, {self._length})")
        # The sampler's positions increase (or wrap once): windows are runs of them.
        unsorted = bool((positions[1:] < positions[:-1]).any())
        order = np.argsort(positions, kind="stable") if unsorted else None
        ordered = positions[order] if order is not None else positions
        table = self._table(ordered)
        bounds = np.searchsorted(ordered, table.starts)
        fused = self._fused()
        if fused is not None:
            result = np.empty_like(ordered)
            for row in range(len(table.windows) - 1):
                begin, end = int(bounds[row]), int(bounds[row + 1])
                if begin < end:
                    self._window(fused, table, row, ordered[begin:end], result[begin:end])
            if order is not None:
                result[order] = result.copy()
            return result
        group = np.empty(ordered.size, dtype=np.int64)
        offset = np.empty_like(ordered)
        pairs = PairTable()
        for row in range(len(table.windows) - 1):
            begin, end = int(bounds[row]), int(bounds[row + 1])
            if begin < end:
                self._interleave(
                    table, row, ordered[begin:end], group[begin:end], offset[begin:end], pairs
                )
        result = self._walk(pairs, group, offset)
        if order is not None:
            result[order] = result.copy()
        return result

    # -- windows ----------------------------------------------------------------

    def _table(self, ordered: Array) -> WindowTable:
        """The windows that ``ordered`` (sorted) positions fall in, each with the next."""
        # T_k is within S of k * WINDOW: look a few windows either side.
        spread = -(-len(self.counts) // WINDOW) + 1
        low, high = int(ordered[0]) // WINDOW, int(ordered[-1]) // WINDOW
        if high - low <= ordered.size:  # dense (the sampler's chunks): every window between
            first, last = max(low - spread, 0), min(high + spread + 1, self._windows)
            wanted = np.arange(first, last + 1, dtype=np.int64)
            return WindowTable(wanted, self._before(wanted))
        nominal = ordered // WINDOW
        firsts = nominal[np.concatenate(([0], np.flatnonzero(np.diff(nominal)) + 1))]
        # (A set, not np.unique: that imports numpy.ma on first use, 15 ms of start-up.)
        near = (firsts[:, None] + np.arange(-spread, spread + 2)).reshape(-1).tolist()
        wanted = np.array(sorted({k for k in near if 0 <= k <= self._windows}), dtype=np.int64)
        return WindowTable(wanted, self._before(wanted))

    def _before(self, windows: Array) -> npt.NDArray[Any]:
        """``F_s(k)`` for each window ``k`` (rows) and part ``s`` (columns)."""
        length = self._length
        counts = np.array(self.counts, dtype=object if length > 1 << 40 else np.int64)
        offsets = np.array(self._offsets, dtype=counts.dtype)
        bounds = np.minimum(windows * WINDOW, length).astype(counts.dtype)
        if counts.dtype == np.int64:  # c_s * t overflows int64; floor_product splits t
            return floor_product(counts, bounds, offsets, length)
        return np.array((counts[None, :] * bounds[:, None] + offsets[None, :]) // length)

    def _fused(self) -> Any:
        """``_permute.c``'s ``mixture_window``, for a shuffled order not in blocks, if built."""
        if not self.shuffle or self.blocks:
            return None
        return getattr(permute(), "mixture_window", None)

    def _window(
        self, fused: Any, table: WindowTable, row: int, positions: Array, out: Array
    ) -> None:
        """What :meth:`_interleave` and :meth:`_walk` give ``positions`` (in window ``row``),
        in one C call: the dataset indices, into ``out``. A part whose draws in the
        window cross passes is done here, as in :meth:`_interleave`."""
        draws = self._draws(table, row)
        width, start = draws.width, int(table.starts[row])
        shift = np.where(draws.crossing, _CROSSING, draws.shift)
        window_keys = _NO_KEYS
        if width > 1:
            window_keys = np.array(
                derive_round_keys(self.seed, _TAG_INTERLEAVE, self.epoch, draws.window),
                dtype=np.uint64,
            )
        owners = np.empty_like(positions)
        out[:] = positions
        fused(out, owners, start, width, window_keys, draws.composition, shift, self._sizes,
              self._current_keys(draws.passes), self._starts)  # fmt: skip
        shuffle = None
        if width > 1 and draws.crossing.any():
            shuffle = KeyedPermutation(width, tuple(int(k) for k in window_keys))
        for s in np.flatnonzero(draws.crossing).tolist():
            mine = np.flatnonzero(owners == s)
            if not mine.size:
                continue
            slots = positions[mine] - start
            if shuffle is not None:
                slots = shuffle.permute(slots)
            here, offsets = self._crossing_draws(draws, s, shuffle, slots)
            low = int(here.min())
            keys = np.array(
                [self._pass_keys(s, p) for p in range(low, int(here.max()) + 1)], dtype=np.uint64
            )
            sizes = np.full(len(keys), self.part_sizes[s], dtype=np.int64)
            local = permute_grouped(offsets, here - low, sizes, keys)
            out[mine] = int(self._starts[s]) + local

    def _current_keys(self, passes: Array) -> npt.NDArray[np.uint64]:
        """The round keys of each part's pass ``passes[s]``, parts by rows."""
        key = ("pass keys", passes.tobytes())
        keys = self._cache.get(key)
        if keys is None:
            keys = np.array(
                [self._pass_keys(s, p) for s, p in enumerate(passes.tolist())], dtype=np.uint64
            )
            self._remember(key, keys)
        return keys

    def _interleave(
        self, table: WindowTable, row: int, positions: Array, group: Array, offset: Array,
        pairs: PairTable,
    ) -> None:  # fmt: skip
        """Group (part and pass) and offset in that pass of ``positions``, all in window
        ``row`` (a position past the window's last belongs to the next window)."""
        draws = self._draws(table, row)
        slots = positions - int(table.starts[row])
        shuffle = None
        if self.shuffle and draws.width > 1:
            shuffle = KeyedPermutation.from_seed(
                draws.width, self.seed, _TAG_INTERLEAVE, self.epoch, draws.window
            )
            slots = shuffle.permute(slots)
        counts = draws.counts
        owner = np.repeat(np.arange(counts.size, dtype=np.int32), counts)[slots]
        group[:] = pairs.ids(draws.passes)[owner]
        offset[:] = slots + draws.shift[owner]
        for s in np.flatnonzero(draws.crossing).tolist():
            mine = np.flatnonzero(owner == s)
            if mine.size:
                here, offset[mine] = self._crossing_draws(draws, s, shuffle, slots[mine])
                group[mine] = pairs.ids_of(s, here)

    def _draws(self, table: WindowTable, row: int) -> Draws:
        """Each part's draws in window ``row``."""
        first = table.before[row].astype(np.int64)
        counts = table.before[row + 1].astype(np.int64) - first
        composition = np.concatenate(([0], np.cumsum(counts)))
        stream = self._drawn + first  # each part's stream position at the window's first slot
        passes = stream // self._sizes
        return Draws(
            window=int(table.windows[row]),
            counts=counts,
            width=int(composition[-1]),
            composition=composition,
            stream=stream,
            passes=passes,
            shift=stream - passes * self._sizes - composition[:-1],
            crossing=(counts > 0) & ((stream + counts - 1) // self._sizes != passes),
        )

    def _crossing_draws(
        self, draws: Draws, part: int, shuffle: KeyedPermutation | None, slots: Array
    ) -> tuple[Array, Array]:
        """For ``part``'s ``slots`` (permuted), where its draws in the window cross
        passes: each draw's pass, and its offset in that pass."""
        composition = draws.composition
        rank = self._time_ranks(draws.window, part, shuffle, composition)[slots - composition[part]]
        drawn = int(draws.stream[part]) + rank
        size = self.part_sizes[part]
        here = drawn // size
        return here, drawn - here * size

    def _time_ranks(
        self, window: int, part: int, shuffle: KeyedPermutation | None, composition: Array
    ) -> Array:
        """For each of ``part``'s slots in ``window``, its rank among them by position."""
        key = ("ranks", window, part)
        ranks = self._cache.get(key)
        if ranks is None:
            slots = np.arange(composition[part], composition[part + 1], dtype=np.int64)
            where = slots if shuffle is None else shuffle.unpermute(slots)
            ranks = np.empty_like(slots)
            ranks[np.argsort(where, kind="stable")] = np.arange(slots.size)
            self._remember(key, ranks)
        return ranks

    # -- passes -----------------------------------------------------------------

    def _walk(self, pairs: PairTable, group: Array, offset: Array) -> Array:
        """Dataset index of each offset in its group's pass: that pass's permutation."""
        parts = np.array([s for s, _ in pairs.pairs], dtype=np.int64)
        starts = self._starts[parts]
        if not self.shuffle:
            return starts[group] + offset
        if not self.blocks:
            keys = np.array([self._pass_keys(s, p) for s, p in pairs.pairs], dtype=np.uint64)
            local = permute_grouped(offset, group, self._sizes[parts], keys)
            return starts[group] + local
        order = np.argsort(group, kind="stable")
        result = np.empty_like(offset)
        grouped = group[order]
        for g, begin, end in runs(grouped):
            s, p = pairs.pairs[g]
            at = order[begin:end]
            result[at] = int(starts[g]) + self._block_order(s, p).indices(offset[at])
        return result

    def _pass_keys(self, part: int, pass_number: int) -> tuple[int, ...]:
        key = ("keys", part, pass_number)
        keys = self._cache.get(key)
        if keys is None:
            keys = derive_round_keys(self.seed, _TAG_PASS, part, pass_number)
            self._remember(key, keys)
        return keys

    def _block_order(self, part: int, pass_number: int) -> Any:
        key = ("blocks", part, pass_number)
        order = self._cache.get(key)
        if order is None:
            seed = derive_round_keys(self.seed, _TAG_PART, part)[0]
            shards = self.part_shard_sizes[part] if self.part_shard_sizes else None
            order = plain_order(
                self.part_sizes[part],
                seed=seed,
                epoch=pass_number,
                shuffle=True,
                blocks=True,
                block_size=self.block_size,
                window_blocks=self.window_blocks,
                shard_sizes=shards if self.block_size is None else None,
            )
            self._remember(key, order)
        return order

    def _remember(self, key: Any, value: Any) -> None:
        if len(self._cache) >= 4096:  # bounded: a long iteration meets new windows and passes
            self._cache.clear()
        self._cache[key] = value
