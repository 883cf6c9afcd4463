"""The C extensions against their Python references (see indextar/native.py).

The scanner, naming and index tests run with the C code and again without it (the
``scanner`` fixture); these tests call the C code directly, where the Python side
cannot reach a case: pread windows, a file that shrinks, the grouping's declines.
"""

from __future__ import annotations

import mmap
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import FORMATS, sample_members, tar_bytes
from hypothesis import given, settings
from hypothesis import strategies as st
from procstats import bytes_read

from indextar import IndextarError, build_index, native, scan_tar
from indextar.index import extensions as index_extensions
from indextar.index import tables as index
from indextar.index.naming import _group_c, _group_numpy, group_members
from indextar.source import extensions as source_extensions
from indextar.source import http11
from indextar.tar.scan import TarScan

assert all(native.built().values()), f"a C extension did not build: {native.built()}"


# -- the walker reading headers with pread ---------------------------------------------


def scan_through(path: Path, *, fd: bool) -> TarScan:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        return scan_tar(mm, shard=str(path), fd=f.fileno() if fd else None)


# Member sizes around the walker's switch between 256 KiB windows and single blocks
# after a member of 64 KiB or more, so that headers straddle window ends.
SIZES = [100, 65535, 65536, 70000, 3, 0, 262144, 1, 200000, 511, 512, 513] + [4000] * 150


def test_pread_walk_equals_the_mapped_walk(tmp_path: Path) -> None:
    members = {f"s{i:04d}.bin": bytes([i % 251]) * size for i, size in enumerate(SIZES)}
    path = tmp_path / "mixed.tar"
    path.write_bytes(tar_bytes(members, "ustar"))
    read, mapped = scan_through(path, fd=True), scan_through(path, fd=False)
    assert read.names == mapped.names == list(members)
    for field in ("types", "header_offsets", "data_offsets", "sizes"):
        assert getattr(read, field).tolist() == getattr(mapped, field).tolist(), field
    assert read.end_offset == mapped.end_offset


@pytest.mark.parametrize(
    ("layout", "members"),
    [
        ("large", {f"s{i:04d}.bin": b"\1" * 262144 for i in range(100)}),
        (
            "jpg+cls",
            {
                f"s{i // 2:04d}.{'jpg' if i % 2 == 0 else 'cls'}": b"\2"
                * (100_000 if i % 2 == 0 else 2)
                for i in range(400)
            },
        ),
    ],
)
def test_pread_walk_reads_about_a_page_per_header_not_the_data(
    layout: str, members: dict[str, bytes], tmp_path: Path
) -> None:
    path = tmp_path / f"{layout}.tar"
    path.write_bytes(tar_bytes(members, "ustar"))
    before = bytes_read()
    scan = scan_through(path, fd=True)
    read = bytes_read() - before
    assert len(scan) == len(members)
    # At most one page per header after the first 256 KiB window (plus reading
    # /proc/self/io itself): far below the data.
    assert read <= 256 * 1024 + 4096 * len(members) + 8192, (read, path.stat().st_size)


def scan_error(path: Path, fd: int | None = None, *, shrink_to: int | None = None) -> str:
    """The IndextarError of scanning ``path`` through a map and pread on ``fd``."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if shrink_to is not None:
            os.truncate(path, shrink_to)  # the map still claims the old size
        try:
            scan_tar(mm, shard=str(path), fd=f.fileno() if fd is None else fd)
        except IndextarError as e:
            return str(e)
        finally:
            del mm  # unmapped once the error's traceback is gone too
    raise AssertionError("no error")


def test_a_shard_that_shrinks_during_the_walk_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "shrinks.tar"
    path.write_bytes(tar_bytes(sample_members(2000), "ustar"))
    message = scan_error(path, shrink_to=1024 * 1024)
    assert "shrinks.tar" in message and "changed while it was being indexed" in message


def test_a_descriptor_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "shard.tar"
    path.write_bytes(tar_bytes(sample_members(10), "ustar"))
    w = os.open(tmp_path / "w", os.O_WRONLY | os.O_CREAT)
    try:  # write-only: pread fails with EBADF
        assert "cannot read shard" in scan_error(path, w) and "shard.tar" in scan_error(path, w)
    finally:
        os.close(w)


# -- the row writer --------------------------------------------------------------------

TABLES = ("members", "samples", "skipped", "arrays")


def table_rows(path: Path) -> dict[str, list[tuple[object, ...]]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in TABLES}
    finally:
        conn.close()


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_c_row_writer_writes_what_executemany_writes(
    fmt: str,
    make_tar,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    members = {
        **sample_members(40, ("jpg", "CLS", "seg.png")),
        "ü/日本.JPEG": b"utf-8",
        "d/": None,
        "README": b"skipped",
        "p" * 60 + "/" + "n" * 90 + ".txt": b"a prefix, GNU long name or PAX path",
    }
    shard = make_tar(members, fmt=fmt)
    fast = build_index(shard, index_dir=tmp_path / "c").path
    monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
    reference = build_index(shard, index_dir=tmp_path / "py").path
    rows = table_rows(fast)
    assert rows == table_rows(reference)
    assert len(rows["members"]) == 122 and len(rows["samples"]) == 42


def test_the_c_row_writer_refuses_rows_that_do_not_line_up(tmp_path: Path) -> None:
    bulk = index_extensions.sqlitebulk()
    assert bulk is not None, "indextar/index/_sqlitebulk.c did not build"
    path = tmp_path / "x.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(index._schema()[0])
    conn.close()
    ints = np.zeros(2, np.int64)
    samples = ([], ints[:0], ints[:0], ints[:0], ints[:0])
    with pytest.raises(ValueError, match="ext_codes"):  # a code outside ext_names
        bulk.insert_rows(
            str(path), (ints, ["a.x", "b.x"], ["x"], ints + 1, ints, ints, ints), samples
        )
    with pytest.raises(ValueError, match="size"):  # a column shorter than names
        bulk.insert_rows(
            str(path), (ints, ["a.x", "b.x"], ["x"], ints, ints, ints, ints[:1]), samples
        )
    no_rows = (ints[:0], [], [], ints[:0], ints[:0], ints[:0], ints[:0])
    with pytest.raises(sqlite3.OperationalError, match="unable to open"):  # no such file
        bulk.insert_rows(str(tmp_path / "missing.sqlite"), no_rows, samples)
    sqlite3.connect(tmp_path / "empty.sqlite").close()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        bulk.insert_rows(str(tmp_path / "empty.sqlite"), no_rows, samples)
    assert table_rows(path)["members"] == []  # nothing of a failed call is kept


# -- the grouping ----------------------------------------------------------------------


_name_lists = st.lists(
    st.text(alphabet=st.sampled_from(list("ab_./\nÄ日AB")), min_size=1, max_size=10),
    max_size=30,
)
_simple_names = st.lists(
    st.from_regex(r"[a-zA-Z0-9Ä日/]{0,6}[a-zA-Z0-9Ä日]\.[a-zA-Z.Ä]{0,5}", fullmatch=True),
    max_size=30,
)


def _same_groups(names: list[str]) -> bool:
    """Whether the C grouping took the names; if it did, it must equal the reference."""
    rows = np.arange(len(names), dtype=np.int64)
    fast = _group_c(names, rows)
    if fast is None:
        return False
    reference = _group_numpy(names, rows, skipped := [])
    assert skipped == []
    assert fast[0].tolist() == reference[0].tolist()  # member rows
    assert fast[1].tolist() == reference[1].tolist()  # each sample's first member
    assert fast[2] == reference[2]  # sample keys
    # The same extension for every member, whatever order each lists them in.
    assert [fast[3][c] for c in fast[4].tolist()] == [reference[3][c] for c in reference[4]]
    return True


@settings(max_examples=400, derandomize=True, deadline=None)
@given(_name_lists)
def test_c_grouping_equals_the_reference_or_declines(names: list[str]) -> None:
    _same_groups(names)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(_simple_names)
def test_c_grouping_takes_every_simple_name(names: list[str]) -> None:
    assert _same_groups(names)  # the common case never falls back


def test_c_grouping_declines_over_256_extensions_and_the_result_is_the_same() -> None:
    names = [f"s{i}.e{i}" for i in range(300)]
    rows = np.arange(300, dtype=np.int64)
    assert _group_c(names, rows) is None
    buf = tar_bytes({name: b"x" for name in names})
    grouping = group_members(scan_tar(buf))
    assert len(grouping.ext_names) == 300 and grouping.keys == [f"s{i}" for i in range(300)]


# -- the guarded copy out of shard maps ------------------------------------------------


def test_samples_read_through_mapread_equal_the_python_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indextar import IndexedTarDataset
    from indextar.source import local as sources

    members = {f"wide.e{i:02d}": bytes([i]) * i for i in range(70)}  # more than C takes
    members.update(sample_members(30, ("jpg", "cls", "json")))
    path = tmp_path / "m.tar"
    path.write_bytes(tar_bytes(members, "ustar"))
    fast = [IndexedTarDataset(path)[i] for i in range(31)]
    monkeypatch.setattr(sources, "_MAPREAD", None)
    assert fast == [IndexedTarDataset(path)[i] for i in range(31)]
    assert fast[0]["e69"] == bytes([69]) * 69 and len(fast[0]) == 3 + 70


def test_mapread_refuses_rows_outside_the_map() -> None:
    mapread = source_extensions.mapread()
    assert mapread is not None
    buf = bytes(range(256)) * 4
    rows = np.array([[0, 10, 0], [10, 5, 1]], np.int64)
    assert mapread.members(buf, 100, rows, 0, 2, ("a", "b")) == [
        ("a", buf[100:110]),
        ("b", buf[110:115]),
    ]
    with pytest.raises(IndexError, match="outside"):
        mapread.members(buf, 1020, rows, 0, 1, ("a",))  # runs past the buffer
    with pytest.raises(IndexError, match="outside"):
        mapread.members(buf, 0, rows, 1, 1, ("a",))  # no extension 1
    with pytest.raises(IndexError, match="out of range"):
        mapread.members(buf, 0, rows, 1, 2, ("a", "b"))  # rows 1..2 of 2


# -- the C head parser against its Python reference ------------------------------------

_HEADER_NAMES = [
    "ETag",
    "content-length",
    "Content-Range",
    "X-A",
    "x-a",
    " Server ",
    "",
    "a\rb",
    "\nx\x0b",
    "\x1cY",
]
_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0, max_codepoint=0xFF, blacklist_characters="\r\n"),
    max_size=12,
)


@st.composite
def heads(draw: st.DrawFn) -> bytes:
    """Status lines and header lines as servers write them, and as they should not:
    repeated names, odd spacing, no colon, latin-1 bytes, codes with signs or letters."""
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", "http/1.1", "HTTP/1.1x"]))
    code = draw(
        st.sampled_from(
            ["206", "200", "100", "412", "0206", "+206", " 206", "2_06", "", "20x", "1234567890"]
        )
    )
    reason = draw(st.sampled_from(["Partial Content", "", "OK  ", " x y "]))
    lines = [f"{version} {code} {reason}" if code or reason else version]
    for _ in range(draw(st.integers(0, 8))):
        name = draw(st.sampled_from(_HEADER_NAMES) | _TEXT)
        colon = draw(st.sampled_from([":", ": ", ":\t", "", " : "]))
        value = draw(_TEXT | st.sampled_from([" v\r", "\n v \x1f", "a:b", "\xa0x\x85"]))
        lines.append(f"{name}{colon}{value}")
    return "\r\n".join(lines).encode("latin-1")


@settings(max_examples=200, deadline=None)
@given(heads(), st.integers(0, 64))
def test_the_c_head_parser_gives_what_the_reference_gives_or_hands_it_over(
    head: bytes, padding: int
) -> None:
    extension = source_extensions.http11()
    assert extension is not None
    buffer = bytearray(head + b"\r\n\r\n" + b"\xff" * padding)  # bytes past the end
    parsed = extension.parse_head(buffer, len(head))
    try:
        reference = http11.parse_head_py(buffer, len(head))
    except ValueError:
        assert parsed is None  # the reference raises its own error
        return
    if parsed is not None:
        assert parsed == reference
        assert [type(x) for x in parsed] == [str, int, str, dict]
    else:  # handed over only where the C code declines: not ASCII, or an unusual code
        code = head.split(b"\r\n")[0].partition(b" ")[2].partition(b" ")[0]
        assert not head.isascii() or not (code.isdigit() and len(code) <= 9)
    assert http11.parse_head(buffer, len(head)) == reference


def test_a_server_head_parses_in_c_with_its_repeated_headers_joined() -> None:
    head = (
        b"HTTP/1.1 206 Partial Content\r\nServer: nginx\r\nContent-Length: 100\r\n"
        b'X-Amz-Meta:  a \r\nx-amz-meta: b\r\nETag: "abc"'
    )
    extension = source_extensions.http11()
    assert extension is not None
    assert extension.parse_head(head, len(head)) == (
        "HTTP/1.1", 206, "Partial Content",
        {"server": "nginx", "content-length": "100", "x-amz-meta": "a, b", "etag": '"abc"'},
    )  # fmt: skip
    with pytest.raises(ValueError, match="end outside"):
        extension.parse_head(head, len(head) + 1)


def test_unfilled_buffers_have_their_size_and_take_a_whole_body() -> None:
    for size in (0, 1, 100_000):
        buffer = http11.unfilled(size)
        assert type(buffer) is bytearray and len(buffer) == size
        memoryview(buffer)[:] = b"\x07" * size
        assert buffer == b"\x07" * size
    extension = source_extensions.http11()
    assert extension is not None
    with pytest.raises(ValueError):
        extension.unfilled(-1)
