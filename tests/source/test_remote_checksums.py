"""Per-sample checksums of a remote shard (issue 26, 1e): a span that does not match is
read once more, then refused naming the shard, the key and the byte offset."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import tar_bytes

from indextar import ChecksumMismatchError, IndexedTarDataset, build_index

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from loopback_servers import HttpServer  # noqa: E402

NAME = "data.tar"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("served")
    members = {f"k{i:03d}.{ext}": bytes([i]) * 4096 for i in range(40) for ext in ("bin", "cls")}
    shard = folder / NAME
    shard.write_bytes(tar_bytes(members))
    build_index(shard, checksums=True)  # served next to it as data.tar.idx.sqlite
    return folder


@pytest.fixture(scope="module")
def http(root: Path) -> Iterator[HttpServer]:
    with HttpServer(root) as server:
        yield server


def _flip(shard: Path, offset: int) -> None:
    """Flip one bit in place, keeping size and mtime: the server's ETag stays the same."""
    st = shard.stat()
    with open(shard, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 1]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_flipped_byte_is_read_again_once_then_refused(
    root: Path, http: HttpServer, tmp_path: Path
) -> None:
    url = http.url(NAME)
    ds = IndexedTarDataset([url], index_dir=tmp_path)
    assert ds[20]["bin"] == bytes([20]) * 4096
    start, end = ds._shard(0).span(20)
    _flip(root / NAME, start + 512 + 100)  # in k020.bin's data
    try:
        # ds[i]: the read and one more; a batch of two: two reads and one more.
        for read, requests in ((lambda: ds[20], 2), (lambda: ds.__getitems__([19, 20]), 3)):
            http.reset()
            with pytest.raises(ChecksumMismatchError) as err:
                read()
            assert err.value.shard == url and err.value.key == "k020"
            assert err.value.offset == start and f"byte offset {start}" in str(err.value)
            assert http.stats()[NAME]["requests"] == requests
        assert ds[19]["bin"] == bytes([19]) * 4096
    finally:
        _flip(root / NAME, start + 512 + 100)
