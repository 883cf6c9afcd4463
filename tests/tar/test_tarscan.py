"""The tar scanner: every member where tarfile (or the crafted layout) says it is."""

from __future__ import annotations

import io
import mmap
import os
import random
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import FORMATS, sample_members, tar_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from indexrows import load_samples
from tarcraft import (
    BLOCK,
    RECORD,
    Crafter,
    Placed,
    base256,
    blocks,
    craft,
    header,
    octal,
    scanned_members,
    tarfile_members,
)

from indextar import ShardFormatError, native, scan_tar
from indextar.tar import blocks as tarbytes
from indextar.tar import scan as tarscan_module
from indextar.tar.scan import TarScan

# Every test here runs with the C walker and with the numpy scanner (conftest).
pytestmark = pytest.mark.usefixtures("scanner")

# -- helpers ---------------------------------------------------------------------------


def scan_file(buf: bytes, folder: Path) -> TarScan:
    """``buf`` scanned as build_index scans a file: a map, headers read with pread."""
    path = folder / "t.tar"
    path.write_bytes(buf)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        scan = scan_tar(mm, shard="t.tar", fd=f.fileno())
        del mm  # the scan holds no view of the map
    return scan


def same_scan(a: TarScan, b: TarScan) -> bool:
    return (
        a.names == b.names
        and a.types.tolist() == b.types.tolist()
        and a.header_offsets.tolist() == b.header_offsets.tolist()
        and a.data_offsets.tolist() == b.data_offsets.tolist()
        and a.sizes.tolist() == b.sizes.tolist()
        and (a.end_offset, a.file_size) == (b.end_offset, b.file_size)
    )


def assert_like_tarfile(buf: bytes) -> TarScan:
    scan = scan_tar(buf, shard="t.tar")
    assert scanned_members(scan) == tarfile_members(buf)
    assert scan.file_size == len(buf)
    with tempfile.TemporaryDirectory() as folder:
        assert same_scan(scan_file(buf, Path(folder)), scan)
    return scan


def assert_placed(scan: TarScan, placed: list[Placed]) -> None:
    assert scan.names == [p.name for p in placed]
    assert scan.header_offsets.tolist() == [p.header_offset for p in placed]
    assert scan.data_offsets.tolist() == [p.data_offset for p in placed]
    assert scan.sizes.tolist() == [p.size for p in placed]


@pytest.fixture
def windows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Start offsets of the windows the vectorised walker accepted (C walker off)."""
    monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
    accepted: list[int] = []
    real = tarscan_module.Scanner.walk_window

    def spy(self: tarscan_module.Scanner, start: int) -> tuple[object, int]:
        result = real(self, start)
        if result[0] is not None:
            accepted.append(start)
        return result

    monkeypatch.setattr(tarscan_module.Scanner, "walk_window", spy)
    return accepted


MIXED = {
    "a/": None,
    "a/s0001.jpg": b"\xff\xd8" + bytes(range(256)) * 3,
    "a/s0001.cls": b"7",
    "a/s0001.json": b"{}",
    "a/link.jpg": "->s0001.jpg",
    "empty.txt": b"",
    "one-block.bin": b"x" * 512,
    "block-and-a-bit.bin": b"y" * 513,
    "d" * 97 + ".x": b"99-character name",
    "e" * 98 + ".x": b"100 characters: no NUL after the name",
    "long/" + "p" * 150 + "/name.jpg": b"ustar prefix or long name",
    "q" * 180 + ".txt": b"too long for any ustar split",
    "ünïcödé/日本語.txt": b"UTF-8 names",
    "sub/dir/with.many.dots.tar.gz": b"not really gz",
}


# -- agreement with tarfile ------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_mixed_members_like_tarfile(fmt: str) -> None:
    scan = assert_like_tarfile(tar_bytes(MIXED, fmt))
    assert scan.names[-1] == "sub/dir/with.many.dots.tar.gz"
    assert "q" * 180 + ".txt" in scan.names
    assert scan.kind(0) == "directory" and scan.kind(4) == "symlink"
    assert scan.extension_headers > 0  # long names needed GNU L or PAX headers


def test_ustar_members_like_tarfile() -> None:
    members = {k: v for k, v in MIXED.items() if not k.startswith("q")}  # no ustar split
    buf = tar_bytes(members, "ustar")
    scan = assert_like_tarfile(buf)
    assert scan.extension_headers == 0
    long_name = "long/" + "p" * 150 + "/name.jpg"
    (header_offset,) = [int(o) for o, n in zip(scan.header_offsets, scan.names) if n == long_name]
    assert buf[header_offset + 345 : header_offset + 350] == b"long/"  # really in the prefix


@pytest.mark.parametrize("fmt", FORMATS)
def test_data_offsets_point_at_the_data(fmt: str) -> None:
    members = sample_members(40, ("jpg", "cls", "json"))
    buf = tar_bytes(members, fmt)
    scan = assert_like_tarfile(buf)
    for name, start, size in zip(scan.names, scan.data_offsets.tolist(), scan.sizes.tolist()):
        assert buf[start : start + size] == members[name]
    assert (
        scan.end_offset == tarfile_members(buf)[-1][2] + blocks(members[scan.names[-1]]).__len__()
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_dense_shard_takes_the_vectorised_walk(fmt: str, windows: list[int]) -> None:
    members = sample_members(3000, ("jpg", "cls"))
    buf = tar_bytes(members, fmt)
    scan = assert_like_tarfile(buf)
    assert len(scan) == 6000
    assert windows, "the vectorised walker was never used on a dense shard"


def test_pax_headers_on_every_member_dense(windows: list[int]) -> None:
    # PAX path records on every member: extension headers throughout the windows.
    members = {
        f"ü/{i:05d}.{ext}": bytes([i % 251]) * (i % 700) for i in range(1500) for ext in ("a", "b")
    }
    scan = assert_like_tarfile(tar_bytes(members, "pax"))
    assert scan.extension_headers == 3000
    assert windows


def test_nested_tars_as_member_data(windows: list[int]) -> None:
    # Member data full of real-looking ustar headers must not fool the vectorised walk.
    rng = random.Random(7)
    members: dict[str, bytes | str | None] = {}
    for i in range(400):
        inner = tar_bytes(
            {f"inner{j}.txt": rng.randbytes(rng.randrange(0, 1500)) for j in range(i % 4)}
        )
        members[f"s{i:04d}.tar"] = inner
        members[f"s{i:04d}.cls"] = str(i).encode()
        members[f"s{i:04d}.tiny.tar"] = inner[:BLOCK]  # a lone header block as data
    buf = tar_bytes(members, "gnu")
    scan = assert_like_tarfile(buf)
    assert len(scan) == 1200


def test_nested_tar_agreeing_with_a_pax_size_is_not_followed() -> None:
    # Worst case: the header's own size is 0 (the real one is in a PAX record) and the
    # data is a one-member tar whose chain lands exactly on the next real header.
    crafter = Crafter()
    for i in range(200):
        crafter.member(f"s{i:04d}.txt", b"t" * (i % 40))
    fake = header("fake.bin", BLOCK) + b"F" * BLOCK
    crafter.pax({"size": str(len(fake))}).member("trick.bin", fake, stored_size=0)
    for i in range(200):
        crafter.member(f"z{i:04d}.txt", b"z")
    buf = crafter.finish()
    scan = scan_tar(buf)
    assert_placed(scan, crafter.placed)
    assert scanned_members(scan) == tarfile_members(buf)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    sizes=st.lists(
        st.sampled_from([0, 1, 511, 512, 513, 1024, 2500, 9000, 70_000]), min_size=1, max_size=120
    ),
    window_blocks=st.sampled_from([1, 2, 3, 8, 64]),
)
def test_small_windows_cross_everywhere(sizes: list[int], window_blocks: int) -> None:
    # Tiny windows put window boundaries at headers, inside data and at the end marker.
    rng = random.Random(len(sizes))
    crafter = Crafter()
    for i in range(70):  # past the sequential probe
        crafter.member(f"p{i:03d}.bin", b"p")
    for i, size in enumerate(sizes):
        crafter.member(f"m{i:04d}.bin", rng.randbytes(size))
    buf = crafter.finish(record=RECORD)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tarscan_module, "_WINDOW_BLOCKS", window_blocks)
        scan = scan_tar(buf)
    assert_placed(scan, crafter.placed)


def window_crossing_archive(blocks_before_boundary: int) -> tuple[bytes, list[Placed], int]:
    """An archive whose member ``cross.bin`` has its header ``blocks_before_boundary``
    blocks before the end of the first 32 MiB vectorised window."""
    crafter = Crafter()
    for i in range(tarscan_module._PROBE_HEADERS):
        crafter.member(f"p{i:03d}.txt", b"probe")
    boundary = crafter.length + tarscan_module._WINDOW_BLOCKS * BLOCK
    target = boundary - blocks_before_boundary * BLOCK
    filler = b"f" * (16 * BLOCK)  # 17 blocks with its header
    n = 0
    while target - crafter.length >= 17 * BLOCK + 2 * BLOCK:
        crafter.member(f"f{n:05d}.bin", filler)
        n += 1
    while crafter.length < target:
        left = (target - crafter.length) // BLOCK
        crafter.member(f"g{n:05d}.bin", b"g" if left != 1 else b"")
        n += 1
    assert crafter.length == target
    crafter.member("cross.bin", bytes(range(256)) * 80)  # 40 blocks of data
    for i in range(100):
        crafter.member(f"t{i:03d}.bin", b"t" * (i * 7))
    return crafter.finish(record=RECORD), crafter.placed, boundary


@pytest.mark.parametrize("blocks_before_boundary", [0, 1, 5])
def test_real_32mib_window_boundary(blocks_before_boundary: int, windows: list[int]) -> None:
    buf, placed, boundary = window_crossing_archive(blocks_before_boundary)
    scan = scan_tar(buf)
    assert_placed(scan, placed)
    assert len(windows) >= 2 and windows[0] < boundary <= windows[1]


# -- header variants -------------------------------------------------------------------


def test_base256_sizes_and_fields() -> None:
    crafter = Crafter()
    crafter.member("a.bin", b"A" * 1000, size_field=base256(1000))
    crafter.member("b.bin", b"B" * 7, fields={"mtime": base256(-5), "uid": base256(2**40, 8)})
    crafter.member("c.bin", b"", size_field=base256(0))
    buf = crafter.finish()
    scan = scan_tar(buf)
    assert_placed(scan, crafter.placed)
    assert scanned_members(scan) == tarfile_members(buf)


def test_negative_base256_size_is_refused() -> None:
    buf = Crafter().member("a.bin", b"", size_field=base256(-1)).finish()
    with pytest.raises(ShardFormatError, match="negative size") as e:
        scan_tar(buf, shard="neg.tar")
    assert e.value.offset == 124 and "'neg.tar' at byte offset 124" in str(e.value)


def test_ustar_prefix_field() -> None:
    crafter = Crafter()
    crafter.member("a/b/c.jpg", b"c", header_name="c.jpg", prefix="a/b")
    crafter.member("x" * 155 + "/" + "y" * 99, b"long", header_name="y" * 99, prefix="x" * 155)
    buf = crafter.finish()
    scan = scan_tar(buf)
    assert_placed(scan, crafter.placed)
    assert scanned_members(scan) == tarfile_members(buf)


def test_gnu_header_bytes_at_the_prefix_position_are_not_a_prefix() -> None:
    # In GNU headers bytes 345.. hold atime/ctime, not a prefix (GNU tar agrees: see
    # test_gnutar; Python's tarfile alone would prepend them).
    crafter = Crafter()
    crafter.member("c.jpg", b"c", magic="gnu", prefix=octal(1_700_000_000, 12))
    assert scan_tar(crafter.finish()).names == ["c.jpg"]


def test_name_ends_at_its_first_nul() -> None:
    crafter = Crafter()
    crafter.member("a.jpg", b"a", header_name=b"a.jpg\0junk.png")
    crafter.member("b.jpg", b"b", header_name=b"b.jpg\0\0\0x")
    buf = crafter.finish()
    assert_placed(scan_tar(buf), crafter.placed)
    assert [m[0] for m in tarfile_members(buf)] == ["a.jpg", "b.jpg"]


def test_signed_checksums_are_accepted() -> None:
    crafter = Crafter()
    crafter.member("é.jpg", b"signed", checksum="signed")  # bytes >= 128: sums differ
    crafter.member("plain.jpg", b"unsigned")
    buf = crafter.finish()
    assert_placed(scan_tar(buf), crafter.placed)
    assert scanned_members(scan_tar(buf)) == tarfile_members(buf)


def test_checksums_at_reports_the_first_bad_header_in_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    buf = bytearray(tar_bytes({f"{i}.txt": b"x" for i in range(7)}))
    for corrupt in (3, 5):  # member headers 3 and 5, each one block before its data
        buf[corrupt * 2 * BLOCK + 10] ^= 0xFF
    monkeypatch.setattr(tarbytes, "_CHECK_CHUNK", 2)  # the bad headers in later chunks
    shard = tarbytes.ShardBytes(bytes(buf), "t.tar")
    shard.check_checksums_at([0, 2 * BLOCK])
    with pytest.raises(ShardFormatError, match="checksum field") as info:
        shard.check_checksums_at([i * 2 * BLOCK for i in range(7)])
    assert info.value.offset == 3 * 2 * BLOCK


def test_v7_headers() -> None:
    crafter = Crafter()
    crafter.member("dir/", b"", typeflag=b"\0", magic="v7")  # V7 directory: '/' ending
    crafter.member("dir/a.txt", b"v7 file", typeflag=b"\0", magic="v7")
    crafter.member("dir/b.txt", b"v7 file 2", typeflag=b"0", magic="v7")
    buf = crafter.finish()
    scan = scan_tar(buf)
    assert_placed(scan, crafter.placed)
    assert [scan.kind(i) for i in range(3)] == ["directory", "file", "file"]
    assert scanned_members(scan) == tarfile_members(buf)


def test_gnu_long_name_and_long_link() -> None:
    long_name = "n" * 300 + ".jpg"
    long_target = "t" * 300
    crafter = Crafter()
    crafter.extension(b"L", long_name.encode() + b"\0").member(
        long_name, b"data", header_name=long_name[:100]
    )
    crafter.extension(b"K", long_target.encode() + b"\0").member(
        "ln.jpg", b"", typeflag=b"2", linkname="t" * 100
    )
    crafter.extension(b"K", long_target.encode() + b"\0").extension(
        b"L", b"both" * 40 + b"\0"
    ).member("both" * 40, b"", typeflag=b"2", header_name="x")
    buf = crafter.finish()
    scan = scan_tar(buf)
    assert_placed(scan, crafter.placed)
    assert scan.extension_headers == 4
    with tarfile.open(fileobj=io.BytesIO(buf)) as tf:
        assert tf.getmembers()[1].linkname == long_target
    assert scanned_members(scan) == tarfile_members(buf)


def test_pax_path_and_size() -> None:
    crafter = Crafter()
    crafter.pax({"path": "pax/ü" * 40 + ".bin", "mtime": "1.5"}).member(
        "pax/ü" * 40 + ".bin", b"P" * 3000, header_name="short.bin"
    )
    crafter.pax({"size": "1234"}).member("sized.bin", b"S" * 1234, stored_size=0)
    crafter.pax({"size": "1234"}).member("sized-too.bin", b"T" * 1234, size_field=b"77777777777\0")
    crafter.member("after.bin", b"after")
    buf = crafter.finish()
    scan = scan_tar(buf)
    assert_placed(scan, crafter.placed)
    assert scanned_members(scan) == tarfile_members(buf)


def test_pax_global_header_applies_to_every_later_member() -> None:
    crafter = Crafter()
    crafter.member("before.bin", b"b" * 10)
    crafter.pax({"comment": "global", "mtime": "5"}, typeflag=b"g")
    crafter.member("first.bin", b"1" * 10)  # placed from the global header on
    crafter.member("second.bin", b"2" * 10)
    scan = scan_tar(crafter.finish())
    assert_placed(scan, crafter.placed)
    assert scan.extension_headers == 1


def test_pax_global_size_applies_until_overridden() -> None:
    crafter = Crafter()
    crafter.pax({"size": "600"}, typeflag=b"g")
    crafter.member("a.bin", b"a" * 600, stored_size=0)
    crafter.member("b.bin", b"b" * 600, stored_size=3)
    crafter.pax({"size": "5"}).member("c.bin", b"c" * 5, stored_size=0)
    scan = scan_tar(crafter.finish())
    assert scan.sizes.tolist() == [600, 600, 5]
    assert scan.data_offsets.tolist() == [p.data_offset for p in crafter.placed]


def test_utf8_names_in_every_format() -> None:
    names = ["ünï/cödé.jpg", "日本語/写真.png", "emoji-🙂.txt", "mixed/ß.tar.gz"]
    for fmt in FORMATS:
        buf = tar_bytes({n: n.encode() for n in names}, fmt)
        assert assert_like_tarfile(buf).names == names


def test_name_that_is_not_utf8_is_read_as_tarfile_reads_it() -> None:
    crafter = Crafter().member("x", b"", header_name=b"caf\xe9.jpg")
    names = scan_tar(crafter.finish(), shard="latin1.tar").names
    assert names == ["caf\udce9.jpg"] == assert_like_tarfile(crafter.finish()).names


@pytest.mark.parametrize(
    "kind, typeflag", [("chardev", b"3"), ("blockdev", b"4"), ("fifo", b"6"), ("hardlink", b"1")]
)
def test_special_entries_carry_no_data(kind: str, typeflag: bytes) -> None:
    crafter = Crafter()
    crafter.member("before.bin", b"x")
    # A non-zero size field on an entry that has no data must not move the next header.
    crafter.member("dev.bin", b"", typeflag=typeflag, size_field=octal(4096, 12))
    crafter.member("after.bin", b"y")
    scan = scan_tar(crafter.finish())
    assert scan.kind(1) == kind and scan.sizes[1] == 0
    assert scan.names == ["before.bin", "dev.bin", "after.bin"]
    assert scan.header_offsets[2] == 3 * BLOCK


# -- ends of archives ------------------------------------------------------------------


@pytest.mark.parametrize(
    "end_blocks, record", [(2, None), (1, None), (2, RECORD), (1, RECORD), (20, None)]
)
def test_end_marker_and_record_padding(end_blocks: int, record: int | None) -> None:
    buf, placed = craft(
        [("a.jpg", b"a" * 700), ("b.jpg", b"b")], end_blocks=end_blocks, record=record
    )
    scan = scan_tar(buf)
    assert_placed(scan, placed)
    assert scan.end_offset == 5 * BLOCK


def test_empty_archives() -> None:
    for buf in (b"\0" * 1024, b"\0" * RECORD, tar_bytes({})):
        scan = scan_tar(buf)
        assert len(scan) == 0 and scan.end_offset == 0


def test_accepts_bytes_bytearray_memoryview_and_mmap(tmp_path: Path) -> None:
    buf = tar_bytes(sample_members(5))
    expected = scanned_members(scan_tar(buf))
    for view in (bytearray(buf), memoryview(buf)):
        assert scanned_members(scan_tar(view)) == expected
    import mmap

    path = tmp_path / "m.tar"
    path.write_bytes(buf)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        scan = scan_tar(mm)
        assert scanned_members(scan) == expected
        del scan  # the scan's arrays must not pin the mmap


# -- round trips -----------------------------------------------------------------------

_segment = st.text(
    alphabet=st.sampled_from(list("abcXYZ019._- ") + ["é", "ß", "日", "🙂"]),
    min_size=1,
    max_size=40,
).filter(lambda s: s not in (".", ".."))
_name = st.lists(_segment, min_size=1, max_size=6).map("/".join)


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    members=st.lists(st.tuples(_name, st.integers(0, 5 * BLOCK + 3)), min_size=0, max_size=25),
)
def test_round_trip_against_tarfile(fmt: str, members: list[tuple[str, int]]) -> None:
    buf_io = io.BytesIO()
    contents = []
    with tarfile.open(fileobj=buf_io, mode="w", format=FORMATS[fmt]) as tf:
        for i, (name, size) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.size = size
            data = bytes([i % 256]) * size
            try:
                tf.addfile(info, io.BytesIO(data))
            except ValueError:  # ustar cannot store this name: tarfile refuses it
                assert fmt == "ustar"
                continue
            contents.append((name, data))
    buf = buf_io.getvalue()
    scan = assert_like_tarfile(buf)
    assert [
        (n, buf[o : o + s]) for n, o, s in zip(scan.names, scan.data_offsets, scan.sizes)
    ] == contents


def iter_offsets(scan: TarScan) -> Iterator[tuple[int, int]]:
    yield from zip(scan.header_offsets.tolist(), scan.data_offsets.tolist())


def test_offsets_are_int64_arrays() -> None:
    scan = scan_tar(tar_bytes(sample_members(3)))
    for array in (scan.header_offsets, scan.data_offsets, scan.sizes):
        assert array.dtype == np.int64
    assert all(d - h >= BLOCK for h, d in iter_offsets(scan))


# -- members over 8 GiB, on a sparse file ----------------------------------------------

BIG = 8 * 1024**3 + 12345  # over the 8 GiB an octal size field can hold


def sparse_shard(path: Path, headers: bytes, size: int) -> Path:
    """``headers`` then ``size`` bytes of data (a hole), then the end marker."""
    with open(path, "wb") as f:
        f.write(headers)
        f.truncate(len(headers) + len(blocks(b"")) + size + (-size % BLOCK) + 2 * BLOCK)
    if os.stat(path).st_blocks * 512 > 64 * 1024**2:
        pytest.skip(f"the filesystem under {path.parent} has no sparse files")
    return path


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_member_over_8_gib(fmt: str, tmp_path: Path) -> None:
    info = tarfile.TarInfo("huge.bin")
    info.size = BIG
    headers = info.tobuf(FORMATS[fmt])
    if fmt == "gnu":
        assert headers[124] == 0x80  # really base-256
    path = sparse_shard(tmp_path / f"huge-{fmt}.tar", headers, BIG)
    from indextar import build_index

    index = build_index(path)
    table = load_samples(index)
    assert table.member_size.tolist() == [BIG]
    assert table.member_data_offset.tolist() == [len(headers)]
    with tarfile.open(path) as tf:
        (member,) = tf.getmembers()
        assert (member.size, member.offset_data) == (BIG, len(headers))
