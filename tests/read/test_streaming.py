"""StreamingTarDataset and the streaming tar reader, on local files (remote: test_remote.py)."""

from __future__ import annotations

import gzip
import io
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import numpy as np
import pytest
import torch.utils.data
import webdataset as wds
from conftest import sample_members, tar_bytes
from tarcraft import BLOCK, GNU_TAR, Crafter, blocks, gnu_tar, header

from indextar import scan_tar
from indextar.errors import IndextarError, SampleKeyError, ShardFormatError, TruncatedShardError
from indextar.read import streaming
from indextar.read.streaming import StreamingTarDataset
from indextar.tar.stream import iter_members

N = 30


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    paths = []
    for n, fmt in enumerate(("ustar", "gnu", "pax", "ustar")):
        path = tmp_path / f"part-{n}.tar"
        path.write_bytes(tar_bytes(sample_members(N, prefix=f"p{n}_"), fmt))
        paths.append(str(path))
    return paths


def keys(samples: Any) -> list[str]:
    return [s["__key__"] for s in samples]


# webdataset's reader leaves its file for the garbage collector to close.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("fmt", ["ustar", "gnu", "pax"])
def test_reader_matches_tarfile_and_webdataset(tmp_path: Path, fmt: str) -> None:
    long = (
        "long/" + "x" * 90 + ".txt" if fmt == "ustar" else "long/" + "x" * 150 + ".txt"
    )  # prefix field in ustar
    members = {**sample_members(5), "d/": None, long: b"long", "u.json": b"{}"}
    if fmt != "ustar":
        members["ü.json"] = b"[]"
    path = tmp_path / "a.tar"
    path.write_bytes(tar_bytes(members, fmt))
    with open(path, "rb") as f:
        got = {m.name: m.data for m in iter_members(f, shard=str(path))}
    assert got == {k: v for k, v in members.items() if isinstance(v, bytes)}
    ours = list(StreamingTarDataset(str(path)))
    theirs = list(wds.WebDataset(str(path), shardshuffle=False))
    assert [{k: v for k, v in s.items() if not k.startswith("__")} for s in ours] == [
        {k: v for k, v in s.items() if not k.startswith("__")} for s in theirs
    ]


def test_corrupt_header_raises_with_offset(tmp_path: Path) -> None:
    intact = tar_bytes(sample_members(4))
    data = bytearray(intact)
    data[512 * 4 + 10] ^= 0xFF  # the third member's header
    with pytest.raises(ShardFormatError, match="bad header checksum") as info:
        list(iter_members(io.BytesIO(bytes(data)), shard="x.tar"))
    assert info.value.offset == 2048 and "'x.tar'" in str(info.value)
    with pytest.raises(TruncatedShardError, match="inside a member"):
        list(iter_members(io.BytesIO(intact[: 2048 + 600]), shard="x.tar"))
    with pytest.raises(TruncatedShardError, match="end-of-archive"):
        list(iter_members(io.BytesIO(intact[:2048]), shard="x.tar"))


def test_gzip_shards(tmp_path: Path, shards: list[str]) -> None:
    gz = tmp_path / "part-0.tar.gz"
    gz.write_bytes(gzip.compress(Path(shards[0]).read_bytes()))
    assert keys(StreamingTarDataset(str(gz))) == keys(StreamingTarDataset(shards[0]))
    assert (
        list(StreamingTarDataset(str(gz)))[3]["jpg"]
        == list(StreamingTarDataset(shards[0]))[3]["jpg"]
    )


def test_decode_and_keys(tmp_path: Path) -> None:
    path = tmp_path / "d.tar"
    path.write_bytes(
        tar_bytes({"k0.cls": b"3", "k0.txt": b"hi", "k1.cls": b"4", "k1.json": b"[1]"})
    )
    assert list(StreamingTarDataset(str(path), decode=[], keys=("cls", "txt;json"))) == [
        (3, "hi"),
        (4, [1]),
    ]
    with pytest.raises(SampleKeyError, match="has no 'npy' member; it has"):
        next(iter(StreamingTarDataset(str(path), keys=("npy",))))


def test_split_over_workers_and_ranks(shards: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    everything = sorted(keys(StreamingTarDataset(shards)))
    loader = torch.utils.data.DataLoader(
        StreamingTarDataset(shards), batch_size=None, num_workers=2
    )
    assert sorted(keys(loader)) == everything
    seen = []
    for rank in range(2):
        monkeypatch.setattr(streaming, "_split_info", lambda rank=rank: (rank, 2, 0, 1))
        seen.append(keys(StreamingTarDataset(shards)))
    assert sorted(seen[0] + seen[1]) == everything and not set(seen[0]) & set(seen[1])


def test_too_few_shards_raises_instead_of_hanging(shards: list[str]) -> None:
    loader = torch.utils.data.DataLoader(
        StreamingTarDataset(shards[:1]), batch_size=None, num_workers=2
    )
    with pytest.raises(IndextarError, match=r"1 shards cannot be split over 1 rank\(s\) x 2"):
        list(loader)


def test_shuffle_is_seeded_and_changes_per_epoch(shards: list[str]) -> None:
    ds = StreamingTarDataset(shards, shuffle=50, seed=3)
    epoch0, epoch1 = keys(ds), keys(ds)
    assert sorted(epoch0) == sorted(epoch1) == sorted(keys(StreamingTarDataset(shards)))
    assert epoch0 != epoch1 and epoch0 != keys(StreamingTarDataset(shards))
    again = StreamingTarDataset(shards, shuffle=50, seed=3)
    assert keys(again) == epoch0
    again.set_epoch(1)
    assert keys(again) == epoch1
    assert keys(StreamingTarDataset(shards, shuffle=50, seed=4)) != epoch0


def test_resampled_and_epoch_length(shards: list[str]) -> None:
    ds = StreamingTarDataset(shards, resampled=True, epoch_length=250, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = keys(loader)
    assert len(got) == 250 == len(ds)
    assert len(set(got)) < 250  # drawn with replacement: repeats over 120 samples
    # Without resampling, a global epoch length cycles the shards.
    cycled = keys(StreamingTarDataset(shards[:2], epoch_length=100))
    assert (
        len(cycled) == 100
        and cycled[:60] == keys(StreamingTarDataset(shards[:2]))
        and cycled[60] == "p0_000000"
    )


def test_handler_warn_skips_with_shard_and_key(
    tmp_path: Path, shards: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    data = bytearray(tar_bytes({"a.txt": b"1", "b.txt": b"2", "c.txt": b"3"}))
    data[1024 + 5] ^= 0x55  # b.txt's header
    corrupt = tmp_path / "corrupt.tar"
    corrupt.write_bytes(bytes(data))
    bad = tmp_path / "bad.tar"
    bad.write_bytes(tar_bytes({"a.txt": b"1", "b.cls": b"not a number", "c.txt": b"3"}))
    good = tmp_path / "good.tar"
    good.write_bytes(tar_bytes(sample_members(N, exts=("jpg", "txt"))))
    with caplog.at_level(logging.WARNING, "indextar.read.streaming"):
        got = keys(
            StreamingTarDataset([str(corrupt), str(bad), str(good)], handler="warn", decode=[])
        )
    # corrupt.tar: "a" is dropped too, as it may have members after the damage.
    assert got[:2] == ["a", "c"] and len(got) == 2 + N
    assert f"skipping shard {str(corrupt)!r}" in caplog.text and "offset 1024" in caplog.text
    assert f"skipping sample 'b' of shard {str(bad)!r}" in caplog.text
    with pytest.raises(ShardFormatError):
        list(StreamingTarDataset([str(corrupt)]))
    from indextar.read.streaming import _group

    grouped = list(
        _group(
            iter_members(
                io.BytesIO(tar_bytes({"b.CLS": b"1", "b.cls": b"2", "c.txt": b""})), shard="x"
            ),
            "x",
        )
    )
    assert isinstance(grouped[0], ShardFormatError) and "two 'cls' members" in str(grouped[0])
    assert [g["__key__"] for g in grouped[1:]] == ["c"]  # type: ignore[index]


def test_import_indextar_stays_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, indextar; heavy = [m for m in ('torch', 'fsspec', 'aiohttp', 's3fs', "
        "'filelock') if m in sys.modules]; assert not heavy, heavy; "
        "indextar.StreamingTarDataset; assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the stream refuses what the scanner refuses -------------------------------------------


def scanned_and_streamed(data: bytes) -> tuple[Any, Any]:
    """What scan_tar and iter_members make of ``data``: the regular files' names, or
    the error's class, offset and message (without the shard)."""

    def outcome(read: Callable[[], list[str]]) -> object:
        try:
            return read()
        except ShardFormatError as e:
            return type(e).__name__, e.offset, str(e).split(": ", 1)[1]

    def scanned() -> list[str]:
        scan = scan_tar(data, shard="s.tar")
        return [scan.names[i] for i in np.flatnonzero(scan.is_regular())]

    def streamed() -> list[str]:
        return [m.name for m in iter_members(io.BytesIO(data), shard="s.tar")]  # type: ignore[arg-type]

    return outcome(scanned), outcome(streamed)


@pytest.mark.parametrize(
    "version",
    ["0.0", "0.1", "1.0"],  # tar --format=posix writes 1.0 unless told otherwise
)
@pytest.mark.skipif(not os.path.exists(GNU_TAR), reason="GNU tar is not installed")
def test_stream_refuses_gnu_tar_pax_sparse_files(version: str, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.jpg").write_bytes(b"dense")
    with open(root / "holes.bin", "wb") as f:
        f.write(b"head")
        f.seek(1 << 20)
        f.write(b"tail")
    if os.stat(root / "holes.bin").st_blocks * 512 >= 1 << 20:
        pytest.skip(f"the filesystem under {root} has no sparse files, so tar --sparse stores none")
    options = ("--sparse", "--format=posix", f"--sparse-version={version}")
    archive = gnu_tar(tmp_path / "s.tar", root, ["a.jpg", "holes.bin"], *options)
    scanned, streamed = scanned_and_streamed(archive.read_bytes())
    assert scanned == streamed == ("UnsupportedMemberError", ANY, ANY)
    assert isinstance(scanned, tuple) and scanned[1] > 0
    assert "member 'holes.bin' is a PAX sparse file" in scanned[2]


@pytest.mark.parametrize("typeflag", [b"x", b"g"])
@pytest.mark.parametrize(
    "records",
    [
        {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s.bin"},
        {"GNU.sparse.size": "9", "GNU.sparse.numblocks": "1"},
        {"GNU.sparse.map": "0,3", "GNU.sparse.size": "9"},
    ],
    ids=["1.0", "0.0", "0.1"],
)
def test_stream_refuses_pax_sparse_records(records: dict[str, str], typeflag: bytes) -> None:
    crafter = Crafter().member("ok.bin", b"ok").pax(records, typeflag=typeflag)
    data = crafter.member("GNUSparseFile.0/s.bin", b"abc").finish()
    scanned, streamed = scanned_and_streamed(data)
    assert scanned == streamed == ("UnsupportedMemberError", 2 * BLOCK, ANY)


def with_field(block: bytes, start: int, raw: bytes) -> bytes:
    """Header ``block`` with ``raw`` at ``start``, its checksum recomputed."""
    out = bytearray(block)
    out[start : start + len(raw)] = raw
    out[148:156] = b" " * 8
    out[148:156] = f"{sum(out):06o}".encode() + b"\0 "
    return bytes(out)


@pytest.mark.parametrize(
    "form, valid",
    [
        ("{:06o}\0 ", True),
        (" {:05o}\0\0", True),  # a leading space, NUL padding: strict readers take these
        ("+{:05o}\0 ", False),  # int(x, 8) takes a sign, a 0o prefix and underscores
        ("0o{:05o}\0", False),
        ("0_{:05o}\0", False),
    ],
)
def test_stream_reads_checksums_as_strictly_as_the_scanner(form: str, valid: bool) -> None:
    block = bytearray(header("b.txt", 1))
    block[148:156] = b" " * 8
    checksum = form.format(sum(block)).encode()
    assert len(checksum) == 8 and int(checksum.rstrip(b"\0 "), 8) == sum(block)
    block[148:156] = checksum
    data = header("a.txt", 1) + blocks(b"a") + bytes(block) + blocks(b"b") + bytes(1024)
    scanned, streamed = scanned_and_streamed(data)
    if valid:
        assert scanned == streamed == ["a.txt", "b.txt"]
    else:  # each words the message its own way
        assert scanned[:2] == streamed[:2] == ("ShardFormatError", 2 * BLOCK)


@pytest.mark.parametrize(
    "magic, joined",
    [
        (b"ustar\x0000", True),  # POSIX: magic and version
        # The magic without the version "00": the scanner and the C walker take no
        # prefix (GNU tar and tarfile would), and the stream follows the scanner.
        (b"ustar\x00\x00\x00", False),
        (b"ustar\x00  ", False),
        (b"ustar  \x00", False),  # GNU: those bytes are not a prefix
    ],
)
def test_stream_joins_the_prefix_field_as_the_scanner(magic: bytes, joined: bool) -> None:
    block = with_field(header("name.txt", 1, prefix="pre/fix"), 257, magic)
    data = header("a.txt", 1) + blocks(b"a") + block + blocks(b"b") + bytes(1024)
    scanned, streamed = scanned_and_streamed(data)
    assert scanned == streamed == ["a.txt", "pre/fix/name.txt" if joined else "name.txt"]
