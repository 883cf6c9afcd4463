"""A mixture's parts and weights: exact per-epoch counts, weight schedules, their state.

:class:`MixturePlan` knows each part's size, the draws per epoch (``epoch_length``) and
the weights of every epoch: constant, changed from some epoch on by ``set_weights``,
or a callable of the epoch. From those it gives each epoch's exact counts
(:func:`part_counts`) and how many draws each part had before an epoch (where its
passes continue), and the :class:`~indextar.order.mixture.MixtureOrder` of an epoch.
It reads a dataset's parts by duck typing (``datasets`` and ``cumulative_sizes``, as
``MixtureDataset`` and torch's ``ConcatDataset`` have them), so this room imports none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .mixture import MixtureOrder

__all__ = ["MixturePlan", "part_counts", "WeightsArg"]

WeightsArg = Mapping[str, float] | Sequence[float] | Callable[[int], Any]
"""``weights=``: by part name, by part number, or a callable of the epoch giving either."""


def part_counts(
    weights: Sequence[float],
    epoch_length: int,
    units: Sequence[tuple[int, int]] | None = None,
) -> npt.NDArray[np.int64]:
    """Each part's draws in an epoch: ``w_s / sum(w) * epoch_length``, by largest remainders.

    Exact rational arithmetic, so the counts are the same on every machine; they sum to
    ``epoch_length``. Ties between equal remainders go to the lower part number.

    With ``units``, one ``(tokens, items)`` per part, the weights are shares of tokens:
    part ``s``'s draws are in proportion to ``w_s * items_s / tokens_s``, so that its
    draws (packs of ``tokens_s / items_s`` tokens on average) hold ``w_s / sum(w)`` of
    the epoch's tokens.
    """
    # Imported here: fractions (and decimal) would add ~1.6 ms to `import indextar`.
    from fractions import Fraction

    exact = [Fraction(w) for w in weights]
    if units is not None:
        exact = [w * items / tokens if tokens else Fraction(0) for w, (tokens, items) in zip(exact, units)]
    total = sum(exact, Fraction(0))
    quotas = [w * epoch_length / total for w in exact]
    counts = [math.floor(q) for q in quotas]
    short = epoch_length - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in by_remainder[:short]:
        counts[s] += 1
    return np.array(counts, dtype=np.int64)


@dataclass(slots=True)
class MixturePlan:
    """Parts, epoch length and the weights of every epoch of a mixture sampler.

    ``changes`` holds ``(first epoch, weights)`` in epoch order, the first at epoch 0;
    ``schedule``, if set, is a callable of the epoch instead.
    """

    part_sizes: tuple[int, ...]
    names: tuple[str, ...] | None
    epoch_length: int
    part_shard_sizes: tuple[npt.NDArray[np.int64] | None, ...]
    part_units: tuple[tuple[int, int], ...] | None = None
    """Each part's ``(tokens, items)`` when every part is packed: weights mean tokens."""
    changes: list[tuple[int, tuple[float, ...]]] = field(default_factory=list)
    schedule: Callable[[int], Any] | None = None
    # Counts of the epochs a schedule has been asked for, and their running sums.
    _counts: dict[int, npt.NDArray[np.int64]] = field(default_factory=dict)
    _drawn: list[npt.NDArray[np.int64]] = field(default_factory=list)

    @classmethod
    def make(
        cls, data_source: Any, weights: WeightsArg | None, epoch_length: int | None
    ) -> MixturePlan:
        """The plan for ``ResumableSampler(data_source, weights=..., epoch_length=...)``."""
        sizes, names, shard_sizes = _parts(data_source)
        length = sum(sizes) if epoch_length is None else epoch_length
        if isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 1:
            raise ValueError(f"epoch_length must be an int >= 1; got {epoch_length!r}")
        plan = cls(sizes, names, int(length), shard_sizes, _token_units(data_source))
        if callable(weights):
            plan.schedule = weights
            plan.weights_at(0)  # check it now, not in a DataLoader's first next()
        else:
            plan.changes = [(0, plan.normalise(sizes if weights is None else weights))]
        return plan

    # -- weights ----------------------------------------------------------------

    def normalise(self, weights: Any) -> tuple[float, ...]:
        """``weights`` as one float per part, checked."""
        count = len(self.part_sizes)
        if isinstance(weights, Mapping):
            if self.names is None:
                raise ValueError(
                    "weights by name need a MixtureDataset of named parts; give a list, "
                    f"one weight per part ({count} parts)"
                )
            unknown = sorted(set(weights) - set(self.names), key=str)
            missing = [name for name in self.names if name not in weights]
            if unknown or missing:
                raise ValueError(
                    f"weights must name every part {list(self.names)}; "
                    f"unknown {unknown}, missing {missing}"
                )
            values = [weights[name] for name in self.names]
        elif isinstance(weights, Sequence | np.ndarray) and not isinstance(weights, str):
            values = list(weights)
            if len(values) != count:
                raise ValueError(
                    f"weights has {len(values)} entries; the dataset has {count} parts"
                )
        else:
            raise TypeError(
                f"weights must be a mapping or a sequence; got {type(weights).__name__}"
            )
        floats = tuple(float(v) for v in values)
        if not all(math.isfinite(w) and w >= 0 for w in floats) or sum(floats) <= 0:
            raise ValueError(f"weights must be finite, >= 0 and not all 0; got {list(floats)}")
        empty = [self._name(s) for s, w in enumerate(floats) if w > 0 and self.part_sizes[s] == 0]
        if empty:
            raise ValueError(f"parts {empty} are empty but have weights > 0")
        return floats

    def weights_at(self, epoch: int) -> tuple[float, ...]:
        """The weights of ``epoch``."""
        if self.schedule is not None:
            return self.normalise(self.schedule(epoch))
        return next(w for first, w in reversed(self.changes) if first <= epoch)

    def set_weights(self, weights: Any, epoch: int) -> None:
        """Use ``weights`` from ``epoch`` on (replacing changes planned after it)."""
        if self.schedule is not None:
            raise ValueError("weights= is a schedule (a callable); set_weights cannot change it")
        floats = self.normalise(weights)
        self.changes = [(first, w) for first, w in self.changes if first < epoch]
        if not self.changes or self.changes[-1][1] != floats:
            self.changes.append((epoch, floats))
        self._counts.clear()
        self._drawn.clear()

    def counts_at(self, epoch: int) -> npt.NDArray[np.int64]:
        """Each part's exact draws in ``epoch``."""
        counts = self._counts.get(epoch)
        if counts is None:
            counts = part_counts(self.weights_at(epoch), self.epoch_length, self.part_units)
            if len(self._counts) > 4096:
                self._counts.clear()
            self._counts[epoch] = counts
        return counts

    def drawn_before(self, epoch: int) -> npt.NDArray[np.int64]:
        """Each part's draws in epochs ``0 .. epoch - 1``: where its passes continue.

        O(weight changes) for constant or ``set_weights`` weights; a schedule is summed
        epoch by epoch once (and remembered).
        """
        if self.schedule is None:
            total = np.zeros(len(self.part_sizes), dtype=np.int64)
            bounds = [first for first, _ in self.changes[1:]] + [math.inf]
            for (first, _), end in zip(self.changes, bounds):
                if first >= epoch:
                    break
                epochs = int(min(end, epoch)) - first
                total += np.int64(epochs) * self.counts_at(first)
            return total
        while len(self._drawn) <= epoch:
            previous = self._drawn[-1] if self._drawn else None
            done = len(self._drawn)
            self._drawn.append(
                np.zeros(len(self.part_sizes), np.int64)
                if previous is None
                else previous + self.counts_at(done - 1)
            )
        return self._drawn[epoch]

    def order(
        self,
        epoch: int,
        *,
        seed: int,
        shuffle: bool,
        order: Literal["global", "blocks"],
        block_size: int | None,
        window_blocks: int,
    ) -> MixtureOrder:
        """The epoch's map from positions to dataset indices."""
        return MixtureOrder(
            part_sizes=self.part_sizes,
            counts=tuple(self.counts_at(epoch).tolist()),
            drawn_before=tuple(self.drawn_before(epoch).tolist()),
            seed=seed,
            epoch=epoch,
            shuffle=shuffle,
            blocks=order == "blocks",
            block_size=block_size,
            window_blocks=window_blocks,
            part_shard_sizes=self.part_shard_sizes,
        )

    # -- state ------------------------------------------------------------------

    def state(self, epoch: int) -> list[dict[str, Any]]:
        """The weight history for a state dict: ``[{"epoch", "weights"}, ...]``, JSON-safe.

        A schedule saves the weights of ``epoch`` alone (the callable is the history)."""
        changes = [(epoch, self.weights_at(epoch))] if self.schedule else self.changes
        return [{"epoch": first, "weights": self._as_saved(w)} for first, w in changes]

    def drift(self, saved: Any) -> str | None:
        """Why a saved weight history cannot be loaded into this plan, or ``None``.

        The saved history replaces this plan's (it records ``set_weights`` calls made
        before the checkpoint), but the weights it starts with must be this plan's: the
        constructor's ``weights=`` (for a schedule, its weights at each saved epoch)."""
        try:
            history = [(int(entry["epoch"]), self.normalise(entry["weights"])) for entry in saved]
        except (TypeError, KeyError, ValueError) as error:
            return f"sampler state has weights={saved!r}, which this sampler cannot read ({error})"
        if self.schedule is not None:
            wanted = [(first, self.weights_at(first)) for first, _ in history]
        else:
            wanted = [self.changes[0]]
            history = history[:1]
        if history != wanted:
            return (
                f"sampler state was saved with weights {self._describe(history)}; "
                f"this sampler has {self._describe(wanted)}"
            )
        return None

    @staticmethod
    def drift_of(plan: MixturePlan | None, state: Mapping[str, Any]) -> str | None:
        """Why ``state``'s weights cannot be loaded into a sampler with ``plan``, or ``None``."""
        if "weights" not in state:
            return None
        if plan is None:
            return "sampler state was saved with weights; this sampler has none"
        return plan.drift(state["weights"])

    def adopt(self, saved: Any) -> None:
        """Take a saved weight history (checked by :meth:`drift`) as this plan's."""
        if self.schedule is None:
            self.changes = [(int(e["epoch"]), self.normalise(e["weights"])) for e in saved]
            self._counts.clear()
            self._drawn.clear()

    def _as_saved(self, weights: tuple[float, ...]) -> Any:
        return dict(zip(self.names, weights)) if self.names is not None else list(weights)

    def _describe(self, history: list[tuple[int, tuple[float, ...]]]) -> str:
        return ", ".join(f"{self._as_saved(w)} from epoch {first}" for first, w in history)

    def _name(self, part: int) -> str | int:
        return self.names[part] if self.names is not None else part


def _parts(
    data_source: Any,
) -> tuple[tuple[int, ...], tuple[str, ...] | None, tuple[npt.NDArray[np.int64] | None, ...]]:
    """Part sizes, names and shard sizes of a mixture, a ConcatDataset, a dataset or a length."""
    if isinstance(data_source, int | np.integer):
        return (int(data_source),), None, (None,)
    cumulative = getattr(data_source, "cumulative_sizes", None)
    datasets = getattr(data_source, "datasets", None)
    if cumulative is None or datasets is None:
        return (len(data_source),), None, (_shard_sizes(data_source),)
    ends = [int(c) for c in cumulative]
    sizes = tuple(end - start for start, end in zip([0, *ends[:-1]], ends))
    names = getattr(data_source, "names", None)  # strings, or part numbers: no names
    named = names is not None and all(isinstance(n, str) for n in names)
    return sizes, tuple(names) if named and names else None, tuple(map(_shard_sizes, datasets))


def _shard_sizes(dataset: Any) -> npt.NDArray[np.int64] | None:
    sizes = getattr(dataset, "shard_sizes", None)
    return None if sizes is None else np.asarray(sizes, dtype=np.int64)


def _token_units(data_source: Any) -> tuple[tuple[int, int], ...] | None:
    """Each part's ``(tokens, items)`` if every part of a mixture counts its tokens
    (``token_count``, as :class:`~indextar.PackedDataset` does), else ``None``."""
    datasets = getattr(data_source, "datasets", None)
    if datasets is None or getattr(data_source, "cumulative_sizes", None) is None:
        return None
    counts = [getattr(dataset, "token_count", None) for dataset in datasets]
    if not counts or any(count is None for count in counts):
        return None
    return tuple((int(count), len(dataset)) for count, dataset in zip(counts, datasets))
