"""Exports: DALI wds2idx v1.2 index files and wids shard lists."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from indextar.errors import ExportError
from indextar.write.export import dali_index_name, export_dali, export_wids
from indextar.write.shardwriter import ShardWriter


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    with ShardWriter(str(tmp_path / "data-%03d.tar"), maxcount=4) as sink:
        for i in range(10):
            sink.write({"__key__": f"d/k{i}", "Jpg": bytes(i * 300), "cls": i, "seg.png": b"p" * i})
    return sink.shards


def gnu_tar_data_offsets(shard: str) -> dict[str, int]:
    """Data offsets as DALI's wds2idx finds them: GNU tar's header block numbers."""
    listing = subprocess.run(
        ["tar", "--list", "--block-number", "--file", shard],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    offsets = {}
    for line in listing.splitlines():
        block, _, name = line.partition(": ")
        if not name.startswith("**"):
            offsets[name] = (int(block.removeprefix("block ")) + 1) * 512
    return offsets


def test_dali_index_follows_the_format(tmp_path: Path, shards: list[str]) -> None:
    written = export_dali(shards, tmp_path / "dali")
    assert [p.name for p in written] == ["data-000.idx", "data-001.idx", "data-002.idx"]
    for shard, path in zip(shards, written):
        lines = path.read_text().splitlines()
        version, count = lines[0].split(" ")
        assert version == "v1.2" and int(count) == len(lines) - 1
        gnu = gnu_tar_data_offsets(shard)
        data = Path(shard).read_bytes()
        with tarfile.open(shard) as tf:
            content = {m.name: tf.extractfile(m).read() for m in tf}  # type: ignore[union-attr]
        for line in lines[1:]:
            fields = line.split(" ")
            assert len(fields) % 4 == 0
            names = []
            for ext, offset, size, name in zip(*[iter(fields)] * 4):
                assert int(offset) % 512 == 0 and int(offset) == gnu[name]
                assert data[int(offset) : int(offset) + int(size)] == content[name]
                assert name.endswith("." + ext)  # extension as written: 'Jpg'
                names.append(name)
            assert len({n.split(".")[0] for n in names}) == 1  # one sample per line
    assert written[0].read_text().splitlines()[1] == (
        "Jpg 512 0 d/k0.Jpg cls 1024 1 d/k0.cls seg.png 2048 0 d/k0.seg.png"
    )


def test_dali_refuses_whitespace_and_name_clashes(tmp_path: Path, shards: list[str]) -> None:
    with ShardWriter(str(tmp_path / "sp-%d.tar")) as sink:
        sink.write({"__key__": "a b", "txt": b"x"})
    with pytest.raises(ExportError, match="whitespace"):
        export_dali(sink.shards, tmp_path / "out")
    with pytest.raises(ExportError, match="both get the DALI index"):
        export_dali([shards[0], shards[0]], tmp_path / "out")
    assert dali_index_name("x/train.000.tar") == "train.idx"


def test_wids_reads_the_shard_list(tmp_path: Path, shards: list[str]) -> None:
    path = export_wids(shards, tmp_path / "ds.json", name="demo")
    document = json.loads(path.read_text())
    assert document["wids_version"] == 1 and document["name"] == "demo"
    assert [(e["url"], e["nsamples"]) for e in document["shardlist"]] == [
        ("data-000.tar", 4),
        ("data-001.tar", 4),
        ("data-002.tar", 2),
    ]
    import wids

    dataset = wids.ShardListDataset(
        str(path), cache_dir=str(tmp_path / "cache"), transformations=[]
    )
    try:
        assert len(dataset) == 10
        sample = dataset[6]
        assert sample["__key__"] == "d/k6" and sample[".cls"].read() == b"6"
    finally:
        dataset.close()
