"""Where a shard lives is decided once, by ShardLocation, from its name."""

from __future__ import annotations

from pathlib import Path

from indextar import index_path
from indextar.index.remote import remote_index_path
from indextar.source.location import ShardLocation, remote_shards, scheme_package


def test_a_url_is_remote_and_a_path_or_file_url_is_local(tmp_path: Path) -> None:
    remote = ShardLocation.of("s3://bucket/data-0.tar")
    assert remote.remote and remote.scheme == "s3" and remote.name == "s3://bucket/data-0.tar"
    local = ShardLocation.of(f"file://{tmp_path}/a.tar")
    assert not local.remote and local.name == f"{tmp_path}/a.tar"
    assert not ShardLocation.of("/tmp/a://b.tar").remote  # a path with :// in it
    assert ShardLocation.of(tmp_path / "a.tar") == ShardLocation(str(tmp_path / "a.tar"))
    assert ShardLocation.of(remote) is remote
    names = ["a.tar", "https://h/b.tar", "file:///c.tar", "gs://b/d.tar"]
    assert remote_shards(names) == frozenset({1, 3})


def test_the_index_lives_where_index_path_and_remote_index_path_say(tmp_path: Path) -> None:
    shard = tmp_path / "a.tar"
    assert ShardLocation.of(shard).index_path(None) == index_path(shard)
    assert ShardLocation.of(shard).index_path(tmp_path / "ix") == index_path(
        shard, index_dir=tmp_path / "ix"
    )
    url = "https://host/x/data-0.tar"
    assert ShardLocation.of(url).index_path(tmp_path) == remote_index_path(url, tmp_path)


def test_each_scheme_names_its_package() -> None:
    assert scheme_package("s3") == "s3fs" and scheme_package("gs") == "gcsfs"
    assert scheme_package("weird") == "the fsspec backend for weird://"
