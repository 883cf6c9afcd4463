"""Per-sample checksums of a remote shard (issue 26, 1e): a span that does not match is
read once more, then refused naming the shard, the key and the byte offset."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import flip_bit, tar_bytes

from indextar import ChecksumMismatchError, IndexedTarDataset, build_index, open_index

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from indexrows import load_samples
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


def test_a_flipped_byte_is_read_again_once_then_refused(
    root: Path, http: HttpServer, tmp_path: Path
) -> None:
    url = http.url(NAME)
    ds = IndexedTarDataset([url], index_dir=tmp_path)
    assert ds[20]["bin"] == bytes([20]) * 4096
    start = int(load_samples(open_index(root / NAME)).start_offset[20])
    flip_bit(root / NAME, start + 512 + 100)  # in k020.bin's data
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
        flip_bit(root / NAME, start + 512 + 100)


class _RestoreOnRetry(logging.Handler):
    """Flips the bit back when the read logs that it will read the sample again: the
    server's next answer is then the right one (a transient fault, deterministically)."""

    def __init__(self, path: Path, offset: int) -> None:
        super().__init__(logging.WARNING)
        self.path, self.offset, self.retries = path, offset, 0

    def emit(self, record: logging.LogRecord) -> None:
        if "reading it again" in record.getMessage():
            self.retries += 1
            flip_bit(self.path, self.offset)


def test_a_span_right_on_the_second_read_is_returned(
    root: Path, http: HttpServer, tmp_path: Path
) -> None:
    url = http.url(NAME)
    ds = IndexedTarDataset([url], index_dir=tmp_path)
    start = int(load_samples(open_index(root / NAME)).start_offset[7])
    handler = _RestoreOnRetry(root / NAME, start + 512 + 5)
    logging.getLogger("indextar.read.shard").addHandler(handler)
    try:
        for read in (lambda: ds[7], lambda: ds.__getitems__([6, 7])[-1]):
            flip_bit(root / NAME, start + 512 + 5)
            http.reset()
            assert read()["bin"] == bytes([7]) * 4096
            assert handler.retries == 1 and http.stats()[NAME]["requests"] >= 2
            handler.retries = 0
    finally:
        logging.getLogger("indextar.read.shard").removeHandler(handler)
