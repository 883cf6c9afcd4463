"""The C walker's PAX fold against the reference scan.

The C walker (indextar/tar/_tarwalk.c) folds a PAX header whose records change nothing
the scan records: a lone ``mtime``, as tarfile and webdataset's writer give every member,
or GNU tar --format=posix's ``atime``, ``ctime`` and ``mtime``. Anything else goes to the
numpy scanner, the reference (:mod:`indextar.tar.ext`). Every case here is scanned both
ways, from bytes and from a file read with pread, and must give the same members or the
same error; a spy on the scanner says whether the C walker's chain was used.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import sqlite3
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import sample_members
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tarcraft import BLOCK, Crafter, gnu_tar, pax_records, write_tree
from wds_shards import write_shards

from indextar import IndextarError, build_index, native, scan_tar
from indextar.tar import extensions as tar_extensions
from indextar.tar import scan as scan_module

assert native.built()["_tarwalk"], "the C walker (indextar/tar/_tarwalk.c) did not build"

# What a scan gives: every array of the TarScan, or the error's class, offset and message.
Outcome = tuple[object, ...]


@pytest.fixture(autouse=True)
def c_walker_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the C walker, even in a run with ``INDEXTAR_PURE_PYTHON``."""
    monkeypatch.delenv(native.PURE_PYTHON_ENV, raising=False)


@contextlib.contextmanager
def walker(*, pure: bool) -> Iterator[None]:
    """The reference alone (``pure``) or the C walker first, for the scans inside."""
    if pure:
        os.environ[native.PURE_PYTHON_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(native.PURE_PYTHON_ENV, None)


def outcome(data: bytes, *, pure: bool, folder: Path | None = None) -> Outcome:
    """``data`` scanned by the reference alone (``pure``) or C walker first; from a file
    mapped and read with pread if ``folder`` is given, else from the bytes."""
    with walker(pure=pure), contextlib.ExitStack() as stack:
        buf: bytes | mmap.mmap = data
        fd = None
        if folder is not None:
            path = folder / "p.tar"
            path.write_bytes(data)
            fd = stack.enter_context(open(path, "rb")).fileno()
            # Not closed: an error's traceback may still hold views of it.
            buf = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if data else data
        try:
            scan = scan_tar(buf, shard="p.tar", fd=fd)
        except IndextarError as e:
            return ("refused", type(e).__name__, getattr(e, "offset", None), str(e))
    arrays = (scan.types, scan.header_offsets, scan.data_offsets, scan.sizes)
    return ("scanned", scan.names, *(a.tolist() for a in arrays), scan.end_offset,
            scan.file_size, scan.extension_headers)  # fmt: skip


@pytest.fixture
def c_chains(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The member counts of the scans that used the C walker's chain."""
    used: list[int] = []
    real = scan_module.Scanner.resolve_c

    def spy(self: scan_module.Scanner, chain: scan_module._Chain) -> scan_module.TarScan:
        used.append(len(chain.offsets))
        return real(self, chain)

    monkeypatch.setattr(scan_module.Scanner, "resolve_c", spy)
    return used


def c_status(data: bytes) -> int:
    """The C walker's status on ``data``: 0 walked, 1 handed to the reference."""
    c_walker = tar_extensions.tarwalk()
    assert c_walker is not None
    return c_walker.walk(data)[0]


def assert_agree(data: bytes, folder: Path) -> Outcome:
    """The C-first scan, from bytes and from a file, equals the reference's; returns it."""
    reference = outcome(data, pure=True)
    assert outcome(data, pure=False) == reference
    assert outcome(data, pure=False, folder=folder) == reference
    assert outcome(data, pure=True, folder=folder) == reference
    return reference


# -- crafted PAX headers: folded, or handed over ------------------------------------------


def pax_shard(*payloads: bytes, typeflag: bytes = b"x", members: int = 3) -> bytes:
    """``members`` members, the first preceded by PAX headers with these raw payloads,
    each later one by a lone mtime."""
    crafter = Crafter()
    for i in range(members):
        for payload in payloads if i == 0 else [pax_records({"mtime": f"1700000000.{i}"})]:
            crafter.extension(typeflag if i == 0 else b"x", payload, name="PaxHeader/x")
        crafter.member(f"s{i:03d}.txt", b"data %d" % i * (i * 70 + 1))
    return crafter.finish()


def rec(key: str, value: str) -> bytes:
    return pax_records({key: value})


FOLDED = {
    "a lone mtime": pax_shard(rec("mtime", "1700000000.25")),
    "GNU tar posix records": pax_shard(
        rec("mtime", "1700000000.123456789") + rec("atime", "1700000001.5") + rec("ctime", "2")
    ),
    "every harmless keyword": pax_shard(
        b"".join(rec(k, "7") for k in ("mtime", "atime", "ctime", "uid", "gid", "uname", "gname"))
        + rec("comment", "made by a test")
    ),
    "an empty PAX header": pax_shard(b""),
    "records spanning three blocks": pax_shard(rec("comment", "c" * 1100) + rec("mtime", "1")),
    "a record ending exactly at a block edge": pax_shard(rec("comment", "e" * 499)),
    "two stacked PAX headers": pax_shard(rec("mtime", "1"), rec("atime", "2")),
    "a global header": pax_shard(rec("comment", "global"), typeflag=b"g"),
    "a value that is not a number": pax_shard(rec("mtime", "nan")),
    "a value holding '=' and a newline": pax_shard(b"17 comment=a=b\nc\n"),
    "a length with leading zeros": pax_shard(b"013 mtime=12\n"),
    "a keyword twice": pax_shard(rec("mtime", "1") + rec("mtime", "2")),
}

HANDED_OVER = {
    # Records the reference acts on.
    "a path": pax_shard(rec("path", "renamed.txt")),
    "a size": pax_shard(rec("size", "7")),
    "an invalid size": pax_shard(rec("size", "-1")),
    "a linkpath": pax_shard(rec("linkpath", "elsewhere")),
    "a hdrcharset": pax_shard(rec("hdrcharset", "BINARY")),
    "a GNU sparse record": pax_shard(rec("GNU.sparse.major", "1")),
    "a vendor keyword": pax_shard(rec("SCHILY.xattr.user.note", "x")),
    "an mtime and a path": pax_shard(rec("mtime", "1") + rec("path", "p.txt")),
    "a global path": pax_shard(rec("path", "g.txt"), typeflag=b"g"),
    # Values and keywords outside ASCII.
    "a UTF-8 uname": pax_shard(rec("uname", "jürgen")),
    "an invalid UTF-8 value": pax_shard(b"13 uname=\xff\xfe\xfd\n"),
    "an empty keyword": pax_shard(b"6 =xy\n"),
    "a keyword with a space": pax_shard(b"12 mtime =1\n"),
    # Malformed records.
    "a length one short": pax_shard(b"11 mtime=12\n"),
    "a length one long": pax_shard(b"13 mtime=12\n"),
    "a length past the data": pax_shard(b"99 mtime=12\n"),
    "a length of zero": pax_shard(b"0 mtime=1\n"),
    "a negative length": pax_shard(b"-12 mtime=1\n"),
    "a length with a plus sign": pax_shard(b"+13 mtime=12\n"),
    "a length of ten digits": pax_shard(b"0000000021 mtime=123\n"),
    "no space after the length": pax_shard(b"12mtime=123\n"),
    "no '='": pax_shard(b"13 mtime:123\n"),
    "no newline": pax_shard(rec("mtime", "1")[:-1] + b" "),
    "the last record cut short": pax_shard(rec("mtime", "1") + rec("atime", "2")[:-3]),
    "NUL padding after the records": pax_shard(rec("mtime", "1") + b"\0" * 20),
    "a NUL where a record starts": pax_shard(b"\0" + rec("mtime", "1")),
    "garbage": pax_shard(b"0 " * 40),
    # Headers in the wrong place, or too big for the walker.
    "records over 64 KiB": pax_shard(rec("comment", "x" * 70_000)),
    "a PAX header with no member after it": Crafter()
    .member("a.txt", b"a")
    .pax({"mtime": "1"})
    .finish(),
    "a PAX header before a GNU long name": Crafter()
    .pax({"mtime": "1"})
    .extension(b"L", b"long" * 40 + b".txt\0")
    .member("long" * 40 + ".txt", b"x", header_name="short.txt")
    .finish(),
}


def truncated(data: bytes, inside_records: bool) -> bytes:
    """``data`` cut inside the first PAX header's records, or right after its header."""
    return data[: BLOCK + 5] if inside_records else data[:BLOCK]


HANDED_OVER["cut inside the records"] = truncated(FOLDED["a lone mtime"], True)
HANDED_OVER["cut after the PAX header"] = truncated(FOLDED["a lone mtime"], False)


@pytest.mark.parametrize("name", FOLDED)
def test_harmless_pax_headers_are_folded_by_the_c_walker(
    name: str, tmp_path: Path, c_chains: list[int]
) -> None:
    data = FOLDED[name]
    assert c_status(data) == 0
    result = assert_agree(data, tmp_path)
    assert result[0] == "scanned" and result[1] == ["s000.txt", "s001.txt", "s002.txt"]
    assert c_chains and all(n == 3 for n in c_chains)  # the C chain, every time


@pytest.mark.parametrize("name", HANDED_OVER)
def test_other_pax_headers_go_to_the_reference(
    name: str, tmp_path: Path, c_chains: list[int]
) -> None:
    data = HANDED_OVER[name]
    assert c_status(data) == 1
    assert_agree(data, tmp_path)
    assert not c_chains


def test_a_folded_member_starts_at_its_first_pax_header(c_chains: list[int]) -> None:
    data = FOLDED["two stacked PAX headers"]
    scan = scan_tar(data, shard="p.tar")
    assert c_chains == [3]
    # Two PAX headers of one block of records each, then the member's own header.
    assert scan.header_offsets[0] == 0 and scan.data_offsets[0] == 5 * BLOCK
    assert scan.extension_headers == 4  # and one for each later member
    assert data[scan.data_offsets[0] : scan.data_offsets[0] + 6] == b"data 0"


def test_members_of_every_kind_after_folded_headers(tmp_path: Path, c_chains: list[int]) -> None:
    crafter = Crafter()
    kinds = [
        ("d/", b"5", b""),  # a directory
        ("d/link.txt", b"2", b""),  # a symlink: no data whatever the size field says
        ("v7dir/", b"\0", b""),  # a V7 directory: a regular type, the name ends in '/'
        ("caf\xe9.txt".encode("latin-1"), b"0", b"not UTF-8"),  # a Latin-1 name
        ("s.txt", b"0", b"x" * 600),
    ]
    for i, (name, typeflag, data) in enumerate(kinds):
        crafter.pax({"mtime": f"{i}.5"}, typeflag=b"g" if i == 2 else b"x")
        shown = name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else name
        crafter.member(shown, data, header_name=name, typeflag=typeflag)
    data = crafter.finish()
    assert c_status(data) == 0
    result = assert_agree(data, tmp_path)
    assert result[1] == ["d/", "d/link.txt", "v7dir/", "caf\udce9.txt", "s.txt"]
    assert result[2] == [ord("5"), ord("2"), ord("5"), ord("0"), ord("0")]
    assert c_chains


# -- shards written by real writers -------------------------------------------------------


def tarfile_pax(members: dict[str, bytes], **options: object) -> bytes:
    """A PAX tar from tarfile, with fractional mtimes as webdataset's writer sets them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, **options) as tf:  # type: ignore[call-overload]
        for i, (name, data) in enumerate(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000 + i / 7
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_tarfile_pax_shards_take_the_c_walk(tmp_path: Path, c_chains: list[int]) -> None:
    members = sample_members(300, ("jpg", "cls", "json"))
    data = tarfile_pax(members)
    result = assert_agree(data, tmp_path)
    assert result[1] == list(members) and result[-1] == 900  # a PAX header per member
    assert c_chains == [900, 900]  # from bytes and from the file


def test_a_tarfile_global_header_is_folded(tmp_path: Path, c_chains: list[int]) -> None:
    data = tarfile_pax(sample_members(20), pax_headers={"comment": "shard 7"})
    assert data[156:157] == b"g"
    result = assert_agree(data, tmp_path)
    assert result[3][0] == 0 and result[-1] == 41  # the first member starts at the 'g'
    assert c_chains


def test_tarfile_names_and_owners_outside_ustar_go_to_the_reference(
    tmp_path: Path, c_chains: list[int]
) -> None:
    members = {"ü/日本.txt": b"utf-8 name: a path record", "x" * 150 + ".txt": b"long name"}
    result = assert_agree(tarfile_pax(members), tmp_path)
    assert result[1] == list(members)
    assert not c_chains


def test_webdataset_shards_take_the_c_walk(tmp_path: Path, c_chains: list[int]) -> None:
    (path,) = write_shards(tmp_path / "wds", 1, 40, images=False)
    data = path.read_bytes()
    result = assert_agree(data, tmp_path)
    assert result[-1] == len(result[1]) > 80  # webdataset's writer: a PAX mtime per member
    assert c_chains == [len(result[1])] * 2


def index_rows(path: Path) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT * FROM members ORDER BY 1").fetchall()
    finally:
        conn.close()


def test_webdataset_shards_index_as_the_reference_indexes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, c_chains: list[int]
) -> None:
    (path,) = write_shards(tmp_path, 1, 30)
    fast = index_rows(build_index(path, force=True).path)
    assert c_chains
    monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
    assert index_rows(build_index(path, force=True).path) == fast
    assert len(fast) == len(scan_tar(path.read_bytes()))


@pytest.mark.parametrize("long_name", [False, True])
def test_gnu_tar_posix_shards(long_name: bool, tmp_path: Path, c_chains: list[int]) -> None:
    files: dict[str, bytes | str | None] = {
        "d/": None,
        "d/s1.jpg": b"\xff\xd8" * 700,
        "d/s1.cls": b"1",
        "d/link.jpg": "->s1.jpg",
    }
    if long_name:  # over 100 bytes: GNU tar adds a path record
        files["d/" + "n" * 120 + ".txt"] = b"long"
    write_tree(tmp_path / "tree", files)
    archive = gnu_tar(tmp_path / "posix.tar", tmp_path / "tree", ["d"], "--format=posix")
    data = archive.read_bytes()
    result = assert_agree(data, tmp_path)
    assert sorted(result[1]) == sorted(files)
    assert result[-1] == len(files)  # GNU tar --format=posix: a PAX header per member
    assert bool(c_chains) is not long_name


# -- reading with pread ---------------------------------------------------------------


def large_pax_shard(comment_bytes: int) -> bytes:
    """Members of 80 KiB (the walker reads a page at each header), each with an mtime
    record, one also with a comment of ``comment_bytes``."""
    crafter = Crafter()
    for i in range(8):
        records = {"mtime": f"{i}.5"} | ({"comment": "c" * comment_bytes} if i == 5 else {})
        crafter.pax(records).member(f"s{i}.bin", bytes([i]) * 80_000)
    return crafter.finish()


@pytest.mark.parametrize("comment_bytes", [100, 3500, 5000, 60_000])
def test_pread_reads_records_past_the_header_page(comment_bytes: int, tmp_path: Path) -> None:
    data = large_pax_shard(comment_bytes)
    assert c_status(data) == 0
    assert assert_agree(data, tmp_path)[1] == [f"s{i}.bin" for i in range(8)]


def test_a_shard_that_shrinks_inside_pax_records_is_an_error(tmp_path: Path) -> None:
    data = large_pax_shard(5000)
    path = tmp_path / "shrinks.tar"
    path.write_bytes(data)
    # Cut inside member 5's comment: its header is read, its records are not all there.
    pax_header = int(scan_tar(data).header_offsets[5])
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # not closed: see outcome()
        os.truncate(path, pax_header + BLOCK + 1000)
        with pytest.raises(IndextarError, match="changed while it was being indexed") as e:
            scan_tar(mm, shard=str(path), fd=f.fileno())
    records_end = pax_header + BLOCK + len(pax_records({"mtime": "5.5", "comment": "c" * 5000}))
    assert f"before byte {records_end}" in str(e.value)


# -- random chains of PAX headers ------------------------------------------------------

RECORDS = [
    rec("mtime", "1700000000.5"),
    rec("atime", "1") + rec("ctime", "2"),
    rec("comment", "k" * 700),
    rec("uid", "1000") + rec("gname", "staff"),
    b"",
    rec("path", "renamed.txt"),
    rec("size", "3"),
    rec("uname", "ö"),
    b"13 mtime=12\n",
    b"12 mtime=12",
    b"5 a=b\n",
    rec("mtime", "1") + b"\0\0",
]


@st.composite
def pax_chains(draw: st.DrawFn) -> bytes:
    crafter = Crafter()
    for i in range(draw(st.integers(0, 5))):
        for _ in range(draw(st.integers(0, 3))):
            crafter.extension(
                draw(st.sampled_from([b"x", b"x", b"g"])),
                draw(st.sampled_from(RECORDS)),
                name="PaxHeader/x",
            )
        crafter.member(
            f"m{i}.{draw(st.sampled_from(['a', 'b']))}", b"z" * draw(st.integers(0, 1100))
        )
    data = crafter.finish()
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pax_chains())
def test_random_pax_chains_scan_alike_both_ways(data: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="pax-") as folder:
        assert_agree(data, Path(folder))
