"""The packed reader arrays in an index: equal to the tables, optional, checked by verify."""

from __future__ import annotations

import contextlib
import sqlite3
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import sample_members
from indexrows import load_samples

from indextar import IndexedTarDataset, IndexFormatError, build_index, open_index
from indextar.index.arrays import arrays_from_tables, read_arrays
from indextar.index.verify import verify_index

MEMBERS = {
    **sample_members(20, ("jpg", "cls", "json")),
    "d/": None,
    "README": b"skip me",
    "ünï/ключ.SEG.png": b"non-ASCII key, upper-case extension",
    "ünï/ключ.cls": b"7",
    "empty-ext.": b"an empty extension",
}


@pytest.fixture
def shard(make_tar) -> Path:  # type: ignore[no-untyped-def]
    return make_tar(MEMBERS, name="data-000000.tar", fmt="pax")


def edit(path: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(sql, params)


def test_stored_arrays_equal_the_tables(shard: Path) -> None:
    index = build_index(shard)
    with contextlib.closing(index.connect()) as conn:
        stored = read_arrays(conn, index.path, index.meta.num_samples, index.meta.num_members)
        derived = arrays_from_tables(conn)
    assert stored is not None and stored.equals(derived)
    assert stored.ext_names == ("", "cls", "jpg", "json", "seg.png")
    keys = [stored.key_blob[start:end].decode() for start, end in stored.samples[:, 4:6].tolist()]
    assert keys == index.keys()


def test_an_index_without_arrays_is_read_from_its_tables(shard: Path) -> None:
    index = build_index(shard)
    expected = load_samples(index)
    with_arrays = [IndexedTarDataset([shard])[i] for i in range(len(index))]
    edit(index.path, "DROP TABLE arrays")
    table = load_samples(open_index(shard))
    for field in ("first_member", "member_count", "start_offset", "end_offset"):
        assert np.array_equal(getattr(table, field), getattr(expected, field))
    assert np.array_equal(table.member_data_offset, expected.member_data_offset)
    assert table.ext_names == expected.ext_names
    assert [IndexedTarDataset([shard])[i] for i in range(len(index))] == with_arrays
    report = verify_index(shard)
    assert report.ok and any("no arrays table" in warning for warning in report.warnings)


def test_verify_finds_arrays_that_disagree_with_the_tables(shard: Path) -> None:
    index = build_index(shard)
    assert verify_index(shard).ok and not verify_index(shard).warnings
    members = open_index(shard).load_arrays().members.copy()
    members[5, 1] += 1  # one member's size
    edit(index.path, "UPDATE arrays SET data = ? WHERE name = 'members'", (members.tobytes(),))
    report = verify_index(shard)
    assert report.problems == [
        "arrays: the packed arrays disagree with the samples and members tables"
    ]


def test_arrays_of_the_wrong_size_are_refused(shard: Path) -> None:
    index = build_index(shard)
    edit(index.path, "UPDATE arrays SET data = substr(data, 9) WHERE name = 'samples'")
    with pytest.raises(IndexFormatError, match="has arrays of 21 samples"):
        open_index(shard).load_arrays()
    assert not verify_index(shard).ok


def test_the_keys_are_read_alone_from_their_lengths(make_tar) -> None:  # type: ignore[no-untyped-def]
    long_key = "k" * 300  # a length over 255: two bytes each
    shard = make_tar({**MEMBERS, f"{long_key}.cls": b"1"}, name="long.tar", fmt="pax")
    index = build_index(shard)
    arrays = index.load_arrays()
    keys = index.load_keys()
    assert keys.blob == arrays.key_blob and keys.ext_names == arrays.ext_names
    assert np.array_equal(np.stack([keys.starts, keys.ends], 1), arrays.samples[:, 4:6])
    with contextlib.closing(index.connect()) as conn:
        (dtype,) = conn.execute("SELECT dtype FROM arrays WHERE name = 'key_lengths'").fetchone()
    assert dtype == "<u2"
    lengths = (arrays.samples[:, 5] - arrays.samples[:, 4]).astype("<u2")
    lengths[3] += 1  # one key a byte longer, the next one a byte shorter
    lengths[4] -= 1
    edit(index.path, "UPDATE arrays SET data = ? WHERE name = 'key_lengths'", (lengths.tobytes(),))
    assert verify_index(shard).problems == [
        "arrays: the key lengths disagree with the samples table"
    ]
    edit(index.path, "UPDATE arrays SET data = substr(data, 3) WHERE name = 'key_lengths'")
    with pytest.raises(IndexFormatError, match="has 22 key lengths"):
        open_index(shard).load_keys()
    assert not verify_index(shard).ok
    edit(index.path, "DELETE FROM arrays WHERE name = 'key_lengths'")  # an older index
    older = open_index(shard).load_keys()
    assert older.blob == keys.blob and np.array_equal(older.ends, keys.ends)
    assert verify_index(shard).ok
    edit(index.path, "DELETE FROM arrays")  # older still: no arrays, only the tables
    oldest = open_index(shard).load_keys()
    assert oldest.blob == keys.blob and np.array_equal(oldest.ends, keys.ends)


def test_opening_a_shard_leaves_its_key_lengths_unread(shard: Path) -> None:
    """read_arrays (every open of a shard for reading) reads the rows a reader uses: a
    join's key_lengths row is read only by load_keys."""
    index = build_index(shard)
    big = 32 << 20  # a key_lengths row this large would show in the open's peak
    edit(index.path, "UPDATE arrays SET data = zeroblob(?) WHERE name = 'key_lengths'", (big,))
    with contextlib.closing(index.connect()) as conn:
        tracemalloc.start()
        try:
            arrays = read_arrays(conn, index.path, index.meta.num_samples, index.meta.num_members)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert arrays is not None and len(arrays.samples) == index.meta.num_samples
    assert peak < big // 4, peak
