"""ShardWriter(compress=...) (issue 15): one gzip member or zstd frame per sample, read
back by GNU tar and webdataset, and one read of exactly a sample's bytes per ds[i]."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from indexrows import load_samples
from readers import wds_samples
from tarcraft import GNU_TAR

import indextar
from indextar.index.arrays import read_layout
from indextar.source.base import ByteSource
from indextar.source.frames import FramedSource

SUFFIX = {"gzip": "tar.gz", "zstd": "tar.zst"}
TAR_FLAG = {"gzip": "-z", "zstd": "--zstd"}
DECOMPRESS = {"gzip": ["gzip", "-dc"], "zstd": ["zstd", "-dc"]}


def record(i: int) -> dict[str, object]:
    rng = np.random.default_rng(i)
    return {
        "__key__": f"k{i:05d}",
        "txt": f"caption {i} " * (1 + i % 5),
        "bin": rng.integers(0, 256, 200 + i % 300, np.uint8).tobytes(),
        "cls": i % 10,
    }


def write(tmp_path: Path, codec: str, n: int = 120, maxcount: int = 50) -> list[str]:
    with indextar.ShardWriter(
        str(tmp_path / f"out-%03d.{SUFFIX[codec]}"), maxcount=maxcount, compress=codec
    ) as sink:
        for i in range(n):
            sink.write(record(i))
    return sink.shards


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_gnu_tar_and_webdataset_read_per_sample_shards(tmp_path: Path, codec: str) -> None:
    shards = write(tmp_path, codec)
    assert len(shards) == 3
    out = tmp_path / "extracted"
    out.mkdir()
    for shard in shards:
        subprocess.run([GNU_TAR, TAR_FLAG[codec], "-xf", shard, "-C", str(out)], check=True)
    assert (out / "k00007.txt").read_bytes() == b"caption 7 " * 3
    assert (out / "k00119.bin").read_bytes() == record(119)["bin"]
    assert len(os.listdir(out)) == 120 * 3
    # webdataset's streaming reader, on the byte stream the standard tool decompresses
    plain = subprocess.run([*DECOMPRESS[codec], shards[1]], capture_output=True, check=True).stdout
    got = wds_samples(plain)
    assert [s["__key__"] for s in got] == [f"k{i:05d}" for i in range(50, 100)]
    assert got[3]["bin"] == record(53)["bin"] and got[3]["cls"] == b"3"
    if codec == "gzip":  # tarfile (and so webdataset's url opener) reads .tar.gz itself
        with tarfile.open(shards[0]) as tf:
            assert len(tf.getnames()) == 150


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_the_index_holds_one_frame_per_sample(tmp_path: Path, codec: str) -> None:
    shard = write(tmp_path, codec, n=30, maxcount=100)[0]
    index = indextar.open_index(shard)
    assert index.meta.compression == codec and index.meta.seek_spacing == 0
    frames = read_layout(index.path, index.meta).frames
    assert frames is not None and len(frames) == 31  # 30 samples and the end blocks
    table = load_samples(index)
    assert frames[:30, 2].tolist() == table.start_offset.tolist()
    assert (frames[:30, 2] + frames[:30, 3]).tolist() == table.end_offset.tolist()
    assert int(frames[-1, 0] + frames[-1, 1]) == Path(shard).stat().st_size
    # the writer's index equals the one a fresh scan of the file builds
    written = index.load_arrays()
    os.unlink(index.path)
    rebuilt = indextar.build_index(shard)
    again = rebuilt.load_arrays()
    assert np.array_equal(written.samples, again.samples)
    assert np.array_equal(written.members, again.members)
    rebuilt_frames = read_layout(rebuilt.path, rebuilt.meta).frames
    assert rebuilt_frames is not None and np.array_equal(frames, rebuilt_frames)


class CountingSource(ByteSource):
    """A source that records every read it serves."""

    def __init__(self, inner: ByteSource):
        self.url = inner.url
        self.inner = inner
        self.reads: list[tuple[int, int]] = []

    @property
    def size(self) -> int:
        return self.inner.size

    def read(self, offset: int, length: int) -> bytes:
        self.reads.append((offset, length))
        return self.inner.read(offset, length)


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_a_random_read_fetches_exactly_one_sample(tmp_path: Path, codec: str) -> None:
    shard = write(tmp_path, codec, n=40, maxcount=100)[0]
    ds = indextar.IndexedTarDataset(shard)
    with ds._leased(0) as open_shard:
        pass  # the shard ds reads through, kept open by ds
    assert isinstance(open_shard.source, FramedSource)
    counting = CountingSource(open_shard.source.raw)
    open_shard.source.raw = counting
    index = indextar.open_index(shard)
    frames = read_layout(index.path, index.meta).frames
    assert frames is not None
    for i in (17, 3, 39, 0):
        counting.reads.clear()
        sample = ds[i]
        assert sample["bin"] == record(i)["bin"]
        assert counting.reads == [(int(frames[i, 0]), int(frames[i, 1]))]
    counting.reads.clear()
    batch = ds.__getitems__([5, 6, 30])
    assert [s["__key__"] for s in batch] == ["k00005", "k00006", "k00030"]
    assert sorted(counting.reads) == [(int(frames[i, 0]), int(frames[i, 1])) for i in (5, 6, 30)]


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_a_corrupt_sample_frame_names_shard_and_offset(tmp_path: Path, codec: str) -> None:
    # beyond the fingerprint's first and last 64 KiB, which would call the change stale
    shard = write(tmp_path, codec, n=700, maxcount=1000)[0]
    assert Path(shard).stat().st_size > 3 * 65536
    index = indextar.open_index(shard)
    frames = read_layout(index.path, index.meta).frames
    assert frames is not None
    st = os.stat(shard)
    data = bytearray(Path(shard).read_bytes())
    start, size = int(frames[350, 0]), int(frames[350, 1])
    data[start + size // 2 : start + size // 2 + 16] = b"\x00" * 16
    Path(shard).write_bytes(bytes(data))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, mtime, fingerprint
    ds = indextar.IndexedTarDataset(shard)
    assert ds[349]["__key__"] == "k00349" and ds[351]["__key__"] == "k00351"
    with pytest.raises(indextar.ShardFormatError) as err:
        ds[350]
    assert err.value.shard == shard and err.value.offset == start
    assert f"compressed byte offset {start}" in str(err.value)


def test_an_unknown_codec_is_refused(tmp_path: Path) -> None:
    with pytest.raises(indextar.WriterError, match="'gzip', 'zstd'"):
        indextar.ShardWriter(str(tmp_path / "x-%03d.tar.bz2"), compress="bz2")
    with pytest.raises(indextar.WriterError, match="compress must be"):
        indextar.TarWriter(tmp_path / "y.tar.xz", compress="xz")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_reads_without_the_c_member_copy(
    tmp_path: Path, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where _mapread is not built, frames are split and checked by the Python reference."""
    from indextar.source import base

    monkeypatch.setattr(base, "_MAPREAD", None)  # split_members: the C copy, where built
    shard = write(tmp_path, codec, n=30, maxcount=100)[0]
    ds = indextar.IndexedTarDataset(shard)
    assert [ds[i]["bin"] for i in (29, 0, 11)] == [record(i)["bin"] for i in (29, 0, 11)]
    assert [s["__key__"] for s in ds.__getitems__([4, 2])] == ["k00004", "k00002"]
