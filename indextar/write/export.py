"""Export indexes for other readers: NVIDIA DALI's ``wds2idx`` files and wids shard lists.

Both are written from the indexes, without reading the shards again.

DALI's webdataset reader takes one text index per shard, as written by its
``tools/wds2idx.py`` (format ``v1.2``)::

    v1.2 <number of samples>
    <ext> <data offset> <size> <name> [<ext> <data offset> <size> <name> ...]

one line per sample, one ``ext offset size name`` group per member, separated by
single spaces. Offsets are those of the members' data, so multiples of 512.
Because fields are space-separated, names with whitespace cannot be exported.

A wids shard list is an indextar manifest (:mod:`indextar.index.manifest`), which is a
superset of it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..atomic import write_atomic
from ..errors import ExportError
from ..index.manifest import write_manifest
from ..index.members import MemberTable, load_members
from ..index.opener import usable_index
from ..index.shard import PathLike

__all__ = ["DALI_VERSION", "dali_index_text", "dali_index_name", "export_dali", "export_wids"]

DALI_VERSION = "v1.2"


def dali_index_name(shard: PathLike) -> str:
    """The index file name ``wds2idx`` gives a shard: its name up to the first dot, ``.idx``.

    The first character is never taken as that dot (``.hidden.tar`` gives ``.hidden.idx``).
    """
    name = Path(shard).name
    dot = name.find(".", 1)
    return (name if dot < 0 else name[:dot]) + ".idx"


def dali_index_text(table: MemberTable) -> str:
    """The ``wds2idx`` v1.2 index of one shard.

    Raises
    ------
    ExportError
        If a member name contains whitespace, which the format cannot represent.
    """
    lines = [f"{DALI_VERSION} {len(table)}"]
    for sample in range(len(table)):
        fields = []
        for member in table.members_of(sample):
            name = table.names[member]
            if len(name.split()) != 1:
                raise ExportError(
                    f"shard {table.shard!r}: member {name!r} has whitespace in its name; DALI's "
                    "index format separates fields with spaces"
                )
            fields.append(
                f"{table.raw_ext(member, sample)} {int(table.data_offsets[member])} "
                f"{int(table.sizes[member])} {name}"
            )
        lines.append(" ".join(fields))
    return "\n".join(lines) + "\n"


def export_dali(
    shards: Sequence[PathLike], outdir: PathLike, *, index_dir: PathLike | None = None
) -> list[Path]:
    """Write a DALI index for each shard into ``outdir``; return the paths written.

    Local shards' indexes are built first where missing; a URL's must exist.

    Raises
    ------
    ExportError
        If two shards would get the same index file name, or a name has whitespace.
    """
    folder = Path(outdir)
    targets = [folder / dali_index_name(shard) for shard in shards]
    if len(set(targets)) < len(targets):
        seen: dict[Path, PathLike] = {}
        for shard, target in zip(shards, targets):
            if target in seen:
                raise ExportError(
                    f"shards {os.fspath(seen[target])!r} and {os.fspath(shard)!r} would both "
                    f"get the DALI index {str(target)!r}"
                )
            seen[target] = shard
    folder.mkdir(parents=True, exist_ok=True)
    for shard, target in zip(shards, targets):
        text = dali_index_text(load_members(usable_index(shard, index_dir=index_dir)))
        write_atomic(target, text)
    return targets


def export_wids(
    shards: Sequence[PathLike],
    path: PathLike,
    *,
    index_dir: PathLike | None = None,
    name: str | None = None,
) -> Path:
    """Write a wids shard list (an indextar manifest) of ``shards`` to ``path``."""
    indexes = [usable_index(shard, index_dir=index_dir) for shard in shards]
    return write_manifest(path, indexes, name=name)
