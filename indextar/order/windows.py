"""The bookkeeping of :class:`~indextar.order.mixture.MixtureOrder`'s windows: each
part's draws in a window, the cumulative draws at some windows, numbers for the
``(part, pass)`` pairs of one call, and two numpy helpers (an overflow-free floor of a
product, runs of equal values)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Array", "Draws", "PairTable", "WindowTable", "floor_product", "runs"]

Array = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Draws:
    """Each part's draws in one window: ``counts`` of them, in the slots
    ``[composition[s], composition[s + 1])`` of the window's ``width``; the part's
    ``stream`` position at the window's first slot, that position's pass (``passes``),
    a slot's offset in that pass less the slot (``shift``), and whether the part's draws
    run into the next pass (``crossing``)."""

    window: int
    counts: Array
    width: int
    composition: Array
    stream: Array
    passes: Array
    shift: Array
    crossing: npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class WindowTable:
    """Some windows (``windows``, sorted, each with its successor) and ``F_s`` at each."""

    windows: Array
    before: npt.NDArray[Any]  # (windows, parts)
    starts: Array = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "starts", self.before.sum(axis=1).astype(np.int64))


class PairTable:
    """Numbers for the ``(part, pass)`` pairs of one call, in order of first use."""

    def __init__(self) -> None:
        self.pairs: list[tuple[int, int]] = []
        self._ids: dict[tuple[int, int], int] = {}
        self._last: tuple[Array, Array] | None = None

    def ids_of(self, part: int, passes: Array) -> Array:
        """The numbers of ``(part, p)`` for each ``p`` of ``passes``."""
        low = int(passes.min())  # a part's passes in one window: a few consecutive ones
        numbers = [self._id(part, p) for p in range(low, int(passes.max()) + 1)]
        return np.array(numbers, dtype=np.int64)[passes - low]

    def ids(self, passes: Array) -> Array:
        """The numbers of ``(s, passes[s])`` for every part ``s``."""
        if self._last is not None and np.array_equal(self._last[0], passes):
            return self._last[1]  # neighbouring windows: the same passes, nearly always
        ids = np.array([self._id(s, p) for s, p in enumerate(passes.tolist())], dtype=np.int64)
        self._last = (passes, ids)
        return ids

    def _id(self, part: int, pass_number: int) -> int:
        key = (part, pass_number)
        number = self._ids.get(key)
        if number is None:
            number = self._ids[key] = len(self.pairs)
            self.pairs.append(key)
        return number


def floor_product(counts: Array, bounds: Array, offsets: Array, length: int) -> Array:
    """``(counts[s] * bounds[k] + offsets[s]) // length`` in int64 without overflow.

    ``bounds[k] = q * 2**20 + r``: ``c * bounds = c * q * 2**20 + c * r``; each product
    below ``2**60`` for ``length < 2**40``, and the floor division taken in two steps.
    """
    high, low = bounds >> 20, bounds & ((1 << 20) - 1)
    product = counts[None, :] * high[:, None]  # < 2**40 * 2**20
    whole, part = product // length, product % length  # c * high = whole * L + part
    rest = (part << 20) + counts[None, :] * low[:, None] + offsets[None, :]  # < 2**62
    return (whole << 20) + rest // length


def runs(values: Array) -> Iterator[tuple[int, int, int]]:
    """``(value, begin, end)`` of each run of equal consecutive values."""
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(values)) + 1, [values.size]))
    for begin, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        yield int(values[begin]), begin, end
