"""``convert``'s Mosaic MDS source: a folder of ``index.json`` and ``.mds`` shard files.

Read without ``mosaicml-streaming`` (whose package needs a matching torch and
torchvision). ``index.json`` lists the shards in order, each with its columns
(``column_names``, ``column_encodings``, ``column_sizes``) and sample count. A shard
file is::

    uint32 num_samples | uint32 offsets[num_samples + 1] | ... | samples

with absolute offsets; a sample is a ``uint32`` size for each column of variable size,
in column order, then the columns' data in column order. A shard written with
``compression=`` is read from its ``zip_data`` file (zstd, gz and bz2).

Columns of the encodings ``bytes``, ``jpeg``, ``png``, ``pkl``, ``ndarray`` and the
other binary ones are members, their stored bytes as they are (a ``jpeg`` column's are
a JPEG file); ``str``, ``json``, the numbers and ``str_int``/``str_float``/
``str_decimal`` are values, decoded as the library decodes them.
"""

from __future__ import annotations

import bz2
import gzip
import json
import struct
from collections.abc import Callable, Iterator
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
    record_spans,
    source_files,
)

__all__ = ["scan_mds", "read_mds", "is_mds_dataset"]

_NUMBERS = {
    "int": np.int64,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}
_TEXT: dict[str, Callable[[str], Any]] = {
    "str": str,
    "str_int": int,
    "str_float": float,
    "str_decimal": str,
    "json": json.loads,
}


def is_mds_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder with an MDS ``index.json``."""
    index = path / "index.json"
    return (
        index.is_file() and '"mds"' in index.read_text()[:4096] and '"shards"' in index.read_text()
    )


def _index(root: Path) -> list[dict[str, Any]]:
    try:
        shards = json.loads((root / "index.json").read_text())["shards"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"no readable MDS index.json ({e})", source=str(root)) from e
    for shard in shards:
        if shard.get("format") != "mds":
            raise ConvertError(
                f"shard {shard.get('raw_data')} is {shard.get('format')!r}, not 'mds'",
                source=str(root),
            )
    return list(shards)


def _kind(encoding: str) -> ColumnKind:
    return "value" if encoding in _NUMBERS or encoding in _TEXT else "binary"


def scan_mds(path: str | Path) -> Source:
    """An MDS folder as a :class:`Source`."""
    root = Path(path)
    shards = _index(root)
    columns: dict[str, ColumnKind] = {}
    for shard in shards:
        found = {
            name: _kind(enc) for name, enc in zip(shard["column_names"], shard["column_encodings"])
        }
        if columns and found != columns:
            raise ConvertError(
                f"shard {shard['raw_data']['basename']!r} has the columns {found}, not {columns}",
                source=str(root),
            )
        columns = found
    files = [_shard_file(root, shard) for shard in shards]
    pieces = tuple(
        SourcePiece(str(root / "index.json"), i, int(shard["samples"]))
        for i, shard in enumerate(shards)
    )
    return Source("mds", str(root), pieces, columns, source_files([root / "index.json", *files]))


def _shard_file(root: Path, shard: dict[str, Any]) -> Path:
    raw = root / str(shard["raw_data"]["basename"])
    if raw.is_file() or not shard.get("zip_data"):
        return raw
    return root / str(shard["zip_data"]["basename"])


def _shard_bytes(root: Path, shard: dict[str, Any]) -> bytes:
    file = _shard_file(root, shard)
    data = file.read_bytes()
    if file.name == shard["raw_data"]["basename"]:
        return data
    codec = str(shard.get("compression") or "").split(":")[0]
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    if codec == "gz":
        return gzip.decompress(data)
    if codec == "bz2":
        return bz2.decompress(data)
    raise ConvertError(
        f"shard {file.name!r} is compressed with {codec!r}; indextar reads MDS "
        "shards that are uncompressed or zstd, gz or bz2",
        source=str(root),
    )


def _decode(encoding: str, data: bytes) -> Any:
    number = _NUMBERS.get(encoding)
    if number is not None:
        return np.frombuffer(data, number)[0].item()
    return _TEXT[encoding](data.decode("utf-8"))


def read_mds(
    source: Source, piece: SourcePiece, plan: ColumnPlan, start: int, stop: int
) -> Iterator[SourceRow]:
    """Samples ``start`` to ``stop`` of one MDS shard."""
    root = Path(source.root)
    shard = _index(root)[piece.part]
    names, encodings = shard["column_names"], shard["column_encodings"]
    sizes = shard["column_sizes"]
    data = _shard_bytes(root, shard)
    count = struct.unpack_from("<I", data)[0]
    offsets = np.frombuffer(data, "<u4", count + 1, 4).tolist()
    position = {name: i for i, name in enumerate(names)}
    variable = [i for i, size in enumerate(sizes) if size is None]
    view = memoryview(data)
    for sample in range(start, stop):
        at = offsets[sample]
        lengths = list(sizes)
        for j, i in enumerate(variable):
            lengths[i] = struct.unpack_from("<I", data, at + 4 * j)[0]
        at += 4 * len(variable)
        what = f"sample {sample} of {shard['raw_data']['basename']!r}"
        spans = record_spans(view, at, lengths, offsets[sample + 1], what=what, source=str(root))
        members = tuple(spans[position[name]] for _, name in plan.members)
        values = tuple(
            _decode(encodings[position[name]], bytes(spans[position[name]]))
            for name in plan.attributes
        )
        key = None
        if plan.key is not None:
            i = position[plan.key]
            key = _key_value(encodings[i], spans[i])
        yield SourceRow(key=key, members=members, attributes=values)


def _key_value(encoding: str, data: memoryview) -> object:
    return _decode(encoding, bytes(data)) if _kind(encoding) == "value" else bytes(data)
