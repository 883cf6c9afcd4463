"""A shard rewritten under an open dataset is never misread (issue 12, local shards).

Every read after a rewrite either raises :class:`StaleIndexError` (or
:class:`TruncatedShardError`) or returns exactly the bytes the index promised: in the
process that opened the dataset, in forked and spawned DataLoader workers, through
``ds[i]`` and ``__getitems__``, with the C copy and with the pure-Python slices.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import sample_members, tar_bytes
from torch.utils.data import DataLoader

from indextar import IndexedTarDataset, StaleIndexError, TruncatedShardError, build_index
from indextar.source import extensions as source_extensions
from indextar.tar.spancheck import BAD_CHECKSUM, OK, OTHER_NAME, check_headers

REFUSED = (StaleIndexError, TruncatedShardError)


def two_shards(folder: Path, samples: int = 100) -> list[Path]:
    paths = []
    for n, prefix in enumerate(("a", "b")):
        path = folder / f"shard-{n}.tar"
        path.write_bytes(tar_bytes(sample_members(samples, prefix=prefix)))
        build_index(path)
        paths.append(path)
    return paths


def overwrite_in_place(path: Path, payload: bytes, *, keep_mtime: bool = False) -> None:
    """``payload`` written over ``path``'s bytes, zero-padded to its size: the same inode."""
    st = path.stat()
    time.sleep(0.02)  # past the file system's timestamp granularity (a jiffy)
    with open(path, "r+b") as f:
        f.write(payload.ljust(st.st_size, b"\0")[: st.st_size])
    if keep_mtime:  # a rewrite that hides from the fstat check: the header check remains
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def promised(paths: list[Path]) -> list[Any]:
    ds = IndexedTarDataset(paths)
    try:
        return [ds[i] for i in range(len(ds))]
    finally:
        ds.close()


def assert_never_misread(ds: IndexedTarDataset, expected: list[Any], indices: list[int]) -> int:
    """Read each index alone and in batches of 8; returns how many reads were refused."""
    refused = 0
    for i in indices:
        try:
            assert ds[i] == expected[i]
        except REFUSED:
            refused += 1
    for at in range(0, len(indices), 8):
        batch = indices[at : at + 8]
        try:
            assert ds.__getitems__(batch) == [expected[i] for i in batch]
        except REFUSED:
            refused += len(batch)
    return refused


@pytest.mark.usefixtures("map_reader")
def test_overwritten_in_place_with_another_layout_is_refused(tmp_path: Path) -> None:
    paths = two_shards(tmp_path)
    expected = promised(paths)
    ds = IndexedTarDataset(paths)
    assert [ds[i] for i in (0, 5, 150)] == [expected[0], expected[5], expected[150]]
    other = tar_bytes(sample_members(80, exts=("png", "txt", "cls"), prefix="zz"))
    overwrite_in_place(paths[0], other)
    shard0 = list(range(100)) * 2
    assert assert_never_misread(ds, expected, shard0) == 2 * len(shard0)
    with pytest.raises(StaleIndexError, match="changed in place") as info:
        ds[3]
    assert str(paths[0]) in str(info.value) and "mtime changed" in str(info.value)
    assert ds[150] == expected[150]  # the other shard is untouched
    ds.close()


@pytest.mark.usefixtures("map_reader")
def test_same_layout_other_bytes_is_refused_by_mtime(tmp_path: Path) -> None:
    paths = two_shards(tmp_path)
    expected = promised(paths)
    ds = IndexedTarDataset(paths)
    ds[0]
    same_names = {name: data.upper() for name, data in sample_members(100, prefix="a").items()}
    overwrite_in_place(paths[0], tar_bytes(same_names))
    assert assert_never_misread(ds, expected, list(range(100))) == 200
    ds.close()


@pytest.mark.usefixtures("map_reader")
def test_a_rewrite_that_keeps_size_and_mtime_is_caught_by_the_header_check(
    tmp_path: Path,
) -> None:
    paths = two_shards(tmp_path)
    expected = promised(paths)
    ds = IndexedTarDataset(paths)
    ds[0]
    overwrite_in_place(paths[0], paths[1].read_bytes(), keep_mtime=True)  # b's samples
    assert assert_never_misread(ds, expected, list(range(100))) == 200
    with pytest.raises(StaleIndexError, match="promised sample 'a000007'") as info:
        ds[7]
    assert "b000007" in str(info.value) and str(paths[0]) in str(info.value)
    ds.close()


@pytest.mark.usefixtures("map_reader")
def test_a_header_with_a_bad_checksum_is_refused(tmp_path: Path) -> None:
    (path,) = two_shards(tmp_path)[:1]
    ds = IndexedTarDataset(path)
    expected = [ds[i] for i in range(len(ds))]
    raw = bytearray(path.read_bytes())
    with ds._leased(0) as shard:
        start = int(shard.samples[50, 0])  # past the fingerprinted first 64 KiB
    raw[start + 50] ^= 0x01  # a byte of the mode field: the checksum no longer holds
    overwrite_in_place(path, bytes(raw), keep_mtime=True)
    with pytest.raises(StaleIndexError, match="bad checksum") as info:
        ds[50]
    assert f"byte offset {start}" in str(info.value)
    with pytest.raises(StaleIndexError, match="bad checksum"):
        ds.__getitems__([49, 50])
    assert ds[51] == expected[51]
    ds.close()


@pytest.mark.usefixtures("map_reader")
def test_a_shard_replaced_by_rename_keeps_its_old_mapping(tmp_path: Path) -> None:
    paths = two_shards(tmp_path)
    expected = promised(paths)
    ds = IndexedTarDataset(paths)
    ds[0]
    replacement = tmp_path / "new.tar"
    replacement.write_bytes(tar_bytes(sample_members(100, prefix="zz")))
    replacement.replace(paths[0])
    assert assert_never_misread(ds, expected, list(range(100))) == 0
    ds.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_never_misread_a_shard_rewritten_mid_epoch(
    tmp_path: Path, context: str
) -> None:
    paths = two_shards(tmp_path, samples=200)
    expected = promised(paths)
    ds = IndexedTarDataset(paths, keys=("__key__", "jpg"))
    loader = DataLoader(
        ds,
        batch_size=10,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=list,
        shuffle=False,
        prefetch_factor=1,
    )
    seen = 0
    with pytest.raises(StaleIndexError, match="changed in place"):
        for batch in loader:
            for key, jpg in batch:
                assert (key, jpg) == (expected[seen]["__key__"], expected[seen]["jpg"])
                seen += 1
            if seen == 40:  # mid-epoch, with batches of shard 0 still to come
                overwrite_in_place(paths[0], paths[1].read_bytes())
    assert 40 <= seen < 200


def test_the_python_check_classifies_headers(tmp_path: Path) -> None:
    raw = tar_bytes({"dir/k1.seg.png": b"x", "k2.txt": b"y"})
    assert check_headers(raw[:512], b"dir/k1") == OK
    assert check_headers(raw[:512], b"dir/k") == OTHER_NAME  # the key ends at the dot
    assert check_headers(raw[:512], b"k2") == OTHER_NAME
    damaged = bytearray(raw[:512])
    damaged[0] ^= 1
    assert check_headers(bytes(damaged), b"dir/k1") == BAD_CHECKSUM
    long_key = "d/" + "x" * 150
    for fmt in ("gnu", "pax"):
        long = tar_bytes({f"{long_key}.cls": b"1"}, fmt)
        ds_path = tmp_path / f"{fmt}.tar"
        ds_path.write_bytes(long)
        ds = IndexedTarDataset(ds_path)
        assert ds[0]["__key__"] == long_key  # the long name's header check passed
        ds.close()
        headers = long[: len(long) - 1024 - 512]  # everything before the data block
        assert check_headers(headers, long_key.encode()) == OK
        assert check_headers(headers, b"d/" + b"y" * 150) == OTHER_NAME


def test_the_c_check_agrees_with_the_python_check_on_damaged_headers() -> None:
    import random

    import numpy as np

    mapread = source_extensions.mapread()
    assert mapread is not None, "indextar/source/_mapread.c did not build"
    rng = random.Random(12)
    headers = []
    for fmt in ("ustar", "gnu", "pax"):
        for name in ("k.txt", "dir/" + "n" * 90 + ".txt", "a/" * 60 + "k.txt", "ü/k.txt"):
            raw = tar_bytes({name: b"payload"}, fmt)
            headers.append((raw[: len(raw) - 1024 - 512], name.rpartition(".")[0].encode()))
    checked = 0
    for base, key in headers:
        for _ in range(300):
            damaged = bytearray(base)
            for _ in range(rng.choice((0, 1, 2))):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            candidate = key if rng.random() < 0.8 else key[:-1] + b"?"
            buf = bytes(damaged) + b"payload"
            rows = np.array([[len(damaged), 7, 0]], np.int64)
            got = mapread.members(buf, 0, rows, 0, 1, ("txt",), candidate)
            c_code = 0 if isinstance(got, list) else got
            assert c_code == check_headers(bytes(damaged), candidate), (base, damaged)
            checked += 1
    assert checked == 12 * 300


def crafted_header_runs() -> list[tuple[bytes, bytes]]:
    """``(headers, key)`` runs where GNU tar's naming rules decide the name."""
    from tarcraft import blocks, header, pax_records

    def ext(kind: bytes, data: bytes) -> bytes:
        return header("././@LongLink", len(data), typeflag=kind) + blocks(data)

    def pax(kind: bytes, records: str) -> bytes:  # "k=v;k=v", repeats kept in order
        data = b"".join(pax_records(dict([r.split("=", 1)])) for r in records.split(";"))
        return header("./PaxHeaders/x", len(data), typeflag=kind) + blocks(data)

    own = header("short.txt", 3)
    return [
        (ext(b"L", b"first.txt\0") + ext(b"L", b"second.txt\0") + own, b"second"),
        (ext(b"L", b"first.txt\0") + ext(b"L", b"second.txt\0") + own, b"first"),
        (pax(b"x", "path=a.txt") + pax(b"x", "mtime=1") + own, b"short"),  # replaced
        (pax(b"x", "path=a.txt;path=b.txt") + own, b"b"),  # a local record: the last
        (pax(b"g", "path=a.txt;path=b.txt") + own, b"a"),  # a global record: the first
        (pax(b"g", "path=g.txt") + pax(b"x", "path=l.txt") + own, b"l"),  # local wins
        (pax(b"g", "path=g.txt") + ext(b"L", b"long.txt\0") + own, b"g"),  # PAX over L
        (header("n.txt", 3, magic="gnu", prefix=b"\x01\x02ab"), b"n"),  # GNU: no prefix
        (header("n.txt", 3, prefix=b"dir"), b"dir/n"),  # POSIX: the prefix joins
        (header("n.txt", 3, size_field=b"\x80" + b"\x40" + bytes(10)), b"n"),  # 2**86
        (header("n.txt", 3, size_field=b"\xff" * 12), b"n"),  # negative
    ]


def test_c_and_python_agree_on_gnu_naming_rules() -> None:
    import numpy as np

    mapread = source_extensions.mapread()
    assert mapread is not None
    expected = [OK, OTHER_NAME, OK, OK, OK, OK, OK, OK, OK, BAD_CHECKSUM, BAD_CHECKSUM]
    got = []
    for headers, key in crafted_header_runs():
        rows = np.array([[len(headers), 3, 0]], np.int64)
        c = mapread.members(headers + b"abc", 0, rows, 0, 1, ("txt",), key)
        python = check_headers(headers, key)
        assert (0 if isinstance(c, list) else c) == python, (headers[:120], key)
        got.append(python)
        assert check_headers(headers, b"") == (OK if python != BAD_CHECKSUM else BAD_CHECKSUM)
    assert got == expected


def test_scan_and_both_span_checks_share_one_size_limit() -> None:
    # A member may claim MAX_MEMBER_SIZE bytes and no more: the scan, the Python check
    # and the C check all draw the line there (base-256 headers; no data behind them).
    import numpy as np
    from tarcraft import header

    from indextar import ShardFormatError
    from indextar.tar.blocks import MAX_MEMBER_SIZE
    from indextar.tar.scan import scan_tar

    mapread = source_extensions.mapread()
    assert mapread is not None
    assert mapread.MAX_MEMBER_SIZE == MAX_MEMBER_SIZE == 2**62
    for size, expected in ((MAX_MEMBER_SIZE, OK), (MAX_MEMBER_SIZE + 1, BAD_CHECKSUM)):
        headers = header("n.txt", 3, size_field=b"\x80" + size.to_bytes(11, "big"))
        rows = np.array([[len(headers), 3, 0]], np.int64)
        c = mapread.members(headers + b"abc", 0, rows, 0, 1, ("txt",), b"n")
        assert (0 if isinstance(c, list) else c) == check_headers(headers, b"n") == expected
        with pytest.raises((TruncatedShardError, ShardFormatError)) as caught:
            scan_tar(headers + bytes(1024), shard="limit.tar")
        too_large = "more than any shard" in str(caught.value)
        assert too_large == (expected == BAD_CHECKSUM), caught.value


@pytest.mark.parametrize("c", [True, False])
def test_a_checksums_only_split_names_the_sample_it_is_told(
    c: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """split_members with key b"" (a shard whose names the span cannot tell: checksums
    only) names the sample ``name=`` in its error, as OpenShard's own C call did; it
    named b"" (sample '')."""
    import numpy as np

    from indextar.source import base

    if not c:
        monkeypatch.setattr(base, "_MAPREAD", None)
    elif base._MAPREAD is None:
        pytest.skip("_mapread is not built")
    span = tar_bytes({"k1.txt": b"abc"})[:1024]
    rows = np.array([[512, 3, 0]], np.int64)
    assert base.split_members(span, rows, 0, 1, ("txt",), b"", name=b"k1") == [("txt", b"abc")]
    damaged = bytearray(span)
    damaged[100] ^= 0x01  # a byte of the mode field: the header's checksum no longer holds
    with pytest.raises(StaleIndexError, match="promised sample 'k1'.*bad checksum"):
        base.split_members(damaged, rows, 0, 1, ("txt",), b"", shard="s.tar", name=b"k1")


def test_a_member_named_by_a_global_header_before_its_span_reads(tmp_path: Path) -> None:
    from tarcraft import BLOCK, blocks, header, pax_records

    def pax(kind: bytes, records: dict[str, str]) -> bytes:
        data = pax_records(records)
        return header("./PaxHeaders/x", len(data), typeflag=kind) + blocks(data)

    raw = (
        pax(b"g", {"path": "k.txt"})  # names every later member without a local path
        + pax(b"x", {"path": "a.txt"})
        + header("ignored.txt", 3)
        + blocks(b"aaa")
        + header("zzz.txt", 3)  # its span begins here: the global path is outside it
        + blocks(b"bbb")
        + bytes(2 * BLOCK)
    )
    path = tmp_path / "global.tar"
    path.write_bytes(raw)
    assert not build_index(path).meta.span_names
    ds = IndexedTarDataset(path)
    assert [(s["__key__"], s["txt"]) for s in (ds[0], ds[1])] == [("a", b"aaa"), ("k", b"bbb")]
    assert [s["__key__"] for s in ds.__getitems__([1, 0])] == ["k", "a"]
    ds.close()
    plain = tmp_path / "plain.tar"
    plain.write_bytes(tar_bytes(sample_members(3)))
    assert build_index(plain).meta.span_names


def test_a_damaged_header_in_a_shard_read_by_checksums_names_its_sample(tmp_path: Path) -> None:
    """A shard whose spans cannot tell their names (a global header names members) is
    read by the headers' checksums only; a damaged one is refused naming the sample's
    key, as in every other shard, not sample ''."""
    from tarcraft import BLOCK, blocks, header, pax_records

    def pax(kind: bytes, records: dict[str, str]) -> bytes:
        data = pax_records(records)
        return header("./PaxHeaders/x", len(data), typeflag=kind) + blocks(data)

    def named(name: str, data: bytes) -> bytes:
        return pax(b"x", {"path": name}) + header("ignored.txt", len(data)) + blocks(data)

    filler = bytes(70_000)  # past the first and before the last 64 KiB of the file,
    raw = bytearray(  # whose fingerprint the index checks at open
        pax(b"g", {"path": "k.txt"})
        + named("a.txt", b"aaa")
        + named("f1.txt", filler)
        + header("zzz.txt", 3)  # sample 'k', named by the global header
        + blocks(b"bbb")
        + named("f2.txt", filler)
        + bytes(2 * BLOCK)
    )
    path = tmp_path / "global.tar"
    path.write_bytes(raw)
    assert not build_index(path).meta.span_names
    at = raw.index(b"zzz.txt")
    raw[at + 100] ^= 0x01  # its mode field: the header's checksum no longer holds
    st = path.stat()
    path.write_bytes(raw)  # same size; the old mtime put back: only the header tells
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds = IndexedTarDataset(path)
    assert ds.__getitems__([0, 1, 3]) and [ds[i]["__key__"] for i in (0, 1, 3)] == ["a", "f1", "f2"]
    for read in (lambda: ds[2], lambda: ds.__getitems__([2, 0])):
        with pytest.raises(StaleIndexError, match="sample 'k'") as caught:
            read()
        assert "sample ''" not in str(caught.value)
        assert "global.tar" in str(caught.value) and str(at) in str(caught.value)
    assert ds[0]["txt"] == b"aaa"
    ds.close()
