"""IndexedTarDataset in one process: access, keys, decoding, building, bad input."""

from __future__ import annotations

import gzip
import io
import logging
import os
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from readers import wds_read
from wds_shards import jpeg, sample, write_shards

from indextar import (
    DecodeError,
    DecodeSpecError,
    IndexedTarDataset,
    MissingIndexError,
    ShardNotFoundError,
    StaleIndexError,
    UnsafeMemberError,
    build_index,
    index_path,
)
from indextar.errors import IndextarError, SampleIndexError, SampleKeyError, TruncatedShardError


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    """4 shards x 6 samples, indexed."""
    paths = write_shards(tmp_path / "data", 4, 6)
    for path in paths:
        build_index(path)
    return paths


def pattern(paths: list[Path]) -> str:
    return str(paths[0].parent / f"data-{{000000..{len(paths) - 1:06d}}}.tar")


def ours(sample_: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample_.items() if k not in ("__shard__", "__index__")}


# -- access ---------------------------------------------------------------------------


def test_len_getitem_negative_and_out_of_range(shards: list[Path]) -> None:
    ds = IndexedTarDataset(pattern(shards))
    assert len(ds) == 24
    first = ds[0]
    assert first["__key__"] == "sample000000"
    assert first["__shard__"] == str(shards[0]) and first["__index__"] == 0
    assert first["cls"] == b"0" and first["jpg"] == jpeg(0) and first["txt"] == b"caption 0"
    assert ds[-1]["__key__"] == "sample000023" and ds[-1]["__index__"] == 23
    assert ds[-24]["__key__"] == "sample000000"
    assert ds[np.int64(7)]["__key__"] == "sample000007"
    for bad in (24, -25, 10**12):
        with pytest.raises(IndexError, match=f"index {bad} is out of range for a dataset of 24"):
            ds[bad]
    with pytest.raises(SampleIndexError):
        ds[24]
    with pytest.raises(TypeError):
        ds["3"]  # type: ignore[index]
    assert list(ds.shard_sizes) == [6, 6, 6, 6] and ds.shard_sizes.dtype == np.int64
    assert ds.locate(13) == (2, 1) and ds.locate(-1) == (3, 5)


def test_every_kind_of_shards_argument(shards: list[Path], tmp_path: Path) -> None:
    expected = [s["__key__"] for s in IndexedTarDataset(pattern(shards))]  # type: ignore[attr-defined]
    assert len(expected) == 24  # iteration stops at IndexError
    for arg in (
        str(shards[0].parent / "data-*.tar"),
        [str(p) for p in shards],
        shards,
        [pattern(shards[:2]), str(shards[2]), shards[3]],
    ):
        ds = IndexedTarDataset(arg)  # type: ignore[arg-type]
        assert [ds[i]["__key__"] for i in range(len(ds))] == expected
    single = IndexedTarDataset(shards[1])
    assert len(single) == 6 and single[0]["__key__"] == "sample000006"


def test_same_bytes_as_webdataset_streaming(shards: list[Path]) -> None:
    ds = IndexedTarDataset(pattern(shards))
    theirs = wds_read([str(p) for p in shards])
    assert [ours(ds[i]) for i in range(len(ds))] == theirs


def test_same_decoded_values_as_webdataset(shards: list[Path]) -> None:
    for spec in ("rgb8", "torchrgb", "pil"):
        ds = IndexedTarDataset(shards, decode=spec)
        theirs = wds_read([str(p) for p in shards], spec)
        for i, expected in enumerate(theirs):
            got = ours(ds[i])
            assert got.keys() == expected.keys()
            for k, v in expected.items():
                if spec == "torchrgb" and k in ("jpg", "png"):
                    assert got[k].dtype == v.dtype and bool((got[k] == v).all())
                elif spec == "pil" and k in ("jpg", "png"):
                    assert got[k].tobytes() == v.tobytes() and got[k].mode == v.mode
                elif isinstance(v, np.ndarray):
                    assert np.array_equal(got[k], v) and got[k].dtype == v.dtype
                else:
                    assert got[k] == v


def test_odd_member_names_match_webdataset(make_tar: Callable[..., Path]) -> None:
    members = {
        "dir.v1/a.b.c.txt": b"dotted dir",
        "dir.v1/a.b.c.seg.png": b"not a png",
        "dir.v1/a.JSON": b'{"x": 1}',
        "__meta__": b"meta entry, skipped",
        "noext": b"skipped",
        "x/y/z.cls": b"3",
        "x/y/z.npy.gz": gzip.compress(b"fake"),
        "emptydir": None,
    }
    path = make_tar(members, name="odd.tar", fmt="gnu")
    ds = IndexedTarDataset(path)
    assert [ours(ds[i]) for i in range(len(ds))] == wds_read([str(path)])


def test_keys_tuple_with_alternatives(shards: list[Path]) -> None:
    ds = IndexedTarDataset(shards, keys=("jpg;png", "cls", "__key__"))
    assert ds[0] == (jpeg(0), b"0", "sample000000")
    assert ds[4] == (sample(4)["png"], b"4", "sample000004")
    spaced = IndexedTarDataset(shards, keys="png;jpg json")
    assert spaced[4] == (sample(4)["png"], sample(4)["json"])
    decoded = IndexedTarDataset(shards, keys=["cls", "json"], decode="rgb8")
    assert decoded[7] == (7, {"i": 7})
    with pytest.raises(ValueError, match="keys="):
        IndexedTarDataset(shards, keys=())


def test_missing_key_names_the_sample_and_its_keys(shards: list[Path]) -> None:
    ds = IndexedTarDataset(shards, keys=("txt", "cls"))
    assert ds[3][0] == b"caption 3"
    with pytest.raises(KeyError) as info:
        ds[1]
    message = str(info.value)
    assert isinstance(info.value, SampleKeyError) and isinstance(info.value, IndextarError)
    assert "'sample000001'" in message and "'txt'" in message
    assert "['cls', 'jpg', 'json']" in message and "data-000000.tar" in message


def test_only_selected_members_are_decoded(make_tar: Callable[..., Path]) -> None:
    path = make_tar({"a.pyd": pickle.dumps(1), "a.cls": b"1", "a.jpg": b"corrupt"}, name="p.tar")
    assert IndexedTarDataset(path, keys=("cls",), decode="rgb8")[0] == (1,)
    with pytest.raises(UnsafeMemberError, match="allow_unsafe=True"):
        IndexedTarDataset(path, keys=("pyd",), decode="rgb8")[0]
    assert IndexedTarDataset(path, keys=("pyd",), decode="rgb8", allow_unsafe=True)[0] == (1,)
    assert IndexedTarDataset(path)[0]["pyd"] == pickle.dumps(1)  # bytes are always safe


def test_transform_and_custom_handlers(shards: list[Path]) -> None:
    def upper_txt(key: str, data: bytes) -> Any:
        return data.decode().upper() if key == ".txt" else None

    ds = IndexedTarDataset(
        shards, decode=[upper_txt, "l8"], transform=lambda s: (s["txt"], s["jpg"].shape)
    )
    assert ds[0] == ("CAPTION 0", (6, 8))
    tuples = IndexedTarDataset(shards, keys=("cls",), transform=lambda t: int(t[0]) * 10)
    assert tuples[3] == 30


def test_getitems_matches_getitem(shards: list[Path]) -> None:
    ds = IndexedTarDataset(shards, decode="l8")
    indices = [5, 0, -1, 23, 5, 12]
    batch = ds.__getitems__(indices)
    for got, i in zip(batch, indices):
        expected = ds[i]
        assert got.keys() == expected.keys() and got["__index__"] == i % 24
        assert np.array_equal(
            got["jpg" if "jpg" in got else "png"], expected["jpg" if "jpg" in got else "png"]
        )
    assert ds.__getitems__([]) == []
    with pytest.raises(IndexError):
        ds.__getitems__([0, 24])
    with pytest.raises(IndexError):
        ds.__getitems__([0, 2**70])
    with pytest.raises(TypeError):
        ds.__getitems__([0, 1.5])  # type: ignore[list-item]
    keys = [s["__key__"] for s in ds.__getitems__(np.array([3, -2]))]  # type: ignore[arg-type]
    assert keys == [ds[3]["__key__"], ds[22]["__key__"]]


def test_a_batch_from_a_shard_truncated_while_open_is_an_error(
    make_tar: Callable[..., Path],
) -> None:
    path = make_tar({f"s{i:03d}.txt": b"x" * 700 for i in range(40)}, name="t.tar")
    ds = IndexedTarDataset(path)
    first = ds.__getitems__([0, 1])
    with open(path, "r+b") as f:  # in place: one size check per shard and batch sees it
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(TruncatedShardError, match="truncated while open"):
        ds.__getitems__([0, 39, 1])
    # Not even what is left is read: a shrinking file is being rewritten (cp over it
    # truncates first), so its first bytes may already be the new file's.
    with pytest.raises(TruncatedShardError, match="truncated while open"):
        ds.__getitems__([0, 1])
    assert first[0]["__key__"] == "s000"
    ds.close()


def test_index_of(shards: list[Path]) -> None:
    ds = IndexedTarDataset(shards)
    assert ds.index_of("sample000000") == 0
    assert ds.index_of("sample000017") == 17
    assert ds[ds.index_of("sample000022")]["__key__"] == "sample000022"
    with pytest.raises(KeyError, match="no sample has the key 'nope'"):
        ds.index_of("nope")


def test_empty_shards_are_skipped_in_indexing(make_tar: Callable[..., Path]) -> None:
    a = make_tar({"x.txt": b"1"}, name="a.tar")
    empty = make_tar({"README": b"no samples"}, name="b.tar")
    c = make_tar({"y.txt": b"2", "z.txt": b"3"}, name="c.tar")
    ds = IndexedTarDataset([a, empty, c])
    assert list(ds.shard_sizes) == [1, 0, 2]
    assert [ds[i]["__key__"] for i in range(len(ds))] == ["x", "y", "z"]
    assert ds.index_of("z") == 2


# -- pickling, open-shard bound --------------------------------------------------------


def test_pickle_drops_open_shards(shards: list[Path]) -> None:
    ds = IndexedTarDataset(shards, keys=("cls",))
    assert ds[0] == (b"0",) and len(ds._open) == 1
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone._open) == 0
    assert [clone[i] for i in range(len(clone))] == [ds[i] for i in range(len(ds))]
    ds.close()
    assert len(ds._open) == 0 and ds[23] == (b"3",)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_open_shards_stay_bounded(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "many", 12, 2, images=False)
    ds = IndexedTarDataset(paths, max_open_shards=3, keys=("cls",))
    before = open_fds()
    order = list(range(len(ds)))
    random.Random(1).shuffle(order)
    for i in order:
        assert ds[i] == (str(i % 10).encode(),)
        assert len(ds._open) <= 3
    assert open_fds() - before <= 2 * 3  # each: the source's descriptor and the map's
    with pytest.raises(ValueError, match="max_open_shards"):
        IndexedTarDataset(paths, max_open_shards=0)


# -- building missing indexes ---------------------------------------------------------


def test_build_missing_false_names_every_shard(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "raw", 3, 2, images=False)
    build_index(paths[1])
    with pytest.raises(MissingIndexError) as info:
        IndexedTarDataset(paths, build_missing=False)
    message = str(info.value)
    assert "2 of 3 shards have no index" in message
    assert str(paths[0]) in message and str(paths[2]) in message and str(paths[1]) not in message
    assert isinstance(info.value, FileNotFoundError)


def test_missing_indexes_are_built_in_parallel(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    paths = write_shards(tmp_path / "raw", 3, 4, images=False)
    index_dir = tmp_path / "indexes"
    ds = IndexedTarDataset(paths, index_dir=index_dir, build_workers=2)
    assert len(ds) == 12 and ds[11]["__key__"] == "sample000011"
    assert all(index_path(p, index_dir=index_dir).exists() for p in paths)
    assert not any(Path(str(p) + ".idx.sqlite").exists() for p in paths)
    assert capfd.readouterr() == ("", "")  # no printing without progress=True
    again = IndexedTarDataset(paths, index_dir=index_dir, build_missing=False)
    assert len(again) == 12


def test_progress_bar_is_opt_in(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    paths = write_shards(tmp_path / "raw", 2, 2, images=False)
    with caplog.at_level(logging.INFO, logger="indextar"):
        IndexedTarDataset(paths, progress=True, build_workers=1)
    assert "indexing shards" in capfd.readouterr().err
    assert any("building 2 missing indexes" in r.getMessage() for r in caplog.records)


def test_unindexable_shard_fails_the_build(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tar file" * 40)
    with pytest.raises(IndextarError, match="bad.tar"):
        IndexedTarDataset([bad])


# -- bad input --------------------------------------------------------------------------


def test_missing_shard_or_pattern(tmp_path: Path) -> None:
    with pytest.raises(ShardNotFoundError, match="matches no file"):
        IndexedTarDataset(str(tmp_path / "none-*.tar"))
    with pytest.raises(ShardNotFoundError, match="does not exist"):
        IndexedTarDataset(str(tmp_path / "none.tar"))
    with pytest.raises(ShardNotFoundError, match="does not exist"):
        IndexedTarDataset(str(tmp_path / "none.tar"), build_missing=False)


def rewrite_same_size(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[600:604] = b"XXXX" if data[600:604] != b"XXXX" else b"YYYY"
    path.write_bytes(bytes(data))


def test_changed_shard_is_refused_when_opened(shards: list[Path]) -> None:
    rewrite_same_size(shards[2])
    with pytest.raises(StaleIndexError, match="data-000002.tar") as info:
        IndexedTarDataset(shards)
    assert "force=True" in str(info.value)


def test_shard_changed_after_opening_is_refused_on_first_read(shards: list[Path]) -> None:
    ds = IndexedTarDataset(shards)
    ds[0]
    rewrite_same_size(shards[3])
    with pytest.raises(StaleIndexError, match="data-000003.tar"):
        ds[20]
    assert ds[1]["__key__"] == "sample000001"  # shards opened before are unaffected


def test_deleted_shard_names_its_index(shards: list[Path]) -> None:
    ds = IndexedTarDataset(shards)
    shards[1].unlink()
    with pytest.raises(ShardNotFoundError) as info:
        ds[7]
    message = str(info.value)
    assert "data-000001.tar" in message and "number 1 of the dataset" in message
    with pytest.raises(ShardNotFoundError, match="data-000001.tar"):
        IndexedTarDataset(shards)


def test_corrupt_jpeg_names_shard_key_and_extension(make_tar: Callable[..., Path]) -> None:
    path = make_tar(
        {"good.jpg": jpeg(1), "bad.jpg": jpeg(2)[:50], "bad.cls": b"1"}, name="imgs.tar"
    )
    ds = IndexedTarDataset(path, decode="rgb8")
    assert ds[0]["jpg"].shape == (6, 8, 3)
    with pytest.raises(DecodeError) as info:
        ds[1]
    assert info.value.shard == str(path) and info.value.key == "bad" and info.value.ext == "jpg"
    assert "imgs.tar" in str(info.value) and "'bad'" in str(info.value)
    assert IndexedTarDataset(path)[1]["jpg"] == jpeg(2)[:50]  # bytes: no decoding, no error


def test_wrong_decode_spec(shards: list[Path]) -> None:
    with pytest.raises(DecodeSpecError, match="unknown decode spec 'rgb16'"):
        IndexedTarDataset(shards, decode="rgb16")


def test_truncated_shard_is_reported_not_crashed(make_tar: Callable[..., Path]) -> None:
    path = make_tar({"a.txt": b"x" * 3000, "b.txt": b"y" * 3000}, name="t.tar")
    ds = IndexedTarDataset(path)
    ds.close()
    data = path.read_bytes()
    stat = path.stat()
    path.write_bytes(data[:2048])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(StaleIndexError, match="size changed"):
        ds[1]


def test_values_are_bytes_without_decode(shards: list[Path]) -> None:
    sample_ = IndexedTarDataset(shards)[3]
    assert all(isinstance(v, bytes) for k, v in sample_.items() if not k.startswith("__"))
    assert io.BytesIO(sample_["jpg"]).read(2) == b"\xff\xd8"
