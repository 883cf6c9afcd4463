"""A gzip shard decompressed, checked and given its seek points in one pass
(``_gunzip.c``), against the reference: zlib's checked pass, then indexed_gzip's.

Both must give the same tar, the same member spans, the same seek points and windows
(zran's rule, and the point zran adds at the end of the file) and the same errors.
"""

from __future__ import annotations

import gzip
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_compressed import gnu_targz, members

import indextar
from indextar import native
from indextar.index.arrays import CompressedLayout
from indextar.index.decompress import decompress_shard

assert native.built()["_gunzip"], "indextar/source/_gunzip.c did not build"


def both(
    path: Path, spacing: int, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[bytearray, CompressedLayout]]:
    data = path.read_bytes()
    out = [decompress_shard(memoryview(data), "gzip", shard=path, seek_spacing=spacing)]
    with monkeypatch.context() as patch:
        patch.setenv(native.PURE_PYTHON_ENV, "1")
        out.append(decompress_shard(memoryview(data), "gzip", shard=path, seek_spacing=spacing))
    return out


def assert_same(c: CompressedLayout, reference: CompressedLayout) -> None:
    if reference.seek_points is None:
        assert c.seek_points is None
        assert c.frames is not None and reference.frames is not None
        assert np.array_equal(c.frames, reference.frames)
        return
    ours, theirs = c.seek_points, reference.seek_points
    assert ours is not None and c.frames is None
    assert (ours.compressed_size, ours.uncompressed_size, ours.spacing) == (
        theirs.compressed_size,
        theirs.uncompressed_size,
        theirs.spacing,
    )
    assert np.array_equal(ours.points, theirs.points)
    # ours keep only the window bytes a read from the point can reference (the rest
    # zero); zran's are whole: they agree at every byte ours keep
    assert [bool(w) for w in ours.windows] == [bool(w) for w in theirs.windows]
    assert theirs.windows_agree(ours)


def noise(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.mark.parametrize("spacing", [1 << 16, 1 << 17])
def test_gnu_tar_czf_same_points_as_zran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spacing: int
) -> None:
    files = {f"s{i:04d}.bin": noise(7000, i) + b"x" * 5000 for i in range(120)}
    archive = gnu_targz(tmp_path, files)
    (data, c), (ref_data, reference) = both(archive, spacing, monkeypatch)
    assert data == ref_data
    assert_same(c, reference)
    points = c.seek_points
    assert points is not None and len(points.points) >= len(data) // (2 * spacing)
    ds = indextar.IndexedTarDataset(str(archive))  # built through the one pass
    assert ds[117]["bin"] == files["s0117.bin"]


def test_concatenated_members_and_tiny_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blob = noise(300_000, 1) + b"abc" * 300_000
    cases = {
        "multi.gz": gzip.compress(blob[:700_000]) + gzip.compress(blob[700_000:]),
        "small.gz": gzip.compress(b"x" * 100),
        "empty.gz": gzip.compress(b""),
        "framed.gz": b"".join(gzip.compress(noise(3000, i)) for i in range(20)),
    }
    for name, payload in cases.items():
        path = tmp_path / name
        path.write_bytes(payload)
        (data, c), (ref_data, reference) = both(path, 1 << 16, monkeypatch)
        assert data == ref_data == gzip.decompress(payload), name
        assert_same(c, reference)
    framed = both(tmp_path / "framed.gz", 1 << 16, monkeypatch)[0][1]
    assert framed.frames is not None and len(framed.frames) == 20


def errors(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[type, int | None, str]]:
    got = []
    for pure in (False, True):
        with monkeypatch.context() as patch:
            if pure:
                patch.setenv(native.PURE_PYTHON_ENV, "1")
            with pytest.raises(indextar.ShardFormatError) as err:
                decompress_shard(memoryview(path.read_bytes()), "gzip", shard=path)
        got.append((type(err.value), err.value.offset, str(err.value).split(" (")[0]))
    return got


def test_the_same_errors_as_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tar_gz = gnu_targz(tmp_path, members(60))
    data = tar_gz.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    ours, theirs = errors(cut, monkeypatch)
    assert ours == theirs and ours[0] is indextar.TruncatedShardError and ours[1] == 0
    no_isize = tmp_path / "no-isize.tar.gz"
    no_isize.write_bytes(data[:-4])
    ours, theirs = errors(no_isize, monkeypatch)
    assert ours == theirs and ours[0] is indextar.TruncatedShardError
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(data + b"garbage!")
    ours, theirs = errors(garbage, monkeypatch)
    assert ours == theirs and ours[1] == len(data)
    crc = bytearray(data)
    crc[-8] ^= 0xFF  # the CRC32 of the whole stream
    bad_crc = tmp_path / "crc.tar.gz"
    bad_crc.write_bytes(bytes(crc))
    ours, theirs = errors(bad_crc, monkeypatch)
    assert ours[0] is theirs[0] is indextar.ShardFormatError
    assert "corrupt gzip data in the member that starts at compressed byte offset 0" in ours[2]
    isize = bytearray(data)
    isize[-1] ^= 0x01  # ISIZE
    bad_size = tmp_path / "isize.tar.gz"
    bad_size.write_bytes(bytes(isize))
    assert errors(bad_size, monkeypatch)[0][0] is indextar.ShardFormatError
    block = bytearray(data)
    block[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    bad_block = tmp_path / "block.tar.gz"
    bad_block.write_bytes(bytes(block))
    for kind, offset, message in errors(bad_block, monkeypatch):
        assert issubclass(kind, indextar.ShardFormatError) and offset is not None
        assert "corrupt gzip data" in message or "truncated" in message


def test_a_gzip_1_file_is_read_back_from_the_one_pass_points(tmp_path: Path) -> None:
    """GNU gzip -1 output, read back sample by sample from the one pass's points."""
    files = {f"s{i:04d}.bin": noise(20_000, i) for i in range(60)}
    tar = tmp_path / "t.tar"
    with indextar.TarWriter(tar) as sink:
        for name, payload in files.items():
            sink.write({"__key__": name[:-4], "bin": payload})
    archive = tmp_path / "t.tar.gz"
    with open(archive, "wb") as out:
        subprocess.run(["gzip", "-1", "-c", str(tar)], stdout=out, check=True)
    index = indextar.build_index(archive, seek_spacing=1 << 16)
    assert index.meta.seek_spacing == 1 << 16
    ds = indextar.IndexedTarDataset(str(archive))
    for i in random.Random(3).sample(range(60), 20):
        assert ds[i]["bin"] == files[f"s{i:04d}.bin"]
