"""Export the shards' attributes as one parquet table: ``export_parquet``.

The other way from ``convert``: each sample of each shard is a row, with its shard,
its position in the shard and its key (``__shard__``, ``__index__``, ``__key__``), and
every attribute column of the shards' indexes (NULL where a shard has no such column).
Read from the indexes only; the shards are not opened. Needs pyarrow
(``pip install 'indextar[meta]'``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..atomic import atomic_path
from ..errors import ExportError
from ..index.attributes import attribute_columns, quote
from ..index.opener import usable_index
from ..index.shard import PathLike

__all__ = ["export_parquet"]


def _columns(index: Path) -> tuple[list[str], dict[str, list[Any]]]:
    """The keys of a shard's samples, and each attribute column's values."""
    with contextlib.closing(sqlite3.connect(f"file:{index}?mode=ro", uri=True)) as conn:
        keys = [key for (key,) in conn.execute("SELECT key FROM samples ORDER BY sample_id")]
        names = attribute_columns(conn)
        values: dict[str, list[Any]] = {name: [None] * len(keys) for name in names}
        if names:
            selected = ", ".join(quote(name) for name in names)
            rows = conn.execute(f"SELECT __sample__, {selected} FROM attributes")
            for sample, *row in rows:
                for name, value in zip(names, row):
                    values[name][sample] = value
    return keys, values


def export_parquet(
    shards: Sequence[PathLike], path: PathLike, *, index_dir: PathLike | None = None
) -> Path:
    """Write one row per sample of ``shards`` (its shard, index, key and attributes) to
    the parquet file ``path``; return it.

    Raises
    ------
    ExportError
        If a column's values cannot be one parquet type (an attribute holding numbers
        in one shard and text in another).
    """
    import pyarrow as pa
    import pyarrow.parquet

    shard_names: list[str] = []
    positions: list[int] = []
    keys: list[str] = []
    columns: dict[str, list[Any]] = {}
    for shard in shards:
        index = usable_index(shard, index_dir=index_dir)
        shard_keys, values = _columns(index.path)
        start = len(keys)
        for name, column in values.items():
            columns.setdefault(name, [None] * start).extend(column)
        keys += shard_keys
        for column in columns.values():
            column.extend([None] * (len(keys) - len(column)))
        shard_names += [os.fspath(shard)] * len(shard_keys)
        positions += range(len(shard_keys))
    arrays = {"__shard__": shard_names, "__index__": positions, "__key__": keys}
    try:
        table = pa.table(arrays | columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ExportError(f"the attributes cannot be one parquet table ({e})") from e
    target = Path(path)
    with atomic_path(target) as tmp:
        pa.parquet.write_table(table, tmp)
    return target
