"""Subsets: ``ds.select(keys)``, ``ds.exclude(keys)`` and ``ds.where(sql)``, map-style views.

A view holds one sorted int64 array of the base dataset's indices: those kept, or
those dropped, whichever is shorter, so a 1e9-sample dataset that excludes 1e6 keys
holds 1e6 numbers, never 1e9 of anything. View index ``i`` is ``kept[i]``, or the
``i``-th index not dropped (``i`` plus the number of dropped indices at or below it,
by one ``searchsorted``). Keys are found shard by shard, each shard's keys matched
against the wanted keys in numpy; a key that matches no sample is logged (a count and
the first few), or with ``strict=True`` raised. A key matches every sample that has it.
A ``where`` view is the same view of the indices :mod:`indextar.read.selection` finds;
it carries its ``selection`` (expressions and a digest), which the samplers record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from ..errors import JoinError, SampleIndexError, SampleKeyError
from ..index.shard import PathLike
from ..order.readahead import Hint, HintedBatch
from .protocols import IndexedShards, KeyedView

__all__ = ["KeySubset", "KeyViews", "KeysArg", "read_keys", "report_unmatched"]

logger = logging.getLogger(__name__)

KeysArg = Union[Iterable[str], str, "os.PathLike[str]"]
"""Keys: an iterable of ``str``, or the path of a text file with one key per line."""

_SHOWN = 5  # unmatched keys named in the message
Array = npt.NDArray[np.int64]


def read_keys(keys: KeysArg) -> list[bytes]:
    """The keys' raw bytes (as the index stores them); a ``str`` or path is a key file:
    one key per line, blank lines skipped."""
    if isinstance(keys, str | os.PathLike):
        with open(keys, "rb") as file:
            return [line for line in file.read().splitlines() if line]
    out = []
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"keys must be strings or a key file's path; got {key!r}")
        out.append(key.encode("utf-8", "surrogateescape"))
    return out


def report_unmatched(unmatched: Sequence[bytes], wanted: int, *, strict: bool, what: str) -> None:
    """Log (or with ``strict`` raise :class:`SampleKeyError`) keys that matched no sample."""
    if not unmatched:
        return
    shown = ", ".join(repr(k.decode("utf-8", "surrogateescape")) for k in unmatched[:_SHOWN])
    more = ", ..." if len(unmatched) > _SHOWN else ""
    message = f"{len(unmatched)} of {wanted} keys match no sample of {what}: {shown}{more}"
    if strict:
        raise SampleKeyError(message)
    logger.warning(message)


@dataclass(frozen=True, slots=True)
class _Wanted:
    """Distinct wanted keys, sorted, as one fixed-width bytes array; and which were found."""

    keys: npt.NDArray[np.bytes_]
    first_seen: Array  # where each came first in the caller's list, to report in order
    found: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, raw: list[bytes]) -> _Wanted:
        array = np.array(raw, dtype=np.bytes_) if raw else np.array([], dtype="S1")
        keys, first = np.unique(array, return_index=True)
        return cls(keys, first.astype(np.int64), np.zeros(keys.size, dtype=bool))

    def match(self, key_blob: bytes, key_start: Array, key_end: Array) -> Array:
        """The samples of one shard whose key is wanted (marking those keys found)."""
        if not self.keys.size or not key_start.size:
            return np.empty(0, dtype=np.int64)
        width = self.keys.dtype.itemsize
        lengths = key_end - key_start
        fits = lengths <= width  # a longer key cannot be wanted
        column = np.arange(width, dtype=np.int64)
        at = key_start[:, None] + column
        blob = np.frombuffer(key_blob, dtype=np.uint8)
        chars = np.where(column < lengths[:, None], blob[np.minimum(at, max(blob.size - 1, 0))], 0)
        keys = np.ascontiguousarray(chars.astype(np.uint8)).view(f"S{width}").reshape(-1)
        slot = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        hit = fits & (self.keys[slot] == keys)
        self.found[slot[hit]] = True
        return np.flatnonzero(hit).astype(np.int64)

    def unmatched(self) -> list[bytes]:
        missing = np.flatnonzero(~self.found)
        missing = missing[np.argsort(self.first_seen[missing], kind="stable")]
        return [bytes(k) for k in self.keys[missing].tolist()]


def find_keys(dataset: IndexedShards, keys: KeysArg, *, strict: bool) -> Array:
    """Sorted indices of ``dataset`` whose key is one of ``keys``."""
    raw = read_keys(keys)
    wanted = _Wanted.of(raw)
    found: list[Array] = []
    for shard_no, start in enumerate(dataset.shard_starts[:-1].tolist()):
        if dataset.shard_sizes[shard_no] == 0:
            continue
        keys_of = dataset.shard_index(shard_no).load_keys()  # the keys alone
        found.append(start + wanted.match(keys_of.blob, keys_of.starts, keys_of.ends))
    report_unmatched(wanted.unmatched(), wanted.keys.size, strict=strict, what=repr(dataset))
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


class KeySubset:
    """A map-style view of some of a dataset's samples, from ``select`` or ``exclude``.

    ``len``, ``view[i]``, ``__getitems__`` and ``shard_sizes`` as the base dataset has
    them, so ``ResumableSampler``, ``MixtureDataset`` and DataLoader workers take it as
    they take the dataset. Samples keep the base dataset's ``__index__``.
    """

    def __init__(
        self,
        base: IndexedShards | KeyedView,
        indices: Array,
        *,
        kept: bool,
        where: tuple[str, ...] = (),
    ) -> None:
        self.base = base
        """The dataset this is a view of."""
        self._where = where
        size = len(base)
        complement = size - indices.size
        if complement < indices.size:  # hold the shorter of kept and dropped
            indices, kept = _complement(indices, size), not kept
        indices.flags.writeable = False
        self._kept = indices if kept else None
        self._dropped = indices if not kept else None
        # Dropped index j, minus the number dropped before it: view index i maps to
        # i + (how many of these are <= i).
        self._adjusted = None if kept else indices - np.arange(indices.size, dtype=np.int64)
        self._len = indices.size if kept else size - indices.size
        self._digest: str | None = None

    @classmethod
    def of(cls, base: IndexedShards | KeyedView) -> KeySubset:
        """All of ``base``: nothing dropped."""
        return cls(base, np.empty(0, dtype=np.int64), kept=False)

    def select(self, keys: KeysArg, *, strict: bool = False) -> KeySubset:
        """This view's samples whose key is one of ``keys`` (see ``IndexedTarDataset.select``)."""
        return self._keep(self._find_keys(keys, strict), self._where)

    def _find_keys(self, keys: KeysArg, strict: bool) -> Array:
        if isinstance(self.base, KeyedView):  # a joined view finds its own
            return self.base.key_indices(keys, strict=strict)
        return find_keys(self.base, keys, strict=strict)

    def where(self, expression: str, *, cache_dir: PathLike | None | bool = None) -> KeySubset:
        """This view's samples that satisfy the SQL ``expression`` (see
        ``IndexedTarDataset.where``)."""
        from .selection import where_indices

        if isinstance(self.base, KeyedView):
            found = self.base.where_indices(expression, cache_dir=cache_dir)
        else:
            found = where_indices(self.base, expression, cache_dir=cache_dir)
        return self._keep(found, self._where + (expression,))

    def _keep(self, found: Array, where: tuple[str, ...]) -> KeySubset:
        """This view's samples among the sorted base indices ``found``."""
        if self._kept is not None:
            kept = np.intersect1d(self._kept, found, assume_unique=True)
        else:
            assert self._dropped is not None
            kept = np.setdiff1d(found, self._dropped, assume_unique=True)
        return KeySubset(self.base, kept, kept=True, where=where)

    def exclude(self, keys: KeysArg, *, strict: bool = False) -> KeySubset:
        """This view's samples whose key is none of ``keys``."""
        found = self._find_keys(keys, strict)
        if self._kept is not None:
            return KeySubset(
                self.base, np.setdiff1d(self._kept, found), kept=True, where=self._where
            )
        assert self._dropped is not None
        return KeySubset(self.base, np.union1d(self._dropped, found), kept=False, where=self._where)

    def join(self, other: Any, **options: Any) -> KeySubset:
        """This view's samples joined by key with ``other``: the base dataset's
        :meth:`~indextar.IndexedTarDataset.join` with ``options``, kept to this view's
        samples (those an inner join keeps), in order.

        Raises
        ------
        JoinError
            If the base dataset cannot be joined (a joined view: join its datasets one
            after the other, then select); and as ``IndexedTarDataset.join``.
        """
        join = getattr(self.base, "join", None)
        if join is None:
            raise JoinError(
                f"cannot join {self!r}: its dataset has no join(); join the datasets one "
                "after the other, then select"
            )
        joined = join(other, **options)
        mine = self._kept if self._kept is not None else self.base_indices(np.arange(self._len))
        return KeySubset(joined, joined.from_left(mine), kept=True, where=self._where)

    @property
    def selection(self) -> dict[str, Any] | None:
        """What a sampler records of a view made with :meth:`where` (else ``None``): the
        expressions, the sample count and a digest of exactly which samples are in it.

        ``ResumableSampler`` and ``BucketBatchSampler`` save it in their state and refuse
        a state saved with another selection."""
        if not self._where:
            return None
        if self._digest is None:
            held = self._kept if self._kept is not None else self._dropped
            assert held is not None
            digest = hashlib.blake2b(digest_size=16)
            digest.update(f"{len(self.base)}:{self._kept is not None}:".encode())
            digest.update(np.ascontiguousarray(held, dtype="<i8").tobytes())
            self._digest = digest.hexdigest()
        return {"where": list(self._where), "samples": self._len, "digest": self._digest}

    def __len__(self) -> int:
        return self._len

    def base_indices(self, indices: npt.ArrayLike) -> Array:
        """The base dataset's index of each view index (negative ones count from the end)."""
        view = np.asarray(indices, dtype=np.int64)
        view = np.where(view < 0, view + self._len, view)
        bad = np.flatnonzero((view < 0) | (view >= self._len))
        if bad.size:
            given = np.asarray(indices).reshape(-1)[bad[0]]
            raise SampleIndexError(
                f"index {given} is out of range for a view of {self._len} samples"
            )
        if self._kept is not None:
            return self._kept[view]
        assert self._adjusted is not None
        return view + np.searchsorted(self._adjusted, view, side="right")

    def __getitem__(self, index: int) -> Any:
        return self.base[int(self.base_indices(index))]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        mapped = self.base_indices(np.fromiter(indices, np.int64, len(indices))).tolist()
        hint = getattr(indices, "hint", None)
        if isinstance(hint, Hint):  # ReadAheadBatches: the next batches, as base indices
            mapped = HintedBatch(mapped, self._base_hint(hint))
        getitems = getattr(self.base, "__getitems__", None)
        return list(getitems(mapped)) if getitems else [self.base[i] for i in mapped]

    def read_ahead(self, hint: Hint) -> None:
        """The base dataset's ``read_ahead`` of ``hint``'s batches (as base indices)."""
        read_ahead = getattr(self.base, "read_ahead", None)
        if read_ahead is not None:
            read_ahead(self._base_hint(hint))

    def _base_hint(self, hint: Hint) -> Hint:
        return dataclasses.replace(hint, ahead=self.base_indices(hint.ahead).astype(np.int64))

    def __iter__(self) -> Iterator[Any]:
        for i in range(self._len):
            yield self[i]

    @property
    def shard_sizes(self) -> Array | None:
        """Samples of this view in each of the base's shards (``order="blocks"`` reads it)."""
        sizes = getattr(self.base, "shard_sizes", None)
        if sizes is None:
            return None
        ends = np.cumsum(sizes)
        counted = self._kept if self._kept is not None else self._dropped
        assert counted is not None
        per_shard = np.bincount(np.searchsorted(ends, counted, side="right"), minlength=len(sizes))
        result = per_shard if self._kept is not None else np.asarray(sizes) - per_shard
        return result.astype(np.int64)

    def close(self) -> None:
        """Close the base dataset's open shards."""
        close = getattr(self.base, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"KeySubset({self.base!r}, {self._len} samples)"


class KeyViews:
    """``index_of``, ``select``, ``exclude`` and ``where`` of a dataset of indexed
    shards (:class:`~indextar.read.protocols.IndexedShards`), which
    :class:`~indextar.IndexedTarDataset` has from here."""

    def index_of(self: IndexedShards, key: str) -> int:
        """The dataset index of the first sample whose ``__key__`` is ``key``.

        Opens shards' indexes in order until one has the key: O(shards) when the key is
        near the end or absent.

        Raises
        ------
        SampleKeyError
            If no sample has that key.
        """
        for shard_no in range(len(self.shards)):
            if self.shard_sizes[shard_no] == 0:
                continue
            found = self.shard_index(shard_no).find_key(key)
            if found:
                return int(self.shard_starts[shard_no]) + found[0]
        raise SampleKeyError(f"no sample has the key {key!r} in {len(self.shards)} shards")

    def select(self: IndexedShards, keys: KeysArg, *, strict: bool = False) -> KeySubset:
        """A view of the samples whose ``__key__`` is one of ``keys``, in dataset order.

        ``keys`` is an iterable of keys or the path of a text file of keys, one a line.
        The view is map-style (``len``, ``view[i]``, ``select``, ``exclude``) and holds
        O(min(selected, excluded)) numbers. A key matching no sample is logged as a
        warning (with a count and the first few), or with ``strict=True`` raises
        :class:`~indextar.SampleKeyError`. Reads every shard's keys once.
        """
        return KeySubset.of(self).select(keys, strict=strict)

    def exclude(self: IndexedShards, keys: KeysArg, *, strict: bool = False) -> KeySubset:
        """A view without the samples whose ``__key__`` is one of ``keys``: dedup lists,
        takedowns, held-out splits. As :meth:`select`, otherwise."""
        return KeySubset.of(self).exclude(keys, strict=strict)

    def where(
        self: IndexedShards, expression: str, *, cache_dir: PathLike | None | bool = None
    ) -> KeySubset:
        """A view of the samples that satisfy the SQL ``expression``, in dataset order.

        The expression is evaluated over each shard's index: its attribute columns (an
        index built with ``attributes_from="json"`` or given ``import_attributes``), ``__key__`` and
        ``size(ext)``, the size of the sample's member of that extension; for example
        ``"aesthetic > 5 AND width >= 512 AND size(jpg) < 500000"``. Shards are queried
        in parallel; the view holds O(selected) numbers and composes with
        :meth:`select`, :meth:`exclude`, ``MixtureDataset`` and the samplers, which
        record its ``selection``. The result is cached under ``cache_dir`` (default
        ``~/.cache/indextar/selections``; ``False``: no cache), keyed by the expression
        and the indexes' identities. See docs/metadata.md.

        Raises
        ------
        SelectionError
            If the expression fails on a shard's index (the shard and SQLite's message).
        MissingAttributesError
            If it names an attribute that some shards' indexes have none of (named).
        StaleIndexError
            If a shard changed since it was indexed.
        """
        return KeySubset.of(self).where(expression, cache_dir=cache_dir)


def _complement(indices: Array, size: int) -> Array:
    """The sorted indices of ``range(size)`` not in sorted, distinct ``indices``, built
    run by run (never an array of ``size``)."""
    gaps = np.diff(np.concatenate(([-1], indices, [size]))) - 1
    return np.arange(size - indices.size, dtype=np.int64) + np.repeat(
        np.arange(indices.size + 1, dtype=np.int64), gaps
    )
