"""Per-sample checksums (issue 26, 1e): recorded by build_index and the writers, checked
by every read of a local shard and by verify_index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import flip_bit, tar_bytes
from indexrows import load_samples

import indextar
from indextar import ChecksumMismatchError, IndexedTarDataset, build_index
from indextar.index.verify import verify_index


def _members(n: int = 40) -> dict[str, bytes]:
    # 4 KiB members: a shard of 320 KiB, so a byte in the middle is outside the
    # fingerprint's first and last 64 KiB (opening the dataset does not notice it).
    return {
        f"k{i:03d}.{ext}": bytes([i % 251]) * 4096 + ext.encode()
        for i in range(n)
        for ext in ("bin", "cls")
    }


def _payload_offset(shard: Path, key: str) -> tuple[int, int]:
    """The span start of sample ``key`` and a byte inside its ``.bin`` data."""
    index = indextar.open_index(shard)
    sample = index.find_key(key)[0]
    table = load_samples(index)
    member = int(table.first_member[sample])
    return int(table.start_offset[sample]), int(table.member_data_offset[member]) + 100


@pytest.mark.parametrize("algorithm", [True, "xxh3_64"])
def test_a_flipped_payload_byte_is_refused_naming_shard_key_and_offset(
    tmp_path: Path, algorithm: bool | str
) -> None:
    shard = tmp_path / "data.tar"
    shard.write_bytes(tar_bytes(_members()))
    index = build_index(shard, checksums=algorithm)
    assert index.meta.checksum == ("crc32" if algorithm is True else algorithm)
    assert index.meta.format_version == 4
    start, payload = _payload_offset(shard, "k020")
    flip_bit(shard, payload)
    ds = IndexedTarDataset(str(shard))
    assert ds[19]["bin"] == bytes([19]) * 4096 + b"bin"  # the others still read
    for read in (lambda: ds[20], lambda: ds.__getitems__([18, 20, 21])):
        with pytest.raises(ChecksumMismatchError) as err:
            read()
        assert err.value.shard == str(shard) and err.value.key == "k020"
        assert err.value.offset == start
        assert str(shard) in str(err.value) and "'k020'" in str(err.value)
        assert f"byte offset {start}" in str(err.value)
    report = verify_index(shard)
    assert not report.ok and "'k020'" in report.problems[-1]
    assert f"byte offset {start}" in report.problems[-1]


def test_without_checksums_a_flipped_byte_reads_as_before(tmp_path: Path) -> None:
    shard = tmp_path / "data.tar"
    shard.write_bytes(tar_bytes(_members()))
    index = build_index(shard)
    assert index.meta.checksum == "" and index.meta.format_version == 3
    assert index.load_arrays().checksums is None
    _, payload = _payload_offset(shard, "k020")
    flip_bit(shard, payload)
    ds = IndexedTarDataset(str(shard))
    assert ds[20]["bin"][100] == 20 ^ 1  # served silently, as before: nothing to check
    assert verify_index(shard).ok


def test_checksums_rebuild_an_index_without_them(tmp_path: Path) -> None:
    shard = tmp_path / "data.tar"
    shard.write_bytes(tar_bytes(_members(4)))
    assert build_index(shard).meta.checksum == ""
    assert build_index(shard, checksums=True).meta.checksum == "crc32"
    assert build_index(shard).meta.checksum == "crc32"  # kept: it has more, not less
    built = indextar.build_indexes([str(shard)], checksums="xxh3_64", workers=1)
    assert built[0].meta.checksum == "xxh3_64"


@pytest.mark.parametrize("compress", [None, "gzip", "zstd"])
@pytest.mark.parametrize("algorithm", [True, "xxh3_64"])
def test_writer_checksums_equal_the_indexers(
    tmp_path: Path, compress: str | None, algorithm: bool | str
) -> None:
    if compress == "zstd":
        pytest.importorskip("zstandard")
    suffix = {None: ".tar", "gzip": ".tar.gz", "zstd": ".tar.zst"}[compress]
    with indextar.ShardWriter(
        str(tmp_path / f"w-%02d{suffix}"), maxcount=30, compress=compress, checksums=algorithm
    ) as sink:
        for i in range(50):
            sink.write({"__key__": f"k{i:03d}", "txt": "x" * (i * 37), "cls": i})
    for shard, written in zip(sink.shards, sink.indexes):
        recorded = written.load_arrays().checksums
        rebuilt = build_index(shard, force=True, checksums=algorithm).load_arrays().checksums
        assert recorded is not None and rebuilt is not None
        assert np.array_equal(recorded, rebuilt)
    ds = IndexedTarDataset(sink.shards)
    assert [s["cls"] for s in ds.__getitems__(list(range(50)))] == [b"%d" % i for i in range(50)]


def test_writer_refuses_copied_entries_with_checksums(tmp_path: Path) -> None:
    with indextar.TarWriter(tmp_path / "w.tar", checksums=True) as sink:
        with pytest.raises(indextar.WriterError, match="checksums="):
            sink.append_entries([])


def test_an_unknown_algorithm_is_refused(tmp_path: Path) -> None:
    shard = tmp_path / "data.tar"
    shard.write_bytes(tar_bytes(_members(2)))
    with pytest.raises(indextar.IndextarError, match="'crc32', 'xxh3_64'"):
        build_index(shard, checksums="md5")
