"""Shards written by GNU tar itself, and GNU tar's verdict on the shards indextar refuses."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from readers import indexed_samples, wds_samples
from tarcraft import (
    BLOCK,
    GNU_TAR,
    Crafter,
    gnu_tar,
    gnu_tar_list,
    octal,
    scanned_members,
    tarfile_members,
    write_tree,
)

from indextar import (
    ShardFormatError,
    UnsupportedMemberError,
    build_index,
    open_index,
    scan_tar,
)

# Every test here runs with the C walker and with the numpy scanner (conftest).
pytestmark = [
    pytest.mark.usefixtures("scanner"),
    pytest.mark.skipif(not os.path.exists(GNU_TAR), reason="GNU tar is not installed"),
]

TREE: dict[str, bytes | str | None] = {
    "shard/": None,
    "shard/s0001.jpg": b"\xff\xd8jpeg" * 50,
    "shard/s0001.cls": b"1",
    "shard/s0001.seg.png": b"png",
    "shard/s0002.JPG": b"",
    "shard/s0002.json": b'{"a": 1}',
    "shard/sub/": None,
    "shard/sub/s0003.txt": b"x" * 100_000,
    "shard/sub/link.txt": "->s0003.txt",
    "shard/sub/hard.jpg": "=>shard/s0001.jpg",
    "shard/__meta__": b"skipped",
    "shard/.hidden.jpg": b"webdataset key 'shard/'",
    "shard/README": b"no extension",
    "shard/ünï/日本語.txt": b"UTF-8",
    "shard/" + "p" * 60 + "/" + "q" * 60 + ".jpg": b"needs the ustar prefix",
}
LONG: dict[str, bytes | str | None] = {
    "shard/" + "l" * 120 + ".jpg": b"GNU L or PAX path",
    "shard/" + "m" * 200 + "/x.cls": b"long folder",
    "shard/longlink.txt": "->" + "t" * 150,
}
FORMATS = {
    "gnu": {**TREE, **LONG},
    "pax": {**TREE, **LONG},
    "ustar": TREE,
    "v7": {k: v for k, v in TREE.items() if len(k) < 100},
}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    roots = {}
    for fmt, files in FORMATS.items():
        root = tmp_path_factory.mktemp(f"tree-{fmt}")
        write_tree(root, files)
        roots[fmt] = root
    return roots


def make(trees: dict[str, Path], fmt: str, tmp_path: Path, *options: str) -> Path:
    archive = tmp_path / f"{fmt}.tar"
    return gnu_tar(archive, trees[fmt], ["shard"], f"--format={fmt}", *options)


@pytest.mark.parametrize("options", [(), ("--sort=name",), ("--sort=name", "-b", "1")])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gnu_tar_shards(
    fmt: str, options: tuple[str, ...], trees: dict[str, Path], tmp_path: Path
) -> None:
    path = make(trees, fmt, tmp_path, *options)
    buf = path.read_bytes()
    scan = scan_tar(buf, shard=str(path))
    # Offsets and sizes as Python's tarfile sees them, names as GNU tar lists them.
    assert scanned_members(scan) == tarfile_members(buf)
    listing = gnu_tar_list(path)
    assert listing.returncode == 0, listing.stderr
    assert scan.names == listing.stdout.splitlines()
    if "-b" in options:
        assert len(buf) % BLOCK == 0 and len(buf) - scan.end_offset == 2 * BLOCK
    else:
        assert len(buf) % (20 * BLOCK) == 0  # GNU record padding
    # Samples exactly as webdataset reads them, through the built index.
    assert indexed_samples(path) == wds_samples(buf)
    index = open_index(path)
    kinds = index.skipped_counts()
    assert kinds["directory"] >= 2 and kinds["symlink"] >= 1 and kinds["hardlink"] == 1
    # Meta names only count at the start of the path: shard/__meta__ has no extension.
    assert "meta" not in kinds and kinds["no-extension"] == 2
    assert "shard/" in index.keys()  # from shard/.hidden.jpg, as in webdataset


@pytest.fixture(scope="module")
def dense_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Creating files is slow on some filesystems: one tree, shared by the formats.
    root = tmp_path_factory.mktemp("dense")
    write_tree(root, {f"d/{i:04d}.{ext}": b"%d" % i * (i % 5) for i in range(400) for ext in "ab"})
    return root


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_gnu_tar_dense_shard(fmt: str, dense_tree: Path, tmp_path: Path) -> None:
    path = gnu_tar(tmp_path / "dense.tar", dense_tree, ["d"], f"--format={fmt}", "--sort=name")
    buf = path.read_bytes()
    scan = scan_tar(buf)
    assert scanned_members(scan) == tarfile_members(buf)
    assert len(scan) == 801 and len(build_index(path)) == 400


def test_incremental_dumpdir_entries_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_tree(root, {"d/": None, "d/a.jpg": b"a", "d/e/": None, "d/e/b.jpg": b"b"})
    snapshot = tmp_path / "snapshot"
    path = gnu_tar(
        tmp_path / "incr.tar", root, ["d"], "--format=gnu", f"--listed-incremental={snapshot}"
    )
    # tarfile would read the dumpdir's atime/ctime fields as a ustar prefix; GNU tar
    # (and indextar) do not.
    assert scan_tar(path.read_bytes()).names == gnu_tar_list(path).stdout.splitlines()
    index = build_index(path)
    assert index.keys() == ["d/a", "d/e/b"]
    assert index.skipped_counts() == {"type-'D'": 2}


# -- sparse files -----------------------------------------------------------------------


@pytest.fixture
def sparse_tree(tmp_path: Path) -> Path:
    root = tmp_path / "sparse-root"
    root.mkdir()
    (root / "a.jpg").write_bytes(b"dense")
    with open(root / "holes.bin", "wb") as f:
        f.write(b"head")
        f.seek(4 * 1024 * 1024)
        f.write(b"tail")
    if os.stat(root / "holes.bin").st_blocks * 512 >= 4 * 1024 * 1024:
        pytest.skip(f"the filesystem under {root} has no sparse files, so tar --sparse stores none")
    return root


@pytest.mark.parametrize(
    "options",
    [
        ("--format=gnu",),
        ("--format=pax", "--sparse-version=0.0"),
        ("--format=pax", "--sparse-version=0.1"),
        ("--format=pax", "--sparse-version=1.0"),
    ],
    ids=["gnu", "pax-0.0", "pax-0.1", "pax-1.0"],
)
def test_sparse_members_are_refused(
    options: tuple[str, ...], sparse_tree: Path, tmp_path: Path
) -> None:
    path = gnu_tar(
        tmp_path / "sparse.tar", sparse_tree, ["a.jpg", "holes.bin"], "--sparse", *options
    )
    with pytest.raises(UnsupportedMemberError, match="sparse") as e:
        build_index(path)
    assert repr(str(path)) in str(e.value) and "holes.bin" in str(e.value)
    assert e.value.offset is not None and e.value.offset > 0
    assert f"at byte offset {e.value.offset}" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sparse-root", "sparse.tar"]


# -- GNU tar agrees with what indextar refuses or accepts ----------------------------------


def checked_by_both(tmp_path: Path, buf: bytes) -> tuple[bool, bool, str]:
    """(GNU tar lists it cleanly, indextar scans it, GNU tar's complaints)."""
    path = tmp_path / "case.tar"
    path.write_bytes(buf)
    listing = gnu_tar_list(path)
    try:
        scan_tar(buf)
        ours = True
    except ShardFormatError:
        ours = False
    return listing.returncode == 0, ours, listing.stderr


def good_tar(n: int = 20) -> tuple[bytes, list[int]]:
    crafter = Crafter()
    for i in range(n):
        crafter.member(f"s{i:03d}.jpg", bytes([i]) * (300 + 40 * i))
    return crafter.finish(record=20 * BLOCK), [p.header_offset for p in crafter.placed]


def test_both_refuse_a_bad_checksum_in_the_middle(tmp_path: Path) -> None:
    buf, headers = good_tar()
    bad = bytearray(buf)
    bad[headers[10] + 2] ^= 1
    assert checked_by_both(tmp_path, bytes(bad))[:2] == (False, False)


def test_both_refuse_a_truncated_member(tmp_path: Path) -> None:
    buf, headers = good_tar()
    assert checked_by_both(tmp_path, buf[: headers[-1] + BLOCK + 100])[:2] == (False, False)


def test_both_refuse_a_bad_octal_size(tmp_path: Path) -> None:
    crafter = Crafter().member("a.jpg", b"a").member("b.jpg", b"", size_field=b"0000000001x\0")
    assert checked_by_both(tmp_path, crafter.finish())[:2] == (False, False)


def test_both_accept_a_lone_zero_block(tmp_path: Path) -> None:
    buf, _ = good_tar(3)
    end = scan_tar(buf).end_offset
    gnu_ok, ours, stderr = checked_by_both(tmp_path, buf[: end + BLOCK])
    assert (gnu_ok, ours) == (True, True) and "lone zero block" in stderr


def test_both_accept_base256_sizes(tmp_path: Path) -> None:
    from tarcraft import base256

    crafter = Crafter().member("a.jpg", b"a" * 1000, size_field=base256(1000), magic="gnu")
    assert checked_by_both(tmp_path, crafter.finish())[:2] == (True, True)


def test_gnu_header_atime_is_not_a_name_prefix(tmp_path: Path) -> None:
    crafter = Crafter().member("c.jpg", b"c", magic="gnu", prefix=octal(1_700_000_000, 12))
    path = tmp_path / "atime.tar"
    path.write_bytes(crafter.finish())
    assert gnu_tar_list(path).stdout.splitlines() == scan_tar(path.read_bytes()).names == ["c.jpg"]


def test_data_after_the_end_marker_is_stricter_than_gnu_tar(tmp_path: Path) -> None:
    # GNU tar stops reading at the end marker; indextar refuses what follows, because
    # a zeroed header mid-archive would otherwise hide every later member.
    buf, headers = good_tar()
    bad = bytearray(buf)
    bad[headers[5] : headers[5] + 2 * BLOCK] = bytes(2 * BLOCK)
    gnu_ok, ours, _ = checked_by_both(tmp_path, bytes(bad))
    assert (gnu_ok, ours) == (True, False)
    assert shutil.which(GNU_TAR)
