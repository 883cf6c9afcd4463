"""Indexes of compressed shards (issue 15): foreign .tar.gz through seek points, .tar.zst
by frames, one-frame .tar.zst refused; truncated, corrupt and stale files; version 2."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import random
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zstandard
from conftest import tar_bytes
from readers import wds_samples
from tarcraft import GNU_TAR, write_tree

import indextar
from indextar.index.arrays import read_layout
from indextar.index.verify import verify_index
from indextar.source.seekpoints import SeekPoints
from indextar.tar.compress import zstd_frame_spans


def members(n: int, size: int = 3000) -> dict[str, bytes]:
    """``n`` samples of a ``bin`` member (half random, so the stream is long) and a ``txt``."""
    rng = np.random.default_rng(n)
    out: dict[str, bytes] = {}
    for i in range(n):
        out[f"s{i:05d}.bin"] = rng.integers(0, 256, size // 2, np.uint8).tobytes() + bytes(
            size // 2
        )
        out[f"s{i:05d}.txt"] = f"sample {i}".encode()
    return out


def samples_of(ds: indextar.IndexedTarDataset) -> list[dict[str, object]]:
    return [{k: v for k, v in ds[i].items() if k != "__url__"} for i in range(len(ds))]


def expected(tar: bytes) -> list[dict[str, object]]:
    return wds_samples(tar)


def gnu_targz(tmp_path: Path, files: dict[str, bytes], name: str = "gnu.tar.gz") -> Path:
    root = tmp_path / "tree"
    write_tree(root, files)
    archive = tmp_path / name
    subprocess.run(
        [GNU_TAR, "--sort=name", "-czf", str(archive), "-C", str(root), "."],
        check=True,
        env={**os.environ, "LC_ALL": "C.UTF-8"},
    )
    return archive


def test_gnu_tar_czf_is_indexed_and_read_through_seek_points(tmp_path: Path) -> None:
    files = members(400, size=6000)  # over 1 MiB compressed: zran runs beside zlib
    archive = gnu_targz(tmp_path, files)
    assert archive.stat().st_size > 1 << 20
    index = indextar.build_index(archive, seek_spacing=65536)
    assert index.meta.compression == "gzip" and index.meta.seek_spacing == 65536
    assert index.meta.shard_size == archive.stat().st_size
    plain = subprocess.run(["gzip", "-dc", str(archive)], capture_output=True, check=True).stdout
    assert index.meta.uncompressed_size == len(plain)
    points = read_layout(index.path, index.meta).seek_points
    assert points is not None
    assert len(points.points) >= index.meta.uncompressed_size // 65536 - 2  # ~2.6 MB
    ds = indextar.IndexedTarDataset(str(archive))
    got = samples_of(ds)
    want = expected(plain)
    assert [s["__key__"] for s in got] == [s["__key__"] for s in want]
    assert [(s["bin"], s["txt"]) for s in got] == [(s["bin"], s["txt"]) for s in want]
    # random order: every read starts from its own seek point
    order = np.random.default_rng(0).permutation(len(ds)).tolist()
    assert [ds[i]["bin"] for i in order] == [want[i]["bin"] for i in order]


def test_webdataset_tgz_writer(tmp_path: Path) -> None:
    import webdataset

    path = tmp_path / "wds-000000.tgz"
    with webdataset.TarWriter(str(path)) as sink:
        for i in range(200):
            sink.write({"__key__": f"k{i:04d}", "txt": f"text {i}" * 50, "cls": i % 7})
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    ds = indextar.IndexedTarDataset(str(path))
    want = [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")}
            for s in wds_samples(subprocess.run(["gzip", "-dc", str(path)], capture_output=True,
                                                check=True).stdout)]  # fmt: skip
    assert len(ds) == 200
    assert [ds[i]["txt"] for i in (199, 0, 57)] == [want[i]["txt"] for i in (199, 0, 57)]
    assert [ds[i]["__key__"] for i in range(200)] == [s["__key__"] for s in want]


def test_seek_points_round_trip_zran_format(tmp_path: Path) -> None:
    archive = gnu_targz(tmp_path, members(60))
    index = indextar.build_index(archive, seek_spacing=65536)
    points = read_layout(index.path, index.meta).seek_points
    assert points is not None
    again = SeekPoints.from_zran_index(points.zran_index())
    assert np.array_equal(again.points, points.points)
    assert again.uncompressed_size == points.uncompressed_size
    assert [len(w) > 0 for w in again.windows] == [len(w) > 0 for w in points.windows]
    assert points.points[0].tolist()[2] == 0  # the first point is the stream's start


def zstd_frames_file(tar: bytes, chunk: int, *, skippable: bool = True) -> bytes:
    """A multi-frame .zst: ``chunk``-byte runs of ``tar`` each compressed alone, with a
    skippable frame (as the seekable format's seek table) in the middle and at the end."""
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)  # as the zstd CLI
    frames = [cctx.compress(tar[i : i + chunk]) for i in range(0, len(tar), chunk)]
    skip = b"\x5e\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"seek"
    if skippable:
        frames.insert(len(frames) // 2, skip)
        frames.append(skip)
    return b"".join(frames)


def test_multi_frame_zstd_is_read_by_frame(tmp_path: Path) -> None:
    tar = tar_bytes(members(80))
    path = tmp_path / "multi.tar.zst"
    path.write_bytes(zstd_frames_file(tar, 20_000))
    listed = subprocess.run([GNU_TAR, "--zstd", "-tf", str(path)], capture_output=True, text=True)
    assert listed.returncode == 0 and len(listed.stdout.split()) == 160
    spans = zstd_frame_spans(path.read_bytes())
    assert sum(1 for *_, data in spans if not data) == 2
    index = indextar.build_index(path)
    assert index.meta.compression == "zstd" and index.meta.seek_spacing == 0
    frames = read_layout(index.path, index.meta).frames
    assert frames is not None and len(frames) == (len(tar) + 19_999) // 20_000
    ds = indextar.IndexedTarDataset(str(path))
    want = expected(tar)
    assert [ds[i]["bin"] for i in range(len(ds) - 1, -1, -1)] == [s["bin"] for s in want[::-1]]


def test_single_frame_zstd_is_refused_with_a_conversion_hint(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    write_tree(root, members(10))
    path = tmp_path / "one.tar.zst"
    subprocess.run([GNU_TAR, "--zstd", "-cf", str(path), "-C", str(root), "."], check=True)
    with pytest.raises(indextar.CompressedShardError) as err:
        indextar.build_index(path)
    message = str(err.value)
    assert str(path) in message and "one zstd frame" in message
    assert "indextar recompress" in message and "one-framed.tar.zst" in message
    assert not indextar.index_path(path).exists()


def test_truncated_gzip_names_shard_and_offset(tmp_path: Path) -> None:
    archive = gnu_targz(tmp_path, members(40))
    data = archive.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(indextar.TruncatedShardError) as err:
        indextar.build_index(cut)
    assert err.value.shard == str(cut) and err.value.offset == 0
    assert "truncated" in str(err.value) and "gzip member" in str(err.value)
    assert not indextar.index_path(cut).exists()


def test_gzip_cut_at_its_trailer_is_truncated_not_shorter(tmp_path: Path) -> None:
    archive = gnu_targz(tmp_path, members(10))
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[:-4])  # no ISIZE: every deflate byte is there
    with pytest.raises(indextar.TruncatedShardError):
        indextar.build_index(cut)


def test_corrupt_deflate_block_names_shard_and_offset(tmp_path: Path) -> None:
    archive = gnu_targz(tmp_path, members(40))
    data = bytearray(archive.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)  # zeros: an invalid block or a CRC mismatch
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(indextar.ShardFormatError) as err:
        indextar.build_index(bad)
    assert err.value.shard == str(bad) and err.value.offset is not None
    assert "corrupt gzip data" in str(err.value) or "truncated" in str(err.value)
    assert not indextar.index_path(bad).exists()


def test_trailing_garbage_after_gzip_is_an_error(tmp_path: Path) -> None:
    archive = gnu_targz(tmp_path, members(5))
    size = archive.stat().st_size
    with open(archive, "ab") as f:
        f.write(b"garbage!")
    with pytest.raises(indextar.ShardFormatError) as err:
        indextar.build_index(archive)
    assert err.value.offset == size


def test_truncated_and_corrupt_zstd_frames(tmp_path: Path) -> None:
    tar = tar_bytes(members(30))
    data = zstd_frames_file(tar, 20_000, skippable=False)
    cut = tmp_path / "cut.tar.zst"
    cut.write_bytes(data[:-10])
    with pytest.raises(indextar.TruncatedShardError) as err:
        indextar.build_index(cut)
    assert err.value.shard == str(cut) and "zstd frame" in str(err.value)
    second = zstd_frame_spans(data)[1][0]
    bad = bytearray(data)
    bad[second + 20 : second + 40] = b"\xff" * 20
    path = tmp_path / "bad.tar.zst"
    path.write_bytes(bytes(bad))
    with pytest.raises(indextar.ShardFormatError) as err:
        indextar.build_index(path)
    assert err.value.shard == str(path) and err.value.offset is not None
    assert not indextar.index_path(path).exists()


def test_a_bad_tar_inside_says_its_offset_is_decompressed(tmp_path: Path) -> None:
    tar = bytearray(tar_bytes(members(5)))
    tar[3584 + 148] ^= 0x01  # the second header's checksum (s00000.bin takes 3584 bytes)
    path = tmp_path / "badtar.tar.gz"
    path.write_bytes(subprocess.run(["gzip", "-c"], input=bytes(tar), capture_output=True,
                                    check=True).stdout)  # fmt: skip
    with pytest.raises(indextar.ShardFormatError) as err:
        indextar.build_index(path)
    assert "decompressed tar" in str(err.value) and err.value.shard == str(path)


def test_stale_index_of_a_gzip_shard(tmp_path: Path) -> None:
    archive = gnu_targz(tmp_path, members(20))
    indextar.build_index(archive)
    ds = indextar.IndexedTarDataset(str(archive))
    assert ds[3]["txt"] == b"sample 3"
    replaced = gnu_targz(tmp_path, {**members(20), "zzz.txt": b"new"}, name="new.tar.gz")
    os.replace(replaced, archive)
    with pytest.raises(indextar.StaleIndexError) as err:
        indextar.IndexedTarDataset(str(archive))
    assert str(archive) in str(err.value)
    assert indextar.build_index(archive, force=True).meta.num_samples == 21


def test_an_index_of_format_version_2_is_still_read(make_tar, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shard = make_tar(members(12))
    index = indextar.build_index(shard)
    with contextlib.closing(sqlite3.connect(index.path)) as conn, conn:
        # what version 2 wrote: no frames or seek_points tables, no compression facts
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'format_version'")
        conn.execute(
            "DELETE FROM meta WHERE key IN ('compression', 'uncompressed_size', 'seek_spacing')"
        )
        conn.execute("DROP TABLE frames")
        conn.execute("DROP TABLE seek_points")
    reopened = indextar.open_index(shard)
    assert reopened.meta.format_version == 2 and reopened.meta.compression == ""
    ds = indextar.IndexedTarDataset(str(shard))
    assert ds[11]["txt"] == b"sample 11" and indextar.build_index(shard).meta.format_version == 2


def test_an_index_of_an_unknown_version_is_refused(make_tar) -> None:  # type: ignore[no-untyped-def]
    shard = make_tar(members(2))
    index = indextar.build_index(shard)
    with contextlib.closing(sqlite3.connect(index.path)) as conn, conn:
        conn.execute("UPDATE meta SET value = '5' WHERE key = 'format_version'")
    with pytest.raises(indextar.IndexFormatError, match="reads formats 2, 3, 4"):
        indextar.open_index(shard)


def test_index_size_of_seek_points_is_small(tmp_path: Path) -> None:
    files = {f"t{i:05d}.txt": (f"line {i} " * 40).encode() for i in range(2000)}
    archive = gnu_targz(tmp_path, files)
    index = indextar.build_index(archive)  # 1 MiB spacing
    layout = read_layout(index.path, index.meta)
    assert layout.seek_points is not None
    # text windows compress: far less than 32 KiB a point
    assert layout.index_bytes() < 16 * 1024 * len(layout.seek_points.points)
    assert io.BytesIO(layout.seek_points.zran_index()).getbuffer().nbytes > 32768


def test_verify_decompresses_again_and_compares_frames_and_points(tmp_path: Path) -> None:
    archive = gnu_targz(tmp_path, members(400, size=6000))
    indextar.build_index(archive, seek_spacing=65536)
    framed = tmp_path / "multi.tar.zst"
    framed.write_bytes(zstd_frames_file(tar_bytes(members(40)), 20_000))
    index = indextar.build_index(framed)
    assert verify_index(archive).ok and verify_index(framed).ok
    with contextlib.closing(sqlite3.connect(index.path)) as conn, conn:
        conn.execute("UPDATE frames SET compressed_size = compressed_size - 1 WHERE frame_id = 2")
    report = verify_index(framed)
    assert not report.ok and report.problems[0].startswith("frame 2: index has")
    gz_index = indextar.open_index(archive)
    with contextlib.closing(sqlite3.connect(gz_index.path)) as conn, conn:
        conn.execute("UPDATE seek_points SET window = NULL WHERE point_id = 3")
    assert verify_index(archive).problems == [
        "seek points: their windows differ from the shard's data"
    ]


def test_reads_in_order_decompress_each_span_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indextar.source import gzipped
    from indextar.source.spancache import SpanCache

    files = members(300, size=6000)
    archive = gnu_targz(tmp_path, files)
    indextar.build_index(archive, seek_spacing=65536)
    ds = indextar.IndexedTarDataset(str(archive))
    with ds._leased(0) as shard:
        source = shard.source  # the source ds reads through, kept open by ds
    assert isinstance(source, gzipped.GzipSeekSource)
    source.cache = SpanCache(0)  # no cache: the last span alone serves reads in order
    spans: list[tuple[int, int]] = []
    decompress = source._decompress

    def recorded(point: int, end: int, whole: bool) -> bytes:
        data = decompress(point, end, whole)
        spans.append((point, source._starts[point] + len(data)))
        return data

    monkeypatch.setattr(source, "_decompress", recorded)
    want = expected(tar_bytes(files))
    assert [ds[i]["bin"] for i in range(300)] == [s["bin"] for s in want]
    in_order = spans[:]  # the jumps below add more
    # ~2 MB in 64 KiB spans: after the first read (to its own end: nothing says the
    # next will follow), each span decompressed once, to a seek point or the end
    points = source._starts + [source.size]
    assert in_order[0][0] == 0 and in_order[0][1] < 10_000 and in_order[1][0] == 0
    assert [p for p, _ in in_order[1:]] == sorted({p for p, _ in in_order[1:]})
    assert all(e in points for _, e in in_order[1:])
    assert sum(e - points[p] for p, e in in_order[1:]) < source.size + 2 * 65536
    # a jump goes back to a seek point, and reads in order after it read on again
    order = [250, 3, 4, 5, 120, 121, 7, 299, 298]
    assert [ds[i]["bin"] for i in order] == [want[i]["bin"] for i in order]


def test_seek_points_that_map_samples_onto_other_bytes_are_a_corrupt_index(
    tmp_path: Path,
) -> None:
    """A seek point moved inside the tar (found by the fuzzer's ``ztables``) decompresses
    other bytes than the samples': the index is corrupt, not stale (the shard did not
    change), and the error says so."""
    rng = random.Random(5)
    text = [bytes(rng.choices(b"abcdefgh \n", k=rng.randint(100, 9000))) for _ in range(40)]
    archive = tmp_path / "stream.tar.gz"
    archive.write_bytes(gzip.compress(tar_bytes({f"k{i:03d}.txt": t for i, t in enumerate(text)})))
    index = indextar.build_index(archive, seek_spacing=32768)
    with contextlib.closing(sqlite3.connect(index.path)) as conn:
        conn.execute("UPDATE seek_points SET uncompressed_offset = uncompressed_offset + 2048 "
                     "WHERE point_id = 1")  # fmt: skip
        conn.commit()
    ds = indextar.IndexedTarDataset(str(archive))
    errors = []
    for i in reversed(range(len(ds))):  # each read from its own seek point
        try:
            ds[i]
        except indextar.IndextarError as e:
            errors.append(e)
    assert not [e for e in errors if isinstance(e, indextar.StaleIndexError)], errors
    corrupt = [e for e in errors if isinstance(e, indextar.IndexFormatError)]
    assert corrupt, errors
    assert all("is corrupt" in str(e) and "seek points" in str(e) for e in corrupt)
    assert str(archive) in str(corrupt[0])
