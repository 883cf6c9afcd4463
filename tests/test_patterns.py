"""Shard patterns: brace expansion, globs, order and duplicates."""

from __future__ import annotations

from pathlib import Path

import pytest

from indextar import ShardNotFoundError, expand_shards
from indextar.source.location import url_scheme


def touch(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")


def test_brace_ranges_keep_their_zero_padding() -> None:
    assert expand_shards("data-{000000..000003}.tar") == [f"data-{i:06d}.tar" for i in range(4)]
    assert expand_shards("x-{0..2}.tar") == ["x-0.tar", "x-1.tar", "x-2.tar"]


def test_brace_lists_and_nesting_keep_their_order() -> None:
    assert expand_shards("{b,a}-{1..2}.tar") == ["b-1.tar", "b-2.tar", "a-1.tar", "a-2.tar"]
    assert expand_shards("s/{train/{0..1},val/0}.tar") == [
        "s/train/0.tar",
        "s/train/1.tar",
        "s/val/0.tar",
    ]


def test_braces_expand_without_the_files_existing() -> None:
    # Missing files are the indexer's to report, with the shard's name.
    assert expand_shards("/nowhere/{a,b}.tar") == ["/nowhere/a.tar", "/nowhere/b.tar"]


def test_globs_are_sorted(tmp_path: Path) -> None:
    touch(tmp_path, "s-10.tar", "s-2.tar", "s-1.tar", "other.txt", "sub/s-3.tar")
    assert expand_shards(str(tmp_path / "s-*.tar")) == [
        str(tmp_path / name) for name in ("s-1.tar", "s-10.tar", "s-2.tar")
    ]
    assert expand_shards(str(tmp_path / "s-?.tar")) == [
        str(tmp_path / n) for n in ("s-1.tar", "s-2.tar")
    ]
    assert expand_shards(str(tmp_path / "s-[12].tar")) == [
        str(tmp_path / n) for n in ("s-1.tar", "s-2.tar")
    ]


def test_braces_then_globs(tmp_path: Path) -> None:
    touch(tmp_path, "a/1.tar", "a/2.tar", "b/1.tar")
    got = expand_shards(str(tmp_path / "{b,a}/*.tar"))
    assert got == [str(tmp_path / p) for p in ("b/1.tar", "a/1.tar", "a/2.tar")]


def test_several_patterns_and_duplicates_keep_first_position(tmp_path: Path) -> None:
    touch(tmp_path, "1.tar", "2.tar")
    got = expand_shards(["z.tar", str(tmp_path / "*.tar"), "z.tar", str(tmp_path / "1.tar")])
    assert got == ["z.tar", str(tmp_path / "1.tar"), str(tmp_path / "2.tar")]


def test_path_objects(tmp_path: Path) -> None:
    assert expand_shards(tmp_path / "one.tar") == [str(tmp_path / "one.tar")]
    assert expand_shards([tmp_path / "a.tar", "b.tar"]) == [str(tmp_path / "a.tar"), "b.tar"]


def test_a_glob_matching_nothing_names_the_pattern(tmp_path: Path) -> None:
    pattern = str(tmp_path / "none-*.tar")
    with pytest.raises(ShardNotFoundError, match="none-") as e:
        expand_shards(pattern)
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(ShardNotFoundError, match=r"none-\[0-9\]"):
        expand_shards(["ok.tar", str(tmp_path / "none-[0-9].tar")])


def test_no_patterns_at_all() -> None:
    with pytest.raises(ShardNotFoundError, match="no shards"):
        expand_shards([])


def test_urls_are_not_globbed() -> None:
    assert expand_shards("s3://bucket/x-*.tar") == ["s3://bucket/x-*.tar"]
    assert expand_shards("https://h/d-{0..1}.tar?x=[1]") == [
        "https://h/d-0.tar?x=[1]",
        "https://h/d-1.tar?x=[1]",
    ]
    assert url_scheme("gs://b/o") and url_scheme("http://h/x")
    assert not url_scheme("file:///tmp/x.tar") and not url_scheme("/tmp/a://b")
    assert not url_scheme("C:/x.tar")


def test_a_folder_is_its_tar_files_in_order(tmp_path: Path) -> None:
    folder = tmp_path / "da[ta]"  # glob characters in the folder's own name
    folder.mkdir()
    for name in ("b.tar", "a.tar", "a.tar.idx.sqlite", "notes.txt", "c.tar.gz"):
        (folder / name).write_bytes(b"")
    (folder / "sub.tar").mkdir()  # a folder, even one named like a shard, is not listed
    (folder / "sub.tar" / "x.tar").write_bytes(b"")
    assert expand_shards(folder) == [str(folder / "a.tar"), str(folder / "b.tar")]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ShardNotFoundError, match="holds no .tar shard"):
        expand_shards(str(empty))


def test_build_index_refuses_a_folder_with_what_to_do(tmp_path: Path) -> None:
    from indextar import build_index

    with pytest.raises(ShardNotFoundError, match=r"is a folder, not a shard.*\*\.tar"):
        build_index(tmp_path)


def test_file_urls_are_local_paths(tmp_path: Path) -> None:
    from conftest import sample_members, tar_bytes

    from indextar import IndexedTarDataset

    shard = tmp_path / "a-0.tar"
    shard.write_bytes(tar_bytes(sample_members(3)))
    assert expand_shards(f"file://{tmp_path}/a-{{0..0}}.tar") == [str(shard)]
    assert len(IndexedTarDataset(f"file://{shard}")) == 3
