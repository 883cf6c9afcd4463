"""``source(ds)``: a map-style dataset as Grain's ``RandomAccessDataSource``.

Grain reads a source from several threads at once (``ReadOptions(num_threads=16)`` by
default, in each worker process). The source takes no lock: a dataset's reads are safe
from threads (its open shards are leased to each read, :mod:`indextar.read.shard`),
and reads of remote shards wait on the network in parallel.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol, SupportsIndex, runtime_checkable

import numpy as np

__all__ = ["GrainSource", "MapStyle", "source"]

_CHUNK = 1 << 20  # a view's indices hashed this many at a time


@runtime_checkable
class MapStyle(Protocol):
    """What :func:`source` needs of a dataset: its length and one sample by index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class GrainSource:
    """A map-style dataset as Grain's ``RandomAccessDataSource``; made by :func:`source`.

    ``source[i]`` is ``dataset[i]`` (``decode=``, ``keys=`` and ``transform=`` as the
    dataset has them), from any thread; :meth:`_getitems` is Grain's batched read,
    the dataset's ``__getitems__`` (one read per shard for a batch).
    """

    def __init__(self, dataset: MapStyle) -> None:
        if not isinstance(dataset, MapStyle):
            raise TypeError(
                "indextar.grain.source() takes a map-style dataset (len(ds) and ds[i]), "
                f"such as IndexedTarDataset; got {type(dataset).__name__}"
            )
        self.dataset = dataset
        """The dataset read."""
        self._identity: str | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: SupportsIndex) -> Any:
        return self.dataset[index.__index__()]

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, in order: Grain's batched read
        (``SupportsBatchedReadRandomAccessDataSource``), through the dataset's
        ``__getitems__`` where it has one."""
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(list(indices)))
        return [self.dataset[int(i)] for i in indices]

    __getitems__ = _getitems  # the same batch, by the name torch's DataLoader calls

    @property
    def paths(self) -> tuple[str, ...]:
        """The dataset's shards (Grain logs a source's ``paths`` as its lineage)."""
        base = getattr(self.dataset, "base", self.dataset)
        return tuple(getattr(base, "shards", ()))

    def __repr__(self) -> str:
        # Grain's DataLoader saves repr(source) in its checkpoints and refuses to
        # restore one into a source whose repr differs: it must say which samples.
        if self._identity is None:  # computed once, when Grain first asks
            self._identity = identity(self.dataset)
        return f"indextar.grain.source({self.dataset!r}, samples={self._identity})"


def identity(dataset: MapStyle) -> str:
    """A digest of which samples ``dataset`` serves, in order: its length, its shards and
    their sample counts, and for a view which of them it keeps (a ``where`` view's
    selection digest; else its base indices, hashed a million at a time)."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(f"{type(dataset).__name__}:{len(dataset)}\0".encode())
    base = getattr(dataset, "base", dataset)
    for shard, size in zip(getattr(base, "shards", ()), getattr(base, "shard_sizes", ())):
        digest.update(f"{shard}\0{int(size)}\0".encode("utf-8", "surrogateescape"))
    selection = getattr(dataset, "selection", None)
    base_indices = getattr(dataset, "base_indices", None)
    if selection:
        digest.update(str(selection["digest"]).encode())
    elif base_indices is not None:
        for start in range(0, len(dataset), _CHUNK):
            chunk = np.arange(start, min(start + _CHUNK, len(dataset)), dtype=np.int64)
            digest.update(np.ascontiguousarray(base_indices(chunk), dtype="<i8").tobytes())
    return digest.hexdigest()


def source(dataset: MapStyle) -> GrainSource:
    """``dataset`` as a Grain data source, for ``grain.MapDataset.source(...)`` or
    ``grain.DataLoader(data_source=...)``: see :class:`GrainSource`.

    Raises
    ------
    TypeError
        If ``dataset`` has no ``len()`` or ``[i]``.
    """
    return GrainSource(dataset)
