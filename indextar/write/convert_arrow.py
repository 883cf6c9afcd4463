"""``convert``'s arrow sources: parquet files, and Hugging Face datasets saved to disk.

Parquet: a ``.parquet`` file, or a folder of them (read recursively, in the order of
their relative paths, as the Hub lays out ``data/train-00000-of-00004.parquet``), one
piece per row group. A saved Hugging Face dataset (``Dataset.save_to_disk``): the
folder's ``state.json`` lists its arrow files (Arrow IPC streams) in order, one piece
per file. A ``DatasetDict``'s folder holds one such folder per split: convert a split.

Binary columns, and Hugging Face's ``Image`` and ``Audio`` columns (structs of
``bytes`` and ``path``; a null ``bytes`` is read from the file at ``path``), are
members; every other column holds values. Members' bytes are sliced from Arrow's
buffers without a copy. Needs pyarrow (``pip install 'indextar[meta]'``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConvertError
from .convert_source import (
    ColumnKind,
    ColumnPlan,
    Source,
    SourcePiece,
    SourceRow,
    plain_value,
    source_files,
)

__all__ = ["scan_parquet", "scan_hf", "read_arrow", "is_hf_dataset"]


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:  # pragma: no cover - pyarrow is in the test extra
        raise ImportError(
            "converting parquet or arrow needs pyarrow: pip install 'indextar[meta]'"
        ) from e
    return pyarrow


def _is_image_struct(pa: Any, dtype: Any) -> bool:
    """Hugging Face's ``Image``/``Audio`` storage: a struct with a binary ``bytes`` field."""
    if not pa.types.is_struct(dtype):
        return False
    index = dtype.get_field_index("bytes")
    return index >= 0 and _is_binary(pa, dtype.field(index).type)


def _is_binary(pa: Any, dtype: Any) -> bool:
    return bool(pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype))


def _kinds(pa: Any, schema: Any) -> dict[str, ColumnKind]:
    kinds: dict[str, ColumnKind] = {}
    for field in schema:
        binary = _is_binary(pa, field.type) or _is_image_struct(pa, field.type)
        kinds[field.name] = "binary" if binary else "value"
    return kinds


def scan_parquet(path: str | Path) -> Source:
    """A parquet file, or a folder of them, as a :class:`Source`."""
    pa = _pyarrow()
    root = Path(path)
    files = (
        sorted(root.rglob("*.parquet"), key=lambda p: p.relative_to(root).as_posix())
        if root.is_dir()
        else [root]
    )
    if not files:
        raise ConvertError("no .parquet files in this folder", source=str(root))
    pieces: list[SourcePiece] = []
    schema = None
    for file in files:
        try:
            meta = pa.parquet.ParquetFile(file).metadata
        except (OSError, pa.ArrowException) as e:
            raise ConvertError(
                f"{str(file)!r} is not a parquet file ({e})", source=str(root)
            ) from e
        file_schema = meta.schema.to_arrow_schema()
        if schema is None:
            schema = file_schema
        elif file_schema.names != schema.names:
            raise ConvertError(
                f"{str(file)!r} has the columns {file_schema.names}; {str(files[0])!r} has "
                f"{schema.names}",
                source=str(root),
            )
        pieces += [
            SourcePiece(str(file), group, meta.row_group(group).num_rows)
            for group in range(meta.num_row_groups)
        ]
    return Source("parquet", str(root), tuple(pieces), _kinds(pa, schema), source_files(files))


def is_hf_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``save_to_disk`` (a dataset or a dict)."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def scan_hf(path: str | Path) -> Source:
    """A ``Dataset.save_to_disk`` folder as a :class:`Source`."""
    pa = _pyarrow()
    root = Path(path)
    if (root / "dataset_dict.json").is_file():
        splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
        raise ConvertError(
            f"this is a DatasetDict; convert one of its splits: {[str(root / s) for s in splits]}",
            source=str(root),
        )
    try:
        state = json.loads((root / "state.json").read_text())
        files = [root / entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(
            f"no readable state.json of a saved dataset ({e})", source=str(root)
        ) from e
    pieces, schema = [], None
    for file in files:
        with pa.memory_map(str(file)) as mapped:
            reader = pa.ipc.open_stream(mapped)
            schema = reader.schema if schema is None else schema
            rows = sum(batch.num_rows for batch in reader)
        pieces.append(SourcePiece(str(file), 0, rows))
    if schema is None:
        raise ConvertError("state.json lists no arrow files", source=str(root))
    return Source("hf", str(root), tuple(pieces), _kinds(pa, schema), source_files(files))


def _table(source: Source, piece: SourcePiece, columns: list[str]) -> Any:
    pa = _pyarrow()
    if source.format == "parquet":
        return pa.parquet.ParquetFile(piece.path).read_row_group(piece.part, columns=columns)
    with pa.memory_map(piece.path) as mapped:
        return pa.ipc.open_stream(mapped).read_all().select(columns)


def _binary_values(pa: Any, array: Any, folder: Path) -> list[bytes | memoryview | None]:
    """Each value of a binary (or image struct) array: memoryviews into its buffers."""
    if pa.types.is_struct(array.type):
        data = array.field("bytes")
        paths = array.field("path").to_pylist() if array.type.get_field_index("path") >= 0 else None
        values = _binary_values(pa, data, folder)
        nulls = array.is_null().to_numpy(zero_copy_only=False)
        for i, value in enumerate(values):
            if nulls[i]:
                values[i] = None
            elif value is None and paths is not None and paths[i]:
                file = Path(paths[i]) if Path(paths[i]).is_absolute() else folder / paths[i]
                values[i] = file.read_bytes() if file.is_file() else None
        return values
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    validity, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, width)[array.offset : array.offset + len(array) + 1]
    data = memoryview(data_buffer) if data_buffer is not None else memoryview(b"")
    bounds = offsets.tolist()
    sliced: list[bytes | memoryview | None] = [
        data[bounds[i] : bounds[i + 1]] for i in range(len(array))
    ]
    if array.null_count:
        for i in np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False)).tolist():
            sliced[i] = None
    return sliced


def read_arrow(
    source: Source, piece: SourcePiece, plan: ColumnPlan, start: int, stop: int
) -> Iterator[SourceRow]:
    """Rows ``start`` to ``stop`` of a parquet row group or an arrow file."""
    pa = _pyarrow()
    table = _table(source, piece, plan.columns).slice(start, stop - start)
    folder = Path(piece.path).parent
    for batch in table.to_batches():
        members = [_binary_values(pa, batch.column(column), folder) for _, column in plan.members]
        values = []
        for column in plan.attributes:
            array = batch.column(column)
            kind = array.type
            plain = (
                pa.types.is_integer(kind)
                or pa.types.is_floating(kind)
                or pa.types.is_boolean(kind)
                or pa.types.is_string(kind)
                or pa.types.is_large_string(kind)
            )
            listed = array.to_pylist()
            values.append(listed if plain else [plain_value(v) for v in listed])
        keys = batch.column(plan.key).to_pylist() if plan.key is not None else None
        for i in range(batch.num_rows):
            yield SourceRow(
                key=None if keys is None else keys[i],
                members=tuple(m[i] for m in members),
                attributes=tuple(v[i] for v in values),
            )
