"""``read_indextar``: indexed tar shards as a Ray Data dataset, read by ranges of samples.

The datasource opens the shards' indexes once, on the driver: their sample counts, the
extensions of their members (the columns), their data bytes (Ray's size estimates)
and, with ``where=``, the selected samples (:func:`~indextar.read.selection.where_indices`,
SQL over the indexes). The selected dataset indices, sorted, are cut into as many
contiguous ranges as Ray asks for read tasks; a task reads its range a block at a time
with the dataset's batched read (one read call per shard for a block), so no byte of
a sample that the selection drops is read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from ..index.shard import PathLike
from ..read.dataset import IndexedTarDataset, ShardsArg
from ..read.selection import where_indices

__all__ = ["IndextarDatasource", "read_indextar"]

log = logging.getLogger(__name__)

BLOCK_BYTES = 64 << 20
"""About how many bytes of samples make one block of a read task."""
MAX_BLOCK_ROWS = 4096
MIN_TASK_ROWS, MIN_TASK_BYTES = 256, 16 << 20
"""A read task has at least this many samples or bytes, when there are enough: each
costs Ray some milliseconds to schedule, and its own open of each shard it reads."""
FIELDS = (("__key__", pa.string()), ("__shard__", pa.string()), ("__index__", pa.int64()))
"""A row's columns before the members': the sample's key, shard and dataset index."""
_THREADS = 8  # indexes queried at once (SQLite releases the GIL while it steps)

Array = npt.NDArray[np.int64]


class IndextarDatasource(Datasource):
    """Indexed WebDataset shards as a ``ray.data.Datasource``: see :func:`read_indextar`.

    Parameters
    ----------
    paths
        Shards as :class:`~indextar.IndexedTarDataset` takes them: a brace pattern, a
        glob, a list, or a manifest.
    where
        SQL over each sample's attributes, ``__key__`` and ``size(ext)`` (see
        ``IndexedTarDataset.where``): only the samples it keeps are read.
    keys
        The member extensions to return as columns (all of them by default), a
        sequence or one space-separated string.
    index_dir, storage_options
        As :class:`~indextar.IndexedTarDataset` has them.
    """

    def __init__(
        self,
        paths: ShardsArg,
        *,
        where: str | None = None,
        keys: Sequence[str] | None = None,
        index_dir: PathLike | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.dataset = IndexedTarDataset(
            paths, index_dir=index_dir, storage_options=storage_options
        )
        """The shards, as a dataset that returns members as bytes."""
        dataset = self.dataset
        self.positions: Array = (
            np.arange(len(dataset), dtype=np.int64)
            if where is None
            else where_indices(dataset, where)
        )
        """The dataset indices of the samples read, sorted."""
        counts, data_bytes = _shard_contents(dataset)
        if keys is None:
            self.columns: tuple[str, ...] = tuple(sorted(counts))
        else:
            wanted = keys.split() if isinstance(keys, str) else list(keys)
            missing = [ext for ext in wanted if ext not in counts]
            if missing:
                log.warning(
                    "no member of %d shards has the extension %s; its column is all null",
                    len(dataset.shards),
                    ", ".join(map(repr, missing)),
                )
            self.columns = tuple(wanted)
        """The member extensions returned, one binary column each."""
        self.schema = pa.schema([*FIELDS, *((ext, pa.large_binary()) for ext in self.columns)])
        """The rows' Arrow schema."""
        sizes = dataset.shard_sizes
        self._sample_bytes = np.divide(
            data_bytes, sizes, out=np.zeros(len(sizes), dtype=np.float64), where=sizes > 0
        )

    def estimate_inmemory_data_size(self) -> int:
        """The selected samples' member bytes, as their shards' indexes count them."""
        return self._bytes(self.positions)

    def _shard_nos(self, positions: Array) -> Array:
        return self.dataset.shard_starts.searchsorted(positions, side="right") - 1

    def _bytes(self, positions: Array) -> int:
        return int(self._sample_bytes[self._shard_nos(positions)].sum())

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        """At most ``parallelism`` read tasks, each a contiguous range of the selected
        samples (of at least :data:`MIN_TASK_ROWS` samples or :data:`MIN_TASK_BYTES`)."""
        del data_context  # nothing here depends on it
        total = self.positions.size
        if not total:
            return []
        enough = max(total // MIN_TASK_ROWS, self._bytes(self.positions) // MIN_TASK_BYTES, 1)
        tasks = []
        for chunk in np.array_split(self.positions, min(max(parallelism, 1), enough, total)):
            size = self._bytes(chunk)
            rows = int(min(MAX_BLOCK_ROWS, max(1, BLOCK_BYTES * chunk.size // max(size, 1))))
            reader = _RangeRead(self.dataset, chunk, self.columns, self.schema, rows)
            metadata = BlockMetadata(
                num_rows=int(chunk.size),
                size_bytes=size,
                input_files=tuple(
                    self.dataset.shards[n] for n in np.unique(self._shard_nos(chunk))
                ),
                exec_stats=None,
            )
            tasks.append(
                ReadTask(
                    reader, metadata, schema=self.schema, per_task_row_limit=per_task_row_limit
                )
            )
        return tasks


class _RangeRead:
    """One read task: samples ``positions`` of ``dataset``, ``rows`` at a time, as Arrow
    tables of ``schema``."""

    def __init__(
        self,
        dataset: IndexedTarDataset,
        positions: Array,
        columns: tuple[str, ...],
        schema: pa.Schema,
        rows: int,
    ) -> None:
        self.dataset, self.positions, self.columns = dataset, positions, columns
        self.schema, self.rows = schema, rows

    def __call__(self) -> Iterator[pa.Table]:
        try:
            for start in range(0, self.positions.size, self.rows):
                samples = self.dataset.read_batch(self.positions[start : start + self.rows])
                yield pa.Table.from_pydict(
                    {name: [s.get(name) for s in samples] for name in self.schema.names},
                    schema=self.schema,
                )
        finally:
            self.dataset.close()


def _shard_contents(dataset: IndexedTarDataset) -> tuple[dict[str, int], Array]:
    """How many members of each extension the shards have, all together, and each
    shard's member bytes: from their indexes, queried in threads."""

    def one(shard_no: int) -> tuple[dict[str, int], int]:
        if not dataset.shard_sizes[shard_no]:
            return {}, 0
        index = dataset.shard_index(shard_no)
        return index.extension_counts(), index.data_bytes()

    counts: dict[str, int] = {}
    data_bytes = np.zeros(len(dataset.shards), dtype=np.int64)
    with ThreadPoolExecutor(max(1, min(_THREADS, len(dataset.shards)))) as pool:
        for shard_no, (found, size) in enumerate(pool.map(one, range(len(dataset.shards)))):
            data_bytes[shard_no] = size
            for ext, n in found.items():
                counts[ext] = counts.get(ext, 0) + n
    return counts, data_bytes


def read_indextar(
    paths: ShardsArg,
    *,
    where: str | None = None,
    keys: Sequence[str] | None = None,
    index_dir: PathLike | None = None,
    storage_options: dict[str, Any] | None = None,
    override_num_blocks: int | None = None,
    concurrency: int | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> ray.data.Dataset:
    """Indexed WebDataset shards as a ``ray.data.Dataset``, one row per sample.

    Each row has the sample's ``__key__``, ``__shard__`` and ``__index__`` (its index in
    ``IndexedTarDataset(paths)``) and one binary column per member extension (``keys=``,
    or every extension the indexes list), ``None`` where a sample has no such member.
    Members are bytes, as in the tar: decode them in ``map_batches``.

    ``where`` is evaluated on the indexes before any read task runs, so only the
    samples it keeps are read (``size(ext)``, ``__key__`` and attributes, as in
    ``IndexedTarDataset.where``). ``override_num_blocks``, ``concurrency`` and
    ``ray_remote_args`` are ``ray.data.read_datasource``'s.

    Raises
    ------
    ShardNotFoundError, StaleIndexError
        As :class:`~indextar.IndexedTarDataset` raises them.
    SelectionError
        If ``where`` is not valid SQL over a shard's samples.
    """
    datasource = IndextarDatasource(
        paths, where=where, keys=keys, index_dir=index_dir, storage_options=storage_options
    )
    dataset: ray.data.Dataset = ray.data.read_datasource(
        datasource,
        override_num_blocks=override_num_blocks,
        concurrency=concurrency,
        ray_remote_args=ray_remote_args,
    )
    return dataset
