"""open_stream decompresses local, piped and remote shards through one checked path
(source/codecs.decompressing): a cut or corrupt .tar.gz is an error naming the shard and
the compressed offset, never a bare EOFError or zlib.error, and other compressions are
refused with the command that decompresses them."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import pytest
from conftest import tar_bytes

import indextar
from indextar.errors import CompressedShardError, ShardFormatError, TruncatedShardError
from indextar.read.opening import open_stream

TAR = tar_bytes({f"k{i:03d}.txt": b"sample %d " % i * 200 for i in range(50)})


def read_all(url: str) -> int:
    return len(list(indextar.StreamingTarDataset(url, allow_pipe=True)))


def test_a_cut_targz_names_the_shard_and_the_compressed_offset(tmp_path: Path) -> None:
    whole = gzip.compress(TAR)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    for url in (str(cut), f"pipe:cat {cut}"):
        with pytest.raises(TruncatedShardError, match="gzip stream is cut short") as caught:
            read_all(url)
        assert caught.value.shard == url
    with open_stream(str(cut)) as stream, pytest.raises(TruncatedShardError) as caught:
        stream.read()
    assert caught.value.offset == len(whole) // 2  # the local file tells where it ended


def test_a_corrupt_targz_names_the_shard(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(TAR))
    data[len(data) // 3] ^= 0xFF
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ShardFormatError, match="corrupt gzip data") as caught:
        read_all(str(bad))
    assert caught.value.shard == str(bad) and caught.value.offset is not None


def test_other_compressions_are_refused_with_the_command_that_decompresses_them(
    tmp_path: Path,
) -> None:
    shard = tmp_path / "data.tar.bz2"
    shard.write_bytes(bz2.compress(TAR))
    with pytest.raises(CompressedShardError, match="streaming needs a plain") as caught:
        read_all(str(shard))
    assert f"bzip2 -dc {shard} > {tmp_path / 'data.tar'}" in str(caught.value)
    (tmp_path / "plain.tar").write_bytes(TAR)
    assert read_all(f"file://{tmp_path / 'plain.tar'}") == 50  # and a plain one reads
