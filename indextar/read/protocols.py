"""What the views and mixtures use of a dataset of indexed shards, as ``Protocol``\\ s.

:class:`~indextar.IndexedTarDataset` has both. The views (``subset``, ``selection``,
``lookup``) and ``MixtureDataset`` take any object that has them and import this
module, never ``dataset``: no module of ``read/`` imports the dataset back, and the
coupling is public names that a reader and the type checker both see.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from ..index.manifest import ManifestShard
from ..index.shard import ShardIndex

__all__ = ["IndexedShards", "BatchReader", "SampleBuild", "Unbuilt", "UnbuiltReader", "KeyedView"]

SampleBuild = Callable[[dict[str, Any], Any], Any]
"""A sample built from its fields and undecoded members (decode, ``keys=``, transform)."""

Unbuilt = tuple[dict[str, Any], list[tuple[str, bytes]]]
"""A sample read and not built: its fields, and its members as ``(extension, data)``."""


class IndexedShards(Protocol):
    """A map-style dataset read from indexed shards, as the views see it: its shards,
    their sample counts and first indices, and each shard's opened index."""

    @property
    def shards(self) -> tuple[str, ...]:
        """Each shard's path or URL, in order."""
        ...

    @property
    def shard_sizes(self) -> npt.NDArray[np.int64]:
        """Samples per shard, in shard order."""
        ...

    @property
    def shard_starts(self) -> npt.NDArray[np.int64]:
        """Each shard's first dataset index, and the dataset's length last."""
        ...

    @property
    def shard_entries(self) -> tuple[ManifestShard, ...]:
        """Each shard's entry: URL, sample count, and its index's path if recorded."""
        ...

    @property
    def index_dir(self) -> str | None:
        """The folder of the indexes, when they are not next to their shards."""
        ...

    @property
    def storage_options(self) -> Mapping[str, Any] | None:
        """fsspec's options for the remote shards."""
        ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, sample number within the shard)`` of dataset index ``index``."""
        ...

    def shard_index(self, shard_no: int) -> ShardIndex:
        """Shard ``shard_no``'s index, opened and validated."""
        ...


@runtime_checkable
class BatchReader(Protocol):
    """A dataset whose batches ``MixtureDataset`` reads directly: shard by shard, each
    sample given its part's ``__source__`` among its fields before it is built."""

    @property
    def shard_sizes(self) -> npt.NDArray[np.int64]:
        """Samples per shard, in shard order."""
        ...

    def read_batch(
        self, positions: npt.NDArray[np.int64], extra: dict[str, Any] | None = None
    ) -> list[Any]:
        """The samples at ``positions``, each sample's fields with ``extra`` added."""
        ...

    def read_into(
        self,
        out: list[Any],
        ats: list[int],
        shard_no: int,
        locals_: list[int],
        positions: list[int],
        extra: dict[str, Any] | None,
        build: SampleBuild | None,
    ) -> None:
        """Samples ``locals_[at]`` of shard ``shard_no`` into ``out[at]``, for ``at`` in
        ``ats``: built, or ``(fields, members)`` when ``build`` is ``None``."""
        ...

    def direct_builder(self) -> SampleBuild | None:
        """The build :meth:`read_into` may run as it reads, or ``None`` when batches
        need more (a decode pool, a transform, remote ranges)."""
        ...


class UnbuiltReader(IndexedShards, Protocol):
    """A dataset of indexed shards that reads samples without building them, for a
    joined view, which merges two datasets' members and then builds the sample."""

    def read_unbuilt(self, positions: npt.NDArray[np.int64]) -> list[Unbuilt]:
        """Each sample at ``positions`` (in range) as ``(fields, members)``."""
        ...


@runtime_checkable
class KeyedView(Protocol):
    """A view that finds its own samples by key, by ``where`` and by attribute values
    (a joined view): ``KeySubset``, ``bucket_ids`` and ``PackedDataset`` ask it rather
    than reading a dataset's indexes themselves."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...

    def key_indices(self, keys: Any, *, strict: bool) -> npt.NDArray[np.int64]:
        """Sorted indices of the samples whose key is one of ``keys``."""
        ...

    def where_indices(self, expression: str, *, cache_dir: Any) -> npt.NDArray[np.int64]:
        """Sorted indices of the samples that satisfy ``expression``."""
        ...

    def attribute_values(self, expression: str) -> npt.NDArray[np.float64]:
        """The value of ``expression`` for every sample, in order; NaN where NULL."""
        ...
