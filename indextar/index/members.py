"""Every member of one shard with its name and offsets, grouped into samples.

What resharding, the exports and ``indextar ls``/``cat`` read: the rows of an index
(:func:`load_members`), or of an in-memory scan of a shard that has no index
(:func:`scan_members`). Per-member columns are plain lists and arrays, loaded
whole; this is a tool-side view, not the dataset's hot path.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .localscan import scan_shard_file
from .meta import connect_readonly
from .naming import from_sql, split_name
from .shard import ShardIndex
from .tables import sample_spans

__all__ = ["MemberTable", "load_members", "scan_members"]


@dataclass(frozen=True, slots=True)
class MemberTable:
    """The samples and members of one shard.

    Attributes
    ----------
    shard
        The shard's path.
    keys, first_member, member_count, start_offset, end_offset
        Per sample: its key, its members ``first_member[i] : first_member[i] +
        member_count[i]``, and its byte span ``[start_offset, end_offset)``, itself a
        valid tar stream of its members.
    names, exts, header_offsets, data_offsets, sizes
        Per member: full name, lowercased extension, first header block, data offset
        and data size.
    """

    shard: str
    keys: list[str]
    first_member: npt.NDArray[np.int64]
    member_count: npt.NDArray[np.int64]
    start_offset: npt.NDArray[np.int64]
    end_offset: npt.NDArray[np.int64]
    names: list[str]
    exts: list[str]
    header_offsets: npt.NDArray[np.int64]
    data_offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.keys)

    def members_of(self, sample: int) -> range:
        """Member rows of sample number ``sample``."""
        first = int(self.first_member[sample])
        return range(first, first + int(self.member_count[sample]))

    def raw_ext(self, member: int, sample: int) -> str:
        """Member ``member``'s extension as written in its name (not lowercased)."""
        return self.names[member][len(self.keys[sample]) + 1 :]


def load_members(index: ShardIndex) -> MemberTable:
    """Read every sample and member row of an opened index."""
    with contextlib.closing(connect_readonly(index.path)) as conn:
        samples = conn.execute(
            "SELECT key, first_member, member_count, start_offset, end_offset, raw_key "
            "FROM samples ORDER BY sample_id"
        ).fetchall()
        members = conn.execute(
            "SELECT name, ext, header_offset, data_offset, size, raw_name FROM members "
            "ORDER BY member_id"
        ).fetchall()
    keys = [from_sql(row[0], row[5]) for row in samples]
    names = [from_sql(row[0], row[5]) for row in members]
    # The TEXT ext holds U+FFFD for a byte that was not UTF-8: such a name is split again.
    exts = [str(row[1]) if row[5] is None else _ext(names[i]) for i, row in enumerate(members)]
    sample_columns = np.asarray([row[1:5] for row in samples], dtype=np.int64).reshape(-1, 4)
    member_columns = np.asarray([row[2:5] for row in members], dtype=np.int64).reshape(-1, 3)
    return MemberTable(
        shard=index.shard,
        keys=keys,
        first_member=np.ascontiguousarray(sample_columns[:, 0]),
        member_count=np.ascontiguousarray(sample_columns[:, 1]),
        start_offset=np.ascontiguousarray(sample_columns[:, 2]),
        end_offset=np.ascontiguousarray(sample_columns[:, 3]),
        names=names,
        exts=exts,
        header_offsets=np.ascontiguousarray(member_columns[:, 0]),
        data_offsets=np.ascontiguousarray(member_columns[:, 1]),
        sizes=np.ascontiguousarray(member_columns[:, 2]),
    )


def scan_members(shard: str | Path) -> MemberTable:
    """Scan a local shard in memory, without writing an index."""
    scan, grouping, _, _ = scan_shard_file(Path(shard))
    rows = grouping.entries
    header_offsets = scan.header_offsets[rows]
    data_offsets = scan.data_offsets[rows]
    sizes = scan.sizes[rows]
    start, end = sample_spans(scan, grouping)
    return MemberTable(
        shard=str(shard),
        keys=grouping.keys,
        first_member=grouping.first_member,
        member_count=grouping.member_count,
        start_offset=start,
        end_offset=end,
        names=[scan.names[i] for i in rows.tolist()],
        exts=grouping.exts,
        header_offsets=header_offsets,
        data_offsets=data_offsets,
        sizes=sizes,
    )


def _ext(name: str) -> str:
    split = split_name(name)
    assert split is not None, name  # an indexed member has an extension
    return split[1]
