"""Compare two index files by content: every table row, and the meta except build time;
and read an index's samples and members as flat arrays, for tests to check offsets."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from indextar.index.shard import ShardIndex, build_index

TABLES = ("members", "samples", "skipped", "arrays")


def index_rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table, and the meta without ``created``."""
    conn = sqlite3.connect(path)
    try:
        rows = {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in TABLES}
        rows["meta"] = conn.execute(
            "SELECT key, value FROM meta WHERE key != 'created' ORDER BY key"
        ).fetchall()
    finally:
        conn.close()
    return rows


def assert_index_matches_scan(shard: Path, written_index: Path, scratch: Path) -> None:
    """The index written alongside ``shard`` equals the one a fresh scan builds."""
    rebuilt = build_index(shard, index_dir=scratch, force=True)
    assert index_rows(written_index) == index_rows(rebuilt.path)


@dataclass(frozen=True, slots=True)
class SampleTable:
    """Per-sample and per-member arrays of one shard's index, with members' absolute
    data offsets: a sample's members are rows ``first_member[i] : first_member[i] +
    member_count[i]``. (What ``ShardIndex.load_samples`` returned before issue 24.)"""

    first_member: npt.NDArray[np.int64]
    member_count: npt.NDArray[np.int64]
    start_offset: npt.NDArray[np.int64]
    end_offset: npt.NDArray[np.int64]
    member_data_offset: npt.NDArray[np.int64]
    member_size: npt.NDArray[np.int64]
    member_ext_code: npt.NDArray[np.int32]
    ext_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.first_member)


def load_samples(index: ShardIndex) -> SampleTable:
    """``index``'s arrays (:meth:`ShardIndex.load_arrays`, what the dataset reads) as a
    :class:`SampleTable`."""
    arrays = index.load_arrays()
    samples, members = arrays.samples, arrays.members
    start_offset = np.ascontiguousarray(samples[:, 0])
    member_count = np.ascontiguousarray(samples[:, 3])
    return SampleTable(
        first_member=np.ascontiguousarray(samples[:, 2]),
        member_count=member_count,
        start_offset=start_offset,
        end_offset=np.ascontiguousarray(samples[:, 1]),
        member_data_offset=members[:, 0] + np.repeat(start_offset, member_count),
        member_size=np.ascontiguousarray(members[:, 1]),
        member_ext_code=members[:, 2].astype(np.int32),
        ext_names=arrays.ext_names,
    )
