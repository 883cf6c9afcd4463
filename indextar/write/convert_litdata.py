"""``convert``'s LitData source: a folder of ``index.json`` and ``.bin`` chunk files.

Read without ``litdata`` (which needs its own torch). ``index.json`` lists the chunks
in order with their item counts, and its ``config`` the leaves of each item
(``data_format``) and their names (``data_spec``, a flattened pytree: a dict of
leaves names each leaf by its key; a single leaf or a list of leaves by position).
A chunk file (the ``PyTreeLoader``'s) is::

    uint32 num_items | uint32 offsets[num_items + 1] | items

with absolute offsets; an item is a ``uint32`` size for each leaf, then the leaves'
bytes in order. Chunks written with ``compression="zstd"`` are decompressed whole.
LitData 0.2.7x stores items without media or tensor leaves as an Arrow IPC file
instead, after a header whose offsets are all equal, followed by its ``uint32``
length and the magic ``LDARW01\0``; such chunks are read with pyarrow.

Leaves serialized as ``int``, ``float``, ``bool``, ``str`` and ``json`` are values;
every other leaf (``bytes``, ``jpeg``, ``pil``, ``numpy``, ``pickle``, ...) is a member,
its stored bytes as they are (a ``jpeg`` leaf's are a JPEG file).
"""

from __future__ import annotations

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

__all__ = ["scan_litdata", "read_litdata", "is_litdata_dataset"]

_VALUES: dict[str, Callable[[memoryview], object]] = {
    "int": lambda b: int(np.frombuffer(b, np.int64)[0]),
    "float": lambda b: float(np.frombuffer(b, np.float64)[0]),
    "bool": lambda b: bytes(b) != b"\x00",
    "str": lambda b: bytes(b).decode("utf-8"),
    "json": lambda b: json.loads(bytes(b).decode("utf-8")),
}


_ARROW_MAGIC = b"LDARW01\0"


def _arrow_rows(data: bytes, plan: ColumnPlan, start: int, stop: int) -> Iterator[SourceRow]:
    """Items of a chunk whose rows LitData (0.2.7x) stored as a trailing Arrow IPC file
    (``uint32`` length, magic): items whose leaves are no media or tensors."""
    import pyarrow as pa

    length = struct.unpack_from("<I", data, len(data) - 12)[0]
    ipc = pa.py_buffer(memoryview(data)[len(data) - 12 - length : len(data) - 12])
    reader = pa.ipc.open_file(ipc) if bytes(ipc[:6]) == b"ARROW1" else pa.ipc.open_stream(ipc)
    table = reader.read_all().slice(start, stop - start)
    members = [table.column(name).to_pylist() for _, name in plan.members]
    values = [table.column(name).to_pylist() for name in plan.attributes]
    keys = table.column(plan.key).to_pylist() if plan.key is not None else None
    for i in range(table.num_rows):
        yield SourceRow(
            key=None if keys is None else keys[i],
            members=tuple(m[i] for m in members),
            attributes=tuple(v[i] for v in values),
        )


def is_litdata_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder with a LitData ``index.json``."""
    index = path / "index.json"
    if not index.is_file():
        return False
    head = index.read_text()[: 1 << 16]
    return '"chunks"' in head and '"config"' in head


def _index(root: Path) -> dict[str, Any]:
    try:
        index = json.loads((root / "index.json").read_text())
        config, chunks = index["config"], index["chunks"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"no readable LitData index.json ({e})", source=str(root)) from e
    if config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
        raise ConvertError(
            f"chunks written by the {config['item_loader']!r} item loader; "
            "indextar reads the PyTreeLoader's",
            source=str(root),
        )
    if config.get("encryption"):
        raise ConvertError("the chunks are encrypted", source=str(root))
    if config.get("compression") not in (None, "zstd"):
        raise ConvertError(
            f"chunks compressed with {config['compression']!r}; indextar reads "
            "uncompressed or zstd chunks",
            source=str(root),
        )
    return {"config": config, "chunks": chunks}


def _leaf_names(root: Path, config: dict[str, Any]) -> list[str]:
    """Each leaf's name, from the flattened pytree's spec."""
    count = len(config["data_format"])
    try:
        spec = json.loads(config["data_spec"])[1]
        children = spec["children_spec"]
        if spec["type"] is None:
            return ["0"]
        if any(child["type"] is not None for child in children):
            raise ConvertError(
                "items nest containers in containers; indextar reads items "
                "that are a dict, list or tuple of leaves",
                source=str(root),
            )
        if spec["type"] == "builtins.dict":
            return [str(name) for name in json.loads(spec["context"])]
        return [str(i) for i in range(count)]
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ConvertError(f"cannot read the items' data_spec ({e})", source=str(root)) from e


def scan_litdata(path: str | Path) -> Source:
    """A LitData folder as a :class:`Source`."""
    root = Path(path)
    index = _index(root)
    formats = index["config"]["data_format"]
    names = _leaf_names(root, index["config"])
    if len(names) != len(formats):
        raise ConvertError(
            f"data_spec names {len(names)} leaves; data_format has {len(formats)}", source=str(root)
        )
    columns: dict[str, ColumnKind] = {
        name: "value" if fmt in _VALUES else "binary" for name, fmt in zip(names, formats)
    }
    chunks = index["chunks"]
    pieces = tuple(
        SourcePiece(str(root / c["filename"]), i, int(c["chunk_size"]))
        for i, c in enumerate(chunks)
    )
    files = [root / "index.json", *(root / c["filename"] for c in chunks)]
    return Source("litdata", str(root), pieces, columns, source_files(files))


def read_litdata(
    source: Source, piece: SourcePiece, plan: ColumnPlan, start: int, stop: int
) -> Iterator[SourceRow]:
    """Items ``start`` to ``stop`` of one LitData chunk."""
    root = Path(source.root)
    config = _index(root)["config"]
    formats = config["data_format"]
    position = {name: i for i, name in enumerate(_leaf_names(root, config))}
    data = Path(piece.path).read_bytes()
    if data.endswith(_ARROW_MAGIC):  # rows as a trailing Arrow IPC file
        yield from _arrow_rows(data, plan, start, stop)
        return
    if config.get("compression") == "zstd":
        import zstandard

        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    count = struct.unpack_from("<I", data)[0]
    offsets = np.frombuffer(data, "<u4", count + 1, 4).tolist()
    view = memoryview(data)
    leaves = len(formats)
    for item in range(start, stop):
        at = offsets[item]
        sizes = struct.unpack_from(f"<{leaves}I", data, at)
        at += 4 * leaves
        what = f"item {item} of {Path(piece.path).name!r}"
        spans = record_spans(view, at, sizes, offsets[item + 1], what=what, source=str(root))
        members = tuple(spans[position[name]] for _, name in plan.members)
        values = tuple(
            _VALUES[formats[position[name]]](spans[position[name]]) for name in plan.attributes
        )
        key = None
        if plan.key is not None:
            i = position[plan.key]
            key = _VALUES[formats[i]](spans[i]) if formats[i] in _VALUES else bytes(spans[i])
        yield SourceRow(key=key, members=members, attributes=values)
