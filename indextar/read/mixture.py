"""MixtureDataset: several map-style datasets as one, each sample naming its part.

Indexing is :class:`torch.utils.data.ConcatDataset`'s: part 0's samples first, then
part 1's, and so on. It has ``ConcatDataset``'s ``datasets`` and ``cumulative_sizes``
(plus ``names``), which is how :class:`~indextar.ResumableSampler` with ``weights=``
finds the parts. What it holds is O(parts): the parts themselves and their sizes (and
O(shards) numbers for parts that are IndexedTarDatasets, read as one list of shards).
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SampleIndexError
from ..order.readahead import Hint
from ..source.base import fork_generation
from .protocols import BatchReader, SampleBuild

__all__ = ["MixtureDataset"]

SOURCE_FIELD = "__source__"


class MixtureDataset:
    """Map-style datasets as one: ``len`` is the sum of the parts', ``data[i]`` as in
    ``ConcatDataset``.

    Parameters
    ----------
    parts
        ``{name: dataset}``, or a sequence of datasets (named by their numbers). Any
        map-style dataset: an :class:`~indextar.IndexedTarDataset`, a key-subset view of
        one, or anything with ``__len__`` and ``__getitem__``.

    Notes
    -----
    A sample that is a dict (a mutable mapping) gets ``"__source__"``: its part's
    name, or number (set in the dict the part returned). An
    :class:`~indextar.IndexedTarDataset` part's ``transform=`` sees it among the
    sample's fields. Other samples (the tuples of
    ``keys=``, a transform's tensors) come back as the part returns them;
    :meth:`locate` names the part of an index.

    Examples
    --------
    >>> data = MixtureDataset({"a": [{"x": 1}], "b": [{"x": 2}, {"x": 3}]})
    >>> len(data), data[2]
    (3, {'x': 3, '__source__': 'b'})
    """

    def __init__(self, parts: Mapping[str, Any] | Sequence[Any]) -> None:
        if isinstance(parts, Mapping):
            names: tuple[str | int, ...] = tuple(parts)
            datasets = list(parts.values())
            if not all(isinstance(name, str) for name in names):
                raise TypeError(f"part names must be strings; got {list(names)}")
        elif isinstance(parts, Sequence) and not isinstance(parts, str | bytes):
            datasets = list(parts)
            names = tuple(range(len(datasets)))
        else:
            raise TypeError(f"parts must be a mapping or a sequence; got {type(parts).__name__}")
        if not datasets:
            raise ValueError("a MixtureDataset needs at least one part")
        self.datasets: list[Any] = datasets
        """The parts, in order (as ``ConcatDataset.datasets``)."""
        self.names: tuple[str | int, ...] = names
        """Each part's name (its number for a sequence of parts)."""
        sizes = [len(d) for d in datasets]
        self.cumulative_sizes: list[int] = np.cumsum(sizes).tolist()
        """End of each part in the mixture's indices (as ``ConcatDataset.cumulative_sizes``)."""
        self._starts = np.array([0, *self.cumulative_sizes[:-1]], dtype=np.int64)
        self._ends = np.array(self.cumulative_sizes, dtype=np.int64)
        self._len: int = self.cumulative_sizes[-1]
        # The parts that read batches themselves (IndexedTarDatasets): __source__ is a field.
        self._readers: list[BatchReader | None] = [
            d if isinstance(d, BatchReader) else None for d in datasets
        ]
        self._flat = _FlatShards.of(self._readers, self._starts)

    @property
    def part_sizes(self) -> npt.NDArray[np.int64]:
        """Samples in each part."""
        return np.diff(np.array([0, *self.cumulative_sizes], dtype=np.int64)).astype(np.int64)

    @property
    def shard_sizes(self) -> npt.NDArray[np.int64] | None:
        """Every part's ``shard_sizes`` in order, when every part has them (else ``None``):
        ``ResumableSampler(order="blocks")`` without weights then reads shard by shard."""
        sizes = [getattr(d, "shard_sizes", None) for d in self.datasets]
        if any(s is None for s in sizes):
            return None
        return np.concatenate([np.asarray(s, dtype=np.int64) for s in sizes])

    def __len__(self) -> int:
        return self._len

    def locate(self, index: int) -> tuple[str | int, int]:
        """``(part name, index within the part)`` of mixture index ``index``."""
        part, local = self._locate(index)
        return self.names[part], local

    def _locate(self, index: int) -> tuple[int, int]:
        position = operator.index(index)
        if position < 0:
            position += self._len
        if not 0 <= position < self._len:
            raise SampleIndexError(
                f"index {index} is out of range for a mixture of {self._len} samples"
            )
        part = bisect.bisect_right(self.cumulative_sizes, position)
        return part, position - int(self._starts[part])

    def __getitem__(self, index: int) -> Any:
        part, local = self._locate(index)
        reader, name = self._readers[part], self.names[part]
        if reader is not None:  # so that its transform sees __source__, as in batches
            return reader.read_batch(np.array([local], dtype=np.int64), {SOURCE_FIELD: name})[0]
        return _with_source(self.datasets[part][local], name)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch, each part's samples fetched together (its ``__getitems__`` if it has
        one); a :class:`~indextar.ReadAheadBatches` batch then starts each part's
        read-ahead of the next batches (:meth:`read_ahead`)."""
        batch = self._read_batch(indices)
        hint = getattr(indices, "hint", None)
        if isinstance(hint, Hint):
            self.read_ahead(hint)
        return batch

    def read_ahead(self, hint: Hint) -> None:
        """Hand each part that reads ahead (``read_ahead``) its share of ``hint``'s
        batches, as its own indices: the mixture's order is the sampler's, a pure
        function of seed, epoch and position, so every part's future is known."""
        ahead = hint.ahead[(hint.ahead >= 0) & (hint.ahead < self._len)]
        sizes = np.array(hint.sizes, dtype=np.int64)
        if ahead.size != sizes.sum():  # an index out of range: its batch is short
            return
        batch_of = np.repeat(np.arange(sizes.size), sizes)
        parts = np.searchsorted(self._ends, ahead, side="right")
        for part, dataset in enumerate(self.datasets):
            read_ahead = getattr(dataset, "read_ahead", None)
            if read_ahead is None:
                continue
            mine = parts == part
            counts = np.bincount(batch_of[mine], minlength=sizes.size)
            local = (ahead[mine] - self._starts[part]).astype(np.int64)
            read_ahead(dataclasses.replace(hint, ahead=local, sizes=tuple(counts.tolist())))

    def _read_batch(self, indices: Sequence[int]) -> list[Any]:
        positions = np.fromiter(map(operator.index, indices), np.int64, len(indices))
        if positions.size and (positions.min() < 0 or positions.max() >= self._len):
            for position in positions.tolist():
                self._locate(position)  # raises SampleIndexError for one out of range
            positions = np.where(positions < 0, positions + self._len, positions)
        if self._flat is not None:
            direct = self._flat.read(self.names, positions)
            if direct is not None:
                return direct
        parts = np.searchsorted(self._ends, positions, side="right")
        locals_ = positions - self._starts[parts]
        order = np.argsort(parts, kind="stable")
        bounds = np.flatnonzero(np.diff(parts[order])) + 1
        results: list[Any] = [None] * positions.size
        for ats in np.split(order, bounds) if positions.size else []:
            part = int(parts[ats[0]])
            dataset, reader, name = self.datasets[part], self._readers[part], self.names[part]
            if reader is not None:  # an IndexedTarDataset: __source__ is a field
                samples = reader.read_batch(locals_[ats], {SOURCE_FIELD: name})
            else:
                wanted = locals_[ats].tolist()
                getitems = getattr(dataset, "__getitems__", None)
                samples = getitems(wanted) if getitems else [dataset[i] for i in wanted]
                for sample in samples:
                    _with_source(sample, name)
            if len(ats) == len(results):
                return samples if isinstance(samples, list) else list(samples)
            for at, sample in zip(ats.tolist(), samples):
                results[at] = sample
        return results

    def close(self) -> None:
        """Close every part that can be closed (they reopen on the next access)."""
        for dataset in self.datasets:
            close = getattr(dataset, "close", None)
            if close is not None:
                close()

    def __repr__(self) -> str:
        parts = ", ".join(f"{n!r}: {len(d)}" for n, d in zip(self.names, self.datasets))
        return f"MixtureDataset({{{parts}}}, {self._len} samples)"


def _with_source(sample: Any, name: str | int) -> Any:
    # Set in place: a part's dicts are its own. ``type is dict`` first: the ABC check
    # costs a microsecond, a third of reading a small sample.
    if type(sample) is dict or isinstance(sample, MutableMapping):
        sample[SOURCE_FIELD] = name
    return sample


class _FlatShards:
    """A mixture of :class:`~indextar.IndexedTarDataset` parts seen as one list of
    shards, so that a batch is read shard by shard as one dataset's is: no split by
    part and no second pass to put samples back in order. O(shards) numbers."""

    def __init__(
        self,
        parts_read: Sequence[BatchReader],
        starts: npt.NDArray[np.int64],
        parts: npt.NDArray[np.int64],
        firsts: npt.NDArray[np.int64],
        part_starts: npt.NDArray[np.int64],
    ) -> None:
        self.parts_read = parts_read  # the mixture's parts, each a BatchReader
        self.starts = starts  # each shard's first mixture index
        self.parts = parts  # each shard's part
        self.firsts = firsts  # each part's first shard
        self.part_starts = part_starts  # each part's first mixture index
        self._builds: list[SampleBuild] | None = None  # each part's direct build, per process
        self._generation = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_builds": None, "_generation": -1}

    def _direct_builds(self) -> list[SampleBuild] | None:
        """Each part's build, if every part reads batches directly in this process (a
        decode pool's size is resolved in each worker); else ``None``."""
        if self._generation != fork_generation():
            builds = [part.direct_builder() for part in self.parts_read]
            ready = [build for build in builds if build is not None]
            self._builds = ready if len(ready) == len(builds) else None
            self._generation = fork_generation()
        return self._builds

    @classmethod
    def of(
        cls, readers: Sequence[BatchReader | None], part_starts: npt.NDArray[np.int64]
    ) -> _FlatShards | None:
        """The parts as one list of shards, if every part is a :class:`BatchReader`."""
        parts_read = [reader for reader in readers if reader is not None]
        if len(parts_read) < len(readers):
            return None
        sizes = [np.asarray(d.shard_sizes, dtype=np.int64) for d in parts_read]
        counts = np.array([len(s) for s in sizes], dtype=np.int64)
        flat = np.concatenate(sizes)
        starts = np.concatenate([[0], np.cumsum(flat)[:-1]]).astype(np.int64)
        parts = np.repeat(np.arange(len(parts_read), dtype=np.int64), counts)
        firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        return cls(parts_read, starts, parts, firsts, part_starts)

    def read(
        self, names: Sequence[str | int], positions: npt.NDArray[np.int64]
    ) -> list[Any] | None:
        """The batch at ``positions`` (in range), or ``None`` if a part needs its own
        ``__getitems__`` (a decode pool, a transform, remote ranges)."""
        builds = self._direct_builds()
        if builds is None:
            return None
        shards = self.starts.searchsorted(positions, side="right") - 1
        parts = self.parts[shards]
        shard_list = shards.tolist()
        locals_ = (positions - self.starts[shards]).tolist()
        in_part = (positions - self.part_starts[parts]).tolist()
        groups: dict[int, list[int]] = {}
        for at, shard in enumerate(shard_list):
            groups.setdefault(shard, []).append(at)
        out: list[Any] = [None] * len(shard_list)
        for shard, ats in groups.items():
            part = int(self.parts[shard])
            self.parts_read[part].read_into(
                out,
                ats,
                shard - int(self.firsts[part]),
                locals_,
                in_part,
                {SOURCE_FIELD: names[part]},
                builds[part],
            )
        return out
