"""TarWriter and ShardWriter: round trips, determinism, the index, formats, bad input, crashes."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from indexrows import assert_index_matches_scan, index_rows
from readers import tar_members, wds_read

from indextar import open_index, scan_tar
from indextar.errors import EncodeError, IndextarError, WriterError
from indextar.tar.header import END_OF_ARCHIVE, member_header
from indextar.write.sample import encode_sample
from indextar.write.shardwriter import ShardWriter, plan_shards
from indextar.write.tarwriter import TarWriter


def random_samples(n: int, seed: int = 0) -> list[dict[str, object]]:
    """Byte samples of awkward sizes (0, block-aligned, one past a block, large)."""
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 511, 512, 513, 1024, 5000, 70_000]
    return [
        {
            "__key__": f"part{i % 3}/s{i:05d}",
            "bin": rng.bytes(sizes[i % len(sizes)]),
            "cls": str(i).encode(),
            "seg.png": rng.bytes(int(rng.integers(0, 3000))),
        }
        for i in range(n)
    ]


def test_round_trip_bytes_with_tarfile_and_gnu_tar(tmp_path: Path) -> None:
    samples = random_samples(24)
    shard = tmp_path / "out.tar"
    with TarWriter(shard) as sink:
        for sample in samples:
            sink.write(sample)
    expected = {
        f"{s['__key__']}.{ext}": s[ext] for s in samples for ext in s if not ext.startswith("_")
    }
    assert tar_members(shard) == expected
    # Members sorted by extension within each sample, samples in write order.
    assert list(tar_members(shard))[:3] == [
        "part0/s00000.bin",
        "part0/s00000.cls",
        "part0/s00000.seg.png",
    ]
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["tar", "-xf", str(shard), "-C", str(out)], check=True)
    for name, data in expected.items():
        assert (out / name).read_bytes() == data
    assert shard.stat().st_size % 512 == 0


def test_decoded_values_equal_through_webdataset(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (6, 7, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (5, 4), dtype=np.uint8)
    array = rng.standard_normal((3, 2)).astype(np.float32)
    sample = {
        "__key__": "k",
        "cls": 7,
        "txt": "héllo",
        "json": {"a": [1, 2], "b": "c"},
        "list.json": [1, "x"],
        "npy": array,
        "png": image,
        "gray.png": gray,
        "raw": b"\x00\x01",
        "txt.gz": "zipped",
    }
    with TarWriter(tmp_path / "d.tar") as sink:
        sink.write(sample)
    [got] = wds_read([str(tmp_path / "d.tar")], "rgb8")
    assert got["cls"] == 7 and got["txt"] == "héllo" and got["txt.gz"] == "zipped"
    assert got["json"] == {"a": [1, 2], "b": "c"} and got["list.json"] == [1, "x"]
    np.testing.assert_array_equal(got["npy"], array)
    np.testing.assert_array_equal(got["png"], image)  # PNG is lossless
    np.testing.assert_array_equal(got["gray.png"][:, :, 0], gray)
    assert got["raw"] == b"\x00\x01"


def test_encodings_are_webdataset_encodings(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    sample = {
        "__key__": "k",
        "cls": 3,
        "txt": "t",
        "json": {"z": 1, "a": [2]},
        "npy": rng.standard_normal(4),
        "jpg": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
        "png": rng.integers(0, 256, (8, 8), dtype=np.uint8),
    }
    with TarWriter(tmp_path / "ours.tar") as sink:
        sink.write(sample)
    with wds.TarWriter(str(tmp_path / "theirs.tar")) as sink:
        sink.write(sample)
    assert tar_members(tmp_path / "ours.tar") == tar_members(tmp_path / "theirs.tar")


def write_shards(folder: Path, samples: list[dict[str, object]], **kw: object) -> ShardWriter:
    folder.mkdir(exist_ok=True)
    with ShardWriter(str(folder / "s-%04d.tar"), **kw) as sink:  # type: ignore[arg-type]
        for sample in samples:
            sink.write(sample)
    return sink


def test_two_runs_give_identical_shards(tmp_path: Path) -> None:
    samples = random_samples(30, seed=3)
    a = write_shards(tmp_path / "a", samples, maxcount=8)
    time.sleep(0.01)
    b = write_shards(tmp_path / "b", samples, maxcount=8)
    assert len(a.shards) == 4
    for x, y in zip(a.shards, b.shards):
        assert Path(x).read_bytes() == Path(y).read_bytes()
        ix, iy = index_rows(Path(x + ".idx.sqlite")), index_rows(Path(y + ".idx.sqlite"))
        assert ix["members"] == iy["members"] and ix["samples"] == iy["samples"]


def test_webdataset_reads_shardwriter_output(tmp_path: Path) -> None:
    samples = random_samples(40, seed=4)
    sink = write_shards(tmp_path, samples, maxcount=9, manifest=tmp_path / "m.json")
    assert wds_read(sink.shards) == samples
    manifest = json.loads((tmp_path / "m.json").read_text())
    assert [e["nsamples"] for e in manifest["shardlist"]] == [9, 9, 9, 9, 4]
    assert [len(ix) for ix in sink.indexes] == [9, 9, 9, 9, 4]


@pytest.mark.parametrize(
    "key",
    [
        "plain",
        "deep/er/path",
        "x" * 120,  # too long for the name field: PAX
        "d" * 60 + "/" + "e" * 60,  # fits with the ustar prefix field
        "ünï/cödé",  # non-ASCII: PAX
        "p/" + "q" * 200,  # one component over 100 bytes: PAX
    ],
)
def test_writer_index_equals_scanner_index(tmp_path: Path, key: str) -> None:
    shard = tmp_path / "i.tar"
    with TarWriter(shard) as sink:
        sink.write({"__key__": key, "jpg": b"j" * 700, "json": b"{}"})
        sink.write({"__key__": key + "2", "txt": b""})
    assert sink.index is not None
    assert_index_matches_scan(shard, sink.index.path, tmp_path / "ref")
    assert open_index(shard).meta.num_samples == 2
    assert sorted(tar_members(shard)) == sorted([f"{key}.jpg", f"{key}.json", f"{key}2.txt"])


def test_ustar_by_default_pax_only_where_needed(tmp_path: Path) -> None:
    shard = tmp_path / "f.tar"
    names = ["a", "b" * 60 + "/" + "c" * 60, "ü", "y" * 150]
    with TarWriter(shard, index=False) as sink:
        for name in names:
            sink.write({"__key__": name, "txt": b"x"})
    with tarfile.open(shard) as tf:
        members = tf.getmembers()
    assert [m.name for m in members] == [n + ".txt" for n in names]
    assert [bool(m.pax_headers) for m in members] == [False, False, True, True]
    data = shard.read_bytes()
    # 2 plain members (header + data block), 2 PAX members (+ x header and its records).
    assert len(data) == 2 * 1024 + 2 * 2048 + len(END_OF_ARCHIVE)
    listing = subprocess.run(["tar", "-tf", str(shard)], capture_output=True, text=True, check=True)
    assert listing.stdout.splitlines() == [n + ".txt" for n in names]


def test_sizes_of_8_gib_and_more_get_a_pax_size(tmp_path: Path) -> None:
    size = 8 * 2**30 + 5
    header = member_header("big.bin", size)
    assert header[156:157] == b"x" and header[1024 + 156 : 1024 + 157] == b"0"
    assert len(member_header("small.bin", 8**11 - 1)) == 512
    shard = tmp_path / "big.tar"  # sparse: only the headers take space
    with open(shard, "wb") as f:
        f.write(header)
        f.seek(len(header) + -(-size // 512) * 512)
        f.write(END_OF_ARCHIVE)
    with open(shard, "rb") as f:
        import mmap

        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            scan = scan_tar(mm)
            assert scan.names == ["big.bin"] and int(scan.sizes[0]) == size
            assert int(scan.data_offsets[0]) == len(header)
            del scan


BAD_KEYS = {
    "../up": "'..' path component",
    "a/../b": "'..' path component",
    "/abs": "absolute path",
    "a//b": "'empty' path component",
    "./a": "'.' path component",
    "a.b": "contains a dot",
    "": "empty",
    "__dir__/x": "metadata",
    "a\nb": "newline",
}


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused(tmp_path: Path, key: str) -> None:
    with TarWriter(tmp_path / "b.tar") as sink:
        with pytest.raises(WriterError, match="invalid key") as info:
            sink.write({"__key__": key, "txt": b"x"})
        assert BAD_KEYS[key] in str(info.value) and info.value.key == key
        assert "b.tar" in str(info.value)
        sink.write({"__key__": "fine", "txt": b"x"})  # the shard stays usable
    assert list(tar_members(tmp_path / "b.tar")) == ["fine.txt"]


@pytest.mark.parametrize(
    ("sample", "error", "message"),
    [
        ({"txt": b"x"}, WriterError, "no '__key__'"),
        ({"__key__": 3, "txt": b"x"}, WriterError, "must be a str"),
        ({"__key__": "k"}, WriterError, "no members"),
        ({"__key__": "k", "jpg": 3}, EncodeError, "cannot encode int as 'jpg'"),
        (
            {"__key__": "k", "foo": object()},
            EncodeError,
            "no encoder for a object under extension 'foo'",
        ),
        ({"__key__": "k", "cls": True}, EncodeError, "expected an int"),
        ({"__key__": "k", "png": np.zeros((2, 2), np.float32)}, EncodeError, "must be uint8"),
        ({"__key__": "k", "jpg": b"", "JPG": b""}, WriterError, "same to readers"),
        ({"__key__": "k", "a/b": b""}, WriterError, "invalid extension"),
    ],
)
def test_bad_samples_are_refused(sample: dict[str, object], error: type, message: str) -> None:
    with pytest.raises(error, match=message) as info:
        encode_sample(sample, shard="s.tar")
    assert isinstance(info.value, IndextarError) and isinstance(info.value, ValueError)


def test_encoder_false_takes_bytes_only(tmp_path: Path) -> None:
    with TarWriter(tmp_path / "r.tar", encoder=False) as sink:
        sink.write({"__key__": "k", "txt": memoryview(b"ok")})
        with pytest.raises(EncodeError, match="bytes-like values only"):
            sink.write({"__key__": "k2", "txt": "str"})
    assert tar_members(tmp_path / "r.tar") == {"k.txt": b"ok"}


def test_duplicate_key_in_one_shard_and_write_after_close(tmp_path: Path) -> None:
    sink = TarWriter(tmp_path / "d.tar")
    sink.write({"__key__": "k", "txt": b"1"})
    with pytest.raises(WriterError, match="duplicate key") as info:
        sink.write({"__key__": "k", "cls": b"1"})
    assert info.value.key == "k"
    sink.close()
    with pytest.raises(WriterError, match="closed"):
        sink.write({"__key__": "j", "txt": b"1"})
    shards = ShardWriter(str(tmp_path / "e-%d.tar"), maxcount=1)
    shards.write({"__key__": "k", "txt": b"1"})
    shards.write({"__key__": "k", "txt": b"1"})  # another shard: allowed
    shards.close()
    assert len(shards.shards) == 2
    with pytest.raises(WriterError, match="closed"):
        shards.write({"__key__": "j", "txt": b"1"})


def test_file_objects_need_index_false() -> None:
    with pytest.raises(WriterError, match="index=False"):
        TarWriter(io.BytesIO())
    buf = io.BytesIO()
    with TarWriter(buf, index=False) as sink:
        sink.write({"__key__": "k", "txt": "v"})
    assert scan_tar(buf.getvalue()).names == ["k.txt"]


def test_maxsize_counts_real_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    samples = [
        {"__key__": f"s{i:04d}", "bin": rng.bytes(int(rng.integers(0, 4000)))} for i in range(200)
    ]
    samples.insert(50, {"__key__": "huge", "bin": bytes(30_000)})
    maxsize = 20_000
    sink = write_shards(tmp_path, samples, maxsize=maxsize, maxcount=10**6)
    sizes = [Path(s).stat().st_size for s in sink.shards]
    counts = [len(ix) for ix in sink.indexes]
    for size, count in zip(sizes, counts):
        assert size <= maxsize or count == 1
    assert max(sizes) > maxsize  # the huge sample, alone
    # Shards are full: the next sample would not have fitted.
    nbytes = [encode_sample(s).nbytes for s in samples]
    plan = plan_shards(nbytes, maxcount=10**6, maxsize=maxsize)
    assert [len(r) for r in plan] == counts
    for r, size in zip(plan[:-1], sizes):
        assert size + nbytes[r.stop] > maxsize
    assert sum(counts) == len(samples)


def test_invalid_pattern_and_limits(tmp_path: Path) -> None:
    with pytest.raises(WriterError, match="%-format"):
        ShardWriter(str(tmp_path / "plain.tar"))
    with pytest.raises(WriterError, match="positive"):
        ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=0)
    with pytest.raises(WriterError, match="needs index=True"):
        ShardWriter(str(tmp_path / "s-%d.tar"), index=False, manifest=tmp_path / "m.json")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_exception_inside_with_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with TarWriter(tmp_path / "t.tar") as sink:
            sink.write({"__key__": "k", "bin": bytes(5000)})
            raise RuntimeError("boom")
    assert leftovers(tmp_path) == []
    with pytest.raises(RuntimeError):
        with ShardWriter(
            str(tmp_path / "s-%d.tar"), maxcount=2, manifest=tmp_path / "m.json"
        ) as sw:
            for i in range(3):
                sw.write({"__key__": f"k{i}", "bin": bytes(5000)})
            raise RuntimeError("boom")
    # The finished shard stays (complete and indexed); the open one and the manifest do not.
    assert leftovers(tmp_path) == ["s-0.tar", "s-0.tar.idx.sqlite"]
    assert len(open_index(tmp_path / "s-0.tar")) == 2


_KILLED_WRITER = """
import sys
from indextar.write.tarwriter import TarWriter
sink = TarWriter(sys.argv[1])
for i in range(10**6):
    sink.write({"__key__": f"k{i:07d}", "bin": bytes(100_000)})
    if i == 20:
        print("writing", flush=True)
"""


def test_sigkill_mid_write_leaves_no_shard_and_no_index(tmp_path: Path) -> None:
    shard = tmp_path / "killed.tar"
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(shard)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
            time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not shard.exists() and not Path(str(shard) + ".idx.sqlite").exists()
    [partial] = list(tmp_path.iterdir())
    assert partial.name.startswith(".killed.tar.") and partial.name.endswith(".tmp")
    assert partial.stat().st_size > 20 * 100_000
