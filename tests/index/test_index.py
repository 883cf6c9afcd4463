"""One SQLite index per shard: build, open, inspect, staleness, corrupt files, races."""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import shutil
import sqlite3
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from conftest import FORMATS, sample_members, tar_bytes
from indexrows import load_samples

from indextar import (
    IndexFormatError,
    IndexWriteError,
    MissingIndexError,
    ShardNotFoundError,
    StaleIndexError,
    build_index,
    index_path,
    open_index,
)
from indextar.index.meta import FORMAT_VERSION

MEMBERS = {**sample_members(50, ("jpg", "cls", "json")), "d/": None, "README": b"skip me"}


@pytest.fixture
def shard(make_tar) -> Path:  # type: ignore[no-untyped-def]
    return make_tar(MEMBERS, name="data-000000.tar", fmt="gnu")


def only_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- build and open --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_agrees_with_tarfile(fmt: str, make_tar) -> None:  # type: ignore[no-untyped-def]
    path = make_tar(MEMBERS, fmt=fmt)
    built = build_index(path)
    opened = open_index(path)
    assert opened.meta == built.meta and len(opened) == 50
    table = load_samples(opened)
    with tarfile.open(path) as tf:
        regular = [m for m in tf.getmembers() if m.isreg() and m.name != "README"]
    assert table.member_data_offset.tolist() == [m.offset_data for m in regular]
    assert table.member_size.tolist() == [m.size for m in regular]
    assert [table.ext_names[c] for c in table.member_ext_code] == [
        m.name.split(".", 1)[1] for m in regular
    ]
    assert table.first_member.tolist() == list(range(0, 150, 3))
    assert table.member_count.tolist() == [3] * 50
    assert table.start_offset.tolist() == [regular[i].offset for i in range(0, 150, 3)]
    assert opened.keys() == [f"s{i:06d}" for i in range(50)]
    for array in (
        table.first_member,
        table.start_offset,
        table.member_data_offset,
        table.member_size,
    ):
        assert array.dtype == np.int64


def test_a_samples_byte_range_is_a_tar_of_its_members(shard: Path) -> None:
    index = build_index(shard)
    table = load_samples(index)
    data = shard.read_bytes()
    for i in (0, 17, 49):
        piece = data[table.start_offset[i] : table.end_offset[i]] + bytes(1024)
        with tarfile.open(fileobj=io.BytesIO(piece)) as tf:
            names = [m.name for m in tf.getmembers()]
            assert names == [f"s{i:06d}.{ext}" for ext in ("jpg", "cls", "json")]
            assert tf.extractfile(names[0]).read() == MEMBERS[names[0]]  # type: ignore[union-attr]


def test_long_names_keep_their_extension_headers_in_the_sample_range(make_tar) -> None:  # type: ignore[no-untyped-def]
    members = {"x" * 150 + ".jpg": b"1", "x" * 150 + ".cls": b"2", "y.jpg": b"3"}
    for fmt in ("gnu", "pax"):
        path = make_tar(members, name=f"long-{fmt}.tar", fmt=fmt)
        table = load_samples(build_index(path))
        data = path.read_bytes()
        piece = data[table.start_offset[0] : table.end_offset[0]] + bytes(1024)
        with tarfile.open(fileobj=io.BytesIO(piece)) as tf:
            assert tf.getnames() == list(members)[:2]


def test_index_sits_next_to_the_shard(shard: Path) -> None:
    index = build_index(shard)
    assert index.path == shard.parent / "data-000000.tar.idx.sqlite"
    assert index_path(shard) == index.path
    assert only_files(shard.parent) == ["data-000000.tar", "data-000000.tar.idx.sqlite"]


def test_index_dir(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "x.tar", tmp_path / "b" / "x.tar"
    for path, n in ((a, 3), (b, 5)):
        path.parent.mkdir()
        path.write_bytes(tar_bytes(sample_members(n)))
    folder = tmp_path / "indexes" / "nested"
    ia, ib = build_index(a, index_dir=folder), build_index(b, index_dir=folder)
    assert ia.path.parent == folder and ia.path != ib.path  # same name, no collision
    assert ia.path.name.startswith("x.tar.") and ia.path.name.endswith(".idx.sqlite")
    assert (len(open_index(a, index_dir=folder)), len(open_index(b, index_dir=folder))) == (3, 5)
    assert only_files(a.parent) == ["x.tar"]  # nothing written next to the shard
    with pytest.raises(MissingIndexError, match="build_index"):
        open_index(a)


def test_index_dir_that_cannot_be_a_folder(shard: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_bytes(b"")
    with pytest.raises(IndexWriteError, match="index_dir="):
        build_index(shard, index_dir=blocker)


def test_build_reuses_a_valid_index(shard: Path) -> None:
    first = build_index(shard)
    stamp = first.path.stat().st_mtime_ns
    inode = first.path.stat().st_ino
    again = build_index(shard)
    assert again.meta == first.meta
    assert (first.path.stat().st_mtime_ns, first.path.stat().st_ino) == (stamp, inode)
    forced = build_index(shard, force=True)
    assert forced.path.stat().st_ino != inode  # a new file, renamed into place


def test_missing_index_and_missing_shard(tmp_path: Path, shard: Path) -> None:
    with pytest.raises(MissingIndexError, match=repr(str(shard))):
        open_index(shard)
    with pytest.raises(ShardNotFoundError, match="nope.tar"):
        build_index(tmp_path / "nope.tar")
    with pytest.raises(ShardNotFoundError):
        build_index(tmp_path)  # a folder


def test_shard_index_pickles_and_queries(shard: Path) -> None:
    index = pickle.loads(pickle.dumps(build_index(shard)))
    assert index.extension_counts() == {"cls": 50, "jpg": 50, "json": 50}
    assert index.skipped_counts() == {"directory": 1, "no-extension": 1}
    assert index.find_key("s000007") == [7] and index.find_key("nope") == []
    assert index.scattered_keys() == []
    assert index.data_bytes() == sum(
        len(v) for k, v in MEMBERS.items() if isinstance(v, bytes) and "." in k
    )


def test_meta_records_the_shard(shard: Path) -> None:
    meta = build_index(shard).meta
    st = shard.stat()
    assert (meta.shard_size, meta.shard_mtime_ns, meta.shard_name) == (
        st.st_size,
        st.st_mtime_ns,
        shard.name,
    )
    assert (meta.num_members, meta.num_samples, meta.num_skipped) == (150, 50, 2)
    assert meta.format_version == FORMAT_VERSION and meta.naming == "webdataset-1"
    assert meta.end_offset < st.st_size and len(meta.fingerprint) == 32


# -- inspectable with ordinary tools ---------------------------------------------------


def test_inspectable_with_sqlite3_and_sqlite_utils(shard: Path) -> None:
    path = build_index(shard).path
    sqlite3_cli = shutil.which("sqlite3")
    assert sqlite3_cli, "the sqlite3 command-line tool is needed to check this"
    out = subprocess.run(
        [
            sqlite3_cli,
            "-readonly",
            str(path),
            "SELECT COUNT(*) FROM samples; SELECT value FROM meta WHERE key='num_members';",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["50", "150"]

    import sqlite_utils

    db = sqlite_utils.Database(path)
    try:
        # frames and seek_points (format 3) stay empty for a plain tar
        assert set(db.table_names()) == {
            "meta",
            "members",
            "samples",
            "skipped",
            "arrays",
            "frames",
            "seek_points",
        }
        assert db["frames"].count == 0 and db["seek_points"].count == 0
        assert [c.name for c in db["members"].columns] == [
            "member_id",
            "sample_id",
            "name",
            "ext",
            "header_offset",
            "data_offset",
            "size",
            "raw_name",
        ]
        assert [c.name for c in db["samples"].columns] == [
            "sample_id",
            "key",
            "first_member",
            "member_count",
            "start_offset",
            "end_offset",
            "raw_key",
        ]
        assert [c.name for c in db["skipped"].columns] == [
            "header_offset",
            "name",
            "kind",
            "size",
            "raw_name",
        ]
        assert [c.name for c in db["meta"].columns] == ["key", "value"]
        assert [c.name for c in db["arrays"].columns] == ["name", "dtype", "columns", "data"]
        row = next(db["members"].rows_where("name = ?", ["s000003.cls"]))
        assert (row["sample_id"], row["ext"], row["size"]) == (
            3,
            "cls",
            len(MEMBERS["s000003.cls"]),
        )
        skipped = {r["name"]: r["kind"] for r in db["skipped"].rows}
        assert skipped == {"d/": "directory", "README": "no-extension"}
    finally:
        db.close()


# -- staleness -------------------------------------------------------------------------


def test_size_change(shard: Path) -> None:
    build_index(shard)
    with open(shard, "ab") as f:
        f.write(bytes(512))
    with pytest.raises(StaleIndexError, match="size changed") as e:
        open_index(shard)
    assert repr(str(shard)) in str(e.value) and "force=True" in str(e.value)
    with pytest.raises(StaleIndexError):
        build_index(shard)  # not silently rebuilt
    assert build_index(shard, force=True).meta.shard_size == shard.stat().st_size
    open_index(shard)


def test_mtime_change(shard: Path) -> None:
    build_index(shard)
    st = shard.stat()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(StaleIndexError, match="mtime changed") as e:
        open_index(shard)
    assert repr(str(shard)) in str(e.value) and "size" not in str(e.value)


@pytest.mark.parametrize("where", ["start", "end"])
def test_same_size_content_change_with_the_mtime_put_back(shard: Path, where: str) -> None:
    build_index(shard)
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    # A member's data byte: still a valid tar of the same size.
    offset = 512 + 3 if where == "start" else load_samples(open_index(shard)).member_data_offset[-1]
    data[offset] ^= 0x20
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(StaleIndexError, match="fingerprint") as e:
        open_index(shard)
    assert repr(str(shard)) in str(e.value)
    assert build_index(shard, force=True).meta.fingerprint != ""
    open_index(shard)


# -- unusable index files --------------------------------------------------------------


def ratarmount_index(shard: Path, path: Path) -> None:
    from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar

    archive = SQLiteIndexedTar(str(shard), indexFilePath=str(path), writeIndex=True, printDebug=0)
    archive.__exit__(None, None, None)


def set_meta(path: Path, key: str, value: str) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))
    conn.close()


def drop_table(path: Path, table: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"DROP TABLE {table}")
    conn.close()


CORRUPTIONS = {
    "garbage": (lambda shard, path: path.write_bytes(os.urandom(3000)), "not an indextar index"),
    "empty file": (lambda shard, path: path.write_bytes(b""), "not an indextar index"),
    "truncated sqlite": (
        lambda shard, path: path.write_bytes(path.read_bytes()[:1500]),
        "not an indextar index",
    ),
    "ratarmount index": (ratarmount_index, "not an indextar index"),
    "newer format": (
        lambda shard, path: set_meta(path, "format_version", "99"),
        "format version 99",
    ),
    "older format": (lambda shard, path: set_meta(path, "format_version", "0"), "format version 0"),
    "garbled format": (lambda shard, path: set_meta(path, "format_version", "one"), "format"),
    "garbled count": (lambda shard, path: set_meta(path, "num_samples", "many"), "metadata"),
    "other naming": (lambda shard, path: set_meta(path, "naming", "other-2"), "naming rules"),
    "missing table": (lambda shard, path: drop_table(path, "samples"), "not an indextar index"),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_unusable_index_is_refused_then_replaced(case: str, shard: Path) -> None:
    corrupt, message = CORRUPTIONS[case]
    path = index_path(shard)
    if case != "ratarmount index":
        build_index(shard)
    corrupt(shard, path)
    with pytest.raises(IndexFormatError, match=message) as e:
        open_index(shard)
    assert repr(str(path)) in str(e.value)
    rebuilt = build_index(shard)  # replaces it without force
    assert len(rebuilt) == 50 and len(open_index(shard)) == 50
    assert only_files(shard.parent) == ["data-000000.tar", "data-000000.tar.idx.sqlite"]


# -- concurrency -----------------------------------------------------------------------


def _build_in_child(shard: str, barrier: object, rounds: int) -> int:
    barrier.wait()  # type: ignore[attr-defined]
    total = 0
    for _ in range(rounds):
        total += len(build_index(shard, force=True))
    return total


def test_two_processes_building_the_same_shard(tmp_path: Path) -> None:
    shard = tmp_path / "race.tar"
    shard.write_bytes(tar_bytes(sample_members(2000, ("jpg", "cls"))))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(2) as pool:
        barrier = manager.Barrier(2)
        results = [pool.apply_async(_build_in_child, (str(shard), barrier, 3)) for _ in range(2)]
        assert [r.get(timeout=120) for r in results] == [3 * 2000, 3 * 2000]
    index = open_index(shard)
    assert len(index) == 2000 and len(load_samples(index).member_size) == 4000
    assert only_files(tmp_path) == ["race.tar", "race.tar.idx.sqlite"]  # no temporary files


def test_readers_never_see_a_partial_index(tmp_path: Path) -> None:
    # Rebuild in a child while this process opens the index over and over.
    shard = tmp_path / "busy.tar"
    shard.write_bytes(tar_bytes(sample_members(2000)))
    build_index(shard)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(1) as pool:
        barrier = manager.Barrier(2)
        job = pool.apply_async(_build_in_child, (str(shard), barrier, 6))
        barrier.wait()
        opened = 0
        while not job.ready():
            assert len(load_samples(open_index(shard))) == 2000
            opened += 1
        assert job.get() == 6 * 2000
    assert opened > 0
