"""JoinedDataset: two datasets' samples merged by key, a map-style view.

Sample ``i`` of the view is the left dataset's sample ``plan.left[i]`` (or ``i``, for
a left join) with the members of the right dataset's sample ``plan.right[i]`` added,
renamed by ``prefix=``/``rename=``; a left join's sample without a right one has only
its left members. The plan (:mod:`indextar.read.keyjoin`) holds two int64 arrays,
computed once from the indexes and cached. A batch reads each side with one grouped
read (``read_unbuilt``: shard by shard, or every remote span in flight at once), then
builds each merged sample with the view's ``decode=``/``keys=``/``transform=``; the
sides' own are not used.

``where``, ``select`` and ``exclude`` give a :class:`~indextar.KeySubset` of this
view; a ``where`` runs on the side whose indexes know the names in it (the left
first), or on the side given by ``side=``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..errors import JoinError, SampleIndexError, SelectionError, StaleIndexError
from ..index.shard import PathLike
from ..order.readahead import Hint
from .keyjoin import JoinHow, JoinPlan
from .protocols import UnbuiltReader
from .sample import SampleBuilder
from .selection import attribute_values, where_indices
from .subset import KeysArg, KeySubset, find_keys

__all__ = ["JoinedDataset", "Side", "member_names"]

Side = Literal["left", "right"]
Array = npt.NDArray[np.int64]


def member_names(
    left_exts: frozenset[str],
    right_exts: frozenset[str],
    *,
    prefix: str,
    rename: Mapping[str, str] | None,
) -> dict[str, str]:
    """Each right extension's name in the joined sample.

    Raises
    ------
    JoinError
        If a name is a left extension too (all such named).
    """
    rename = dict(rename or {})
    unknown = sorted(set(rename) - right_exts)
    if unknown:
        raise JoinError(
            f"rename= names {unknown}, which no sample of the joined dataset has; "
            f"it has {sorted(right_exts)}"
        )
    names = {ext: rename.get(ext, prefix + ext) for ext in right_exts}
    clash = sorted(ext for ext, name in names.items() if name in left_exts)
    if clash:
        shown = ", ".join(f"{ext!r}" if names[ext] == ext else f"{ext!r} (as {names[ext]!r})"
                          for ext in clash)  # fmt: skip
        raise JoinError(
            f"the member extension {shown} is on both sides of the join; give join() a "
            f"prefix= (prefix='right.' makes {clash[0]!r} {'right.' + clash[0]!r}) or "
            f"rename={{{clash[0]!r}: ...}}"
        )
    return names


class JoinedDataset:
    """A map-style view of two datasets joined by ``__key__`` (made by
    :meth:`IndexedTarDataset.join <indextar.IndexedTarDataset.join>`).

    ``len``, ``view[i]``, ``__getitems__``, ``shard_sizes`` (the left shards') and
    ``selection``, so that ``ResumableSampler``, ``MixtureDataset``, ``PackedDataset``
    and DataLoader workers take it as they take a dataset. A sample's ``__index__``
    is its index in this view; ``__shard__`` is the left sample's shard.
    """

    def __init__(
        self,
        left: UnbuiltReader,
        right: UnbuiltReader,
        plan: JoinPlan,
        *,
        how: JoinHow,
        names: Mapping[str, str],
        builder: SampleBuilder,
    ) -> None:
        self.left = left
        """The dataset whose samples the view keeps (all of them, in a left join)."""
        self.right = right
        """The dataset whose members are added by key."""
        self.how = how
        self.plan = plan
        self._names = dict(names)
        self._renamed = any(ext != name for ext, name in self._names.items())
        self._builder = builder
        self._len = len(plan)
        self._digest: str | None = None

    def __len__(self) -> int:
        return self._len

    # -- reading ----------------------------------------------------------------

    def _positions(self, indices: Sequence[int]) -> Array:
        positions = np.fromiter(map(operator.index, indices), np.int64, len(indices))
        if positions.size and (positions.min() < 0 or positions.max() >= self._len):
            positions = np.where(positions < 0, positions + self._len, positions)
            bad = np.flatnonzero((positions < 0) | (positions >= self._len))
            if bad.size:
                raise SampleIndexError(
                    f"index {indices[int(bad[0])]} is out of range for a joined view of "
                    f"{self._len} samples"
                )
        return positions

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])[0]

    def sides(self, indices: npt.ArrayLike) -> tuple[Array, Array]:
        """The left dataset's index and the right one's (``-1``: none) of each of this
        view's ``indices``; nothing is read."""
        positions = self._positions(np.asarray(indices, dtype=np.int64).reshape(-1).tolist())
        lefts = positions if self.plan.left is None else np.asarray(self.plan.left[positions])
        return lefts, np.asarray(self.plan.right[positions])

    def member_name(self, ext: str) -> str:
        """The name in a joined sample of the right side's extension ``ext``."""
        return self._names.get(ext, ext)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch: each side's samples read with one grouped read, then merged and built."""
        positions = self._positions(indices)
        lefts = positions if self.plan.left is None else np.asarray(self.plan.left[positions])
        rights = np.asarray(self.plan.right[positions])
        have = rights >= 0
        left_read = self.left.read_unbuilt(lefts)
        right_read = iter(self.right.read_unbuilt(rights[have] if not have.all() else rights))
        build, names = self._builder.build, self._names if self._renamed else None
        out: list[Any] = [None] * len(left_read)
        for at, ((fields, members), position, joined) in enumerate(
            zip(left_read, positions.tolist(), have.tolist())
        ):
            fields["__index__"] = position
            if joined:  # the right side's members, checked to be the same key's
                right_fields, right_members = next(right_read)
                if right_fields["__key__"] != fields["__key__"]:
                    raise self._stale(fields["__key__"], right_fields)
                if names is None:
                    members = members + right_members
                else:
                    members = members + [(names.get(ext, ext), data) for ext, data in right_members]
            out[at] = build(fields, members)
        hint = getattr(indices, "hint", None)
        if isinstance(hint, Hint):
            self.read_ahead(hint)
        return out

    def read_ahead(self, hint: Hint) -> None:
        """Hand each side that reads ahead (``read_ahead``) the samples of ``hint``'s
        batches as its own indices: the left side all of them, the right side those
        with a right sample; a :class:`~indextar.ReadAheadBatches` batch does it in
        ``__getitems__``, after its own reads."""
        ahead, sizes = hint.ahead, np.array(hint.sizes, dtype=np.int64)
        in_range = (ahead >= 0) & (ahead < self._len)
        if ahead.size != sizes.sum() or not in_range.all():
            return  # an index out of range: its batch raises when it comes
        lefts = ahead if self.plan.left is None else np.asarray(self.plan.left[ahead])
        rights = np.asarray(self.plan.right[ahead])
        have = rights >= 0
        counts = np.bincount(np.repeat(np.arange(sizes.size), sizes)[have], minlength=sizes.size)
        for side, indices, per_batch in (
            (self.left, lefts, hint.sizes),
            (self.right, rights[have], tuple(counts.tolist())),
        ):
            read_ahead = getattr(side, "read_ahead", None)
            if read_ahead is not None:
                read_ahead(dataclasses.replace(hint, ahead=indices, sizes=per_batch))

    @staticmethod
    def _stale(key: str, right: dict[str, Any]) -> StaleIndexError:
        """The right side was rewritten since the join: its sample has another key."""
        return StaleIndexError(
            f"the joined sample {key!r} found {right['__key__']!r} in "
            f"{right['__shard__']!r}: that shard set changed since the join was made; "
            "join the datasets again"
        )

    # -- finding samples ---------------------------------------------------------

    def from_left(self, found: Array) -> Array:
        """This view's indices of the samples whose left index is one of the sorted
        ``found`` (those an inner join kept), in order."""
        if self.plan.left is None:
            return found
        left = np.asarray(self.plan.left)
        slot = np.minimum(np.searchsorted(left, found), max(left.size - 1, 0))
        return np.unique(slot[left[slot] == found]) if left.size else np.empty(0, np.int64)

    def _from_right(self, found: Array) -> Array:
        """This view's indices whose right sample is one of the sorted ``found``."""
        return np.flatnonzero(np.isin(np.asarray(self.plan.right), found)).astype(np.int64)

    def key_indices(self, keys: KeysArg, *, strict: bool) -> Array:
        """Sorted indices of this view's samples whose key is one of ``keys``."""
        return self.from_left(find_keys(self.left, keys, strict=strict))

    def where_indices(
        self, expression: str, *, cache_dir: PathLike | None | bool = None, side: Side | None = None
    ) -> Array:
        """Sorted indices of this view's samples that satisfy ``expression`` on ``side``'s
        indexes; with ``side=None``, the left's, or the right's if the left's do not
        know a name in it."""
        run: dict[Side, Callable[[], Array]] = {
            "left": lambda: self.from_left(
                where_indices(self.left, expression, cache_dir=cache_dir)
            ),
            "right": lambda: self._from_right(
                where_indices(self.right, expression, cache_dir=cache_dir)
            ),
        }
        found: Array = self._either(run, side, expression)
        return found

    def attribute_values(
        self, expression: str, *, side: Side | None = None
    ) -> npt.NDArray[np.float64]:
        """The value of ``expression`` for each of this view's samples (NaN where NULL,
        or where a left join has no right sample), from ``side``'s indexes, as
        :meth:`where_indices` chooses it."""

        def left() -> npt.NDArray[np.float64]:
            values = attribute_values(self.left, expression)
            return values if self.plan.left is None else values[np.asarray(self.plan.left)]

        def right() -> npt.NDArray[np.float64]:
            values = attribute_values(self.right, expression)
            rights = np.asarray(self.plan.right)
            return np.where(rights >= 0, values[np.maximum(rights, 0)], np.nan)

        values: npt.NDArray[np.float64] = self._either(
            {"left": left, "right": right}, side, expression
        )
        return values

    def _either(self, run: Mapping[Side, Callable[[], Any]], side: Side | None, what: str) -> Any:
        if side is not None:
            if side not in run:
                raise JoinError(f"side= must be 'left' or 'right'; got {side!r}")
            return run[side]()
        try:
            return run["left"]()
        except SelectionError as left_error:
            try:
                return run["right"]()
            except SelectionError as right_error:
                raise SelectionError(
                    f"{what!r} fails on both sides of the join: left: {left_error}; "
                    f"right: {right_error}"
                ) from right_error

    def where(
        self,
        expression: str,
        *,
        cache_dir: PathLike | None | bool = None,
        side: Side | None = None,
    ) -> KeySubset:
        """A view of the samples that satisfy the SQL ``expression`` over either side's
        attributes (see :meth:`where_indices`); as ``IndexedTarDataset.where`` otherwise."""
        found = self.where_indices(expression, cache_dir=cache_dir, side=side)
        return KeySubset(self, found, kept=True, where=(expression,))

    def select(self, keys: KeysArg, *, strict: bool = False) -> KeySubset:
        """A view of the samples whose ``__key__`` is one of ``keys``."""
        return KeySubset.of(self).select(keys, strict=strict)

    def exclude(self, keys: KeysArg, *, strict: bool = False) -> KeySubset:
        """A view without the samples whose ``__key__`` is one of ``keys``."""
        return KeySubset.of(self).exclude(keys, strict=strict)

    # -- what samplers read ------------------------------------------------------

    @property
    def shard_sizes(self) -> Array:
        """Samples of this view in each left shard (``order="blocks"`` reads it)."""
        sizes = np.asarray(self.left.shard_sizes, dtype=np.int64)
        if self.plan.left is None:
            return sizes
        shards = np.searchsorted(self.left.shard_starts, self.plan.left, side="right") - 1
        return np.bincount(shards, minlength=sizes.size).astype(np.int64)

    @property
    def selection(self) -> dict[str, Any]:
        """What a sampler records and checks on resume: how the sides were joined, the
        number of samples and a digest of exactly which pairs of samples are joined."""
        if self._digest is None:
            digest = hashlib.blake2b(f"{self.how}:{len(self.left)}:".encode(), digest_size=16)
            if self.plan.left is not None:
                digest.update(np.ascontiguousarray(self.plan.left, dtype="<i8").tobytes())
            digest.update(np.ascontiguousarray(self.plan.right, dtype="<i8").tobytes())
            self._digest = digest.hexdigest()
        return {"join": self.how, "samples": self._len, "digest": self._digest}

    def close(self) -> None:
        """Close both sides' open shards."""
        for side in (self.left, self.right):
            close = getattr(side, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        return f"JoinedDataset({self.left!r} {self.how} join {self.right!r}, {self._len} samples)"
