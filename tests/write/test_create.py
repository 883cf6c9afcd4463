"""indextar.write.create: folder trees to sorted, indexed shards."""

from __future__ import annotations

from pathlib import Path

import pytest
from indexrows import assert_index_matches_scan
from readers import TREE, make_tree, wds_read

from indextar.errors import WriterError
from indextar.write.create import create_shards, walk_tree


def test_walk_finds_samples_and_counts_skipped(tmp_path: Path) -> None:
    tree = walk_tree(make_tree(tmp_path / "src", TREE))
    assert [s.key for s in tree.samples] == [
        "cat/0001",
        "cat/0002",
        "dog/deep/er/0003",
        "dog/img",
    ]
    assert [[ext for ext, _, _ in s.files] for s in tree.samples] == [
        ["jpg", "json"],
        ["jpg"],
        ["jpg", "seg.png"],
        ["v2.JPG"],
    ]
    assert tree.skipped == {
        "hidden": [".git/objects/ab.jpg", "dog/.DS_Store"],
        "no-extension": ["dog/README"],
    }


def test_create_writes_the_expected_samples(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", TREE)
    out = tmp_path / "out"
    out.mkdir()
    result = create_shards(src, str(out / "d-%03d.tar"), maxcount=3, manifest=out / "m.json")
    assert (result.samples, result.files) == (4, 6)
    assert [len(ix) for ix in result.shards] == [3, 1]
    read = wds_read([ix.shard for ix in result.shards])
    assert read == [
        {"__key__": "cat/0001", "jpg": TREE["cat/0001.jpg"], "json": TREE["cat/0001.json"]},
        {"__key__": "cat/0002", "jpg": TREE["cat/0002.jpg"]},
        {
            "__key__": "dog/deep/er/0003",
            "jpg": TREE["dog/deep/er/0003.jpg"],
            "seg.png": TREE["dog/deep/er/0003.seg.png"],
        },
        {"__key__": "dog/img", "v2.jpg": TREE["dog/img.v2.JPG"]},
    ]
    for ix in result.shards:
        assert_index_matches_scan(Path(ix.shard), ix.path, tmp_path / "ref")
    assert result.skipped["no-extension"] == ["dog/README"]
    assert (out / "m.json").exists()


def test_class_from_dir_adds_cls(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {**TREE, "top.jpg": b"outside"})
    result = create_shards(src, str(tmp_path / "c-%d.tar"), class_from_dir=True)
    assert result.classes == ["cat", "dog"]
    read = wds_read([ix.shard for ix in result.shards])
    assert [(s["__key__"], s["cls"]) for s in read] == [
        ("cat/0001", b"0"),
        ("cat/0002", b"0"),
        ("dog/deep/er/0003", b"1"),
        ("dog/img", b"1"),
    ]
    assert result.skipped["outside-class-folder"] == ["top.jpg"]
    make_tree(src, {"cat/0001.cls": b"5"})
    with pytest.raises(WriterError, match="'cls' file"):
        walk_tree(src, class_from_dir=True)


def test_parallel_output_is_byte_identical(tmp_path: Path) -> None:
    files = {
        f"c{i % 3}/s{i:04d}.{ext}": bytes([i % 251]) * (i * 37 % 3000)
        for i in range(60)
        for ext in ("jpg", "txt")
    }
    src = make_tree(tmp_path / "src", files)
    one = create_shards(src, str(tmp_path / "a-%03d.tar"), maxsize=40_000, jobs=1)
    two = create_shards(src, str(tmp_path / "b-%03d.tar"), maxsize=40_000, jobs=2)
    assert len(one.shards) == len(two.shards) > 2
    for a, b in zip(one.shards, two.shards):
        assert Path(a.shard).read_bytes() == Path(b.shard).read_bytes()
        assert Path(a.shard).stat().st_size <= 40_000


def test_extensions_equal_up_to_case_are_refused(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a/x.jpg": b"1", "a/x.JPG": b"2"})
    with pytest.raises(WriterError, match="same extension up to case"):
        walk_tree(src)
