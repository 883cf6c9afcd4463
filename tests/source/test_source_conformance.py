"""Every byte source passes :class:`conformance.ByteSourceConformance`: a local file's
map, HTTP and S3 ranges, the shard cache (filled whole or by ranges), gzip seek points
and zstd frames, each serving the same shard (real servers on 127.0.0.1, built once
for the module)."""

from __future__ import annotations

import gzip
import importlib
import itertools
import os
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import s3fs
import zstandard
from conformance import ByteSourceConformance
from conftest import sample_members, tar_bytes
from loopback_servers import HttpServer, SeaweedServer

import indextar
import indextar.source
from indextar.errors import RemoteReadError
from indextar.index.opener import shard_source
from indextar.source.base import ByteSource
from indextar.source.cache import CachedSource, ShardCache
from indextar.source.fillcache import FillingSource
from indextar.source.frames import FramedSource
from indextar.source.gzipped import GzipSeekSource
from indextar.source.local import LocalFileSource, open_source
from indextar.source.remote import RangeSource, RetryPolicy
from indextar.write.recompress import recompress

FAST = RetryPolicy(attempts=2, initial_delay=0.01, max_delay=0.02)
SPACING = 1 << 16  # the smallest seek spacing: a few seek points in the gzip shard
_names = itertools.count()


def _shard() -> bytes:
    members = sample_members(60, exts=("jpg", "cls"))
    members["s_big.bin"] = os.urandom(150_000)  # reads that cross seek points and frames
    return tar_bytes(members, "gnu")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``data.tar``; ``packed.tar.gz``, indexed with seek points; ``packed.tar.zst``, a
    frame per sample, indexed by its writer. (Not ``data.tar.gz``: aiohttp's static files
    answer a GET of ``data.tar`` that accepts gzip with ``data.tar.gz``, its ETag too.)"""
    folder = tmp_path_factory.mktemp("conformance")
    (folder / "data.tar").write_bytes(_shard())
    (folder / "packed.tar.gz").write_bytes(gzip.compress((folder / "data.tar").read_bytes()))
    indextar.build_index(folder / "packed.tar.gz", seek_spacing=SPACING)
    recompress(folder / "data.tar", folder / "packed.tar.zst", compress="zstd")
    return folder


@pytest.fixture(scope="module")
def http_root(root: Path) -> Path:
    return root


@pytest.fixture(scope="module")
def s3_files(root: Path) -> list[Path]:
    return [root / "data.tar"]


def _copy(root: Path, folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes((root / name).read_bytes())
    return path


def _rewrite(path: Path) -> None:
    """The file's bytes changed in place: same size, one byte flipped, a later mtime."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


class TestLocalFileSource(ByteSourceConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, root: Path) -> bytes:
        return (root / "data.tar").read_bytes()

    @pytest.fixture(scope="class")
    @classmethod
    def source(cls, root: Path) -> Iterator[ByteSource]:
        with open_source(root / "data.tar") as source:
            assert isinstance(source, LocalFileSource)
            yield source

    @pytest.fixture
    def changing(self, root: Path, tmp_path: Path) -> tuple[ByteSource, Callable[[], None]]:
        path = _copy(root, tmp_path, "data.tar")
        return open_source(path), lambda: _rewrite(path)


class _Remote(ByteSourceConformance):
    """Ranged reads: a read past the end is a RemoteReadError (the server's 416, or a
    short answer)."""

    past_end = (RemoteReadError,)

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, root: Path) -> bytes:
        return (root / "data.tar").read_bytes()


class TestHttpRangeSource(_Remote):
    @pytest.fixture(scope="class")
    @classmethod
    def source(cls, http: HttpServer) -> Iterator[ByteSource]:
        url = http.url("data.tar")
        expected = RangeSource(url, retry=FAST).stat()
        with RangeSource(url, expected=expected, retry=FAST) as source:
            yield source

    @pytest.fixture
    def changing(self, http: HttpServer, http_root: Path) -> tuple[ByteSource, Callable[[], None]]:
        name = f"changing-{next(_names)}.tar"
        path = http_root / name
        path.write_bytes((http_root / "data.tar").read_bytes())
        url = http.url(name)
        source = RangeSource(url, expected=RangeSource(url, retry=FAST).stat(), retry=FAST)
        return source, lambda: _rewrite(path)  # aiohttp's ETag is of the mtime and size


class TestS3RangeSource(_Remote):
    @pytest.fixture(scope="class")
    @classmethod
    def source(cls, s3: SeaweedServer) -> Iterator[ByteSource]:
        options = s3.storage_options()
        url = "s3://shards/data.tar"
        expected = RangeSource(url, storage_options=options, retry=FAST).stat()
        with RangeSource(url, expected=expected, storage_options=options, retry=FAST) as source:
            yield source

    @pytest.fixture
    def changing(self, s3: SeaweedServer, expected: bytes) -> tuple[ByteSource, Callable[[], None]]:
        options: dict[str, Any] = s3.storage_options()
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        key = f"shards/changing-{next(_names)}.tar"
        fs.pipe(key, expected)
        url = f"s3://{key}"
        stat = RangeSource(url, storage_options=options, retry=FAST).stat()
        source = RangeSource(url, expected=stat, storage_options=options, retry=FAST)
        return source, lambda: fs.pipe(key, expected[::-1])  # another ETag (its MD5)


class TestCachedSource(ByteSourceConformance):
    """The shard cache: a local map of the downloaded copy, opened again by every
    worker, child and thread (its access time, not its modification time, orders the
    eviction). Each test has a cache of its own."""

    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, root: Path) -> bytes:
        return (root / "data.tar").read_bytes()

    @staticmethod
    def _cached(http: HttpServer, name: str, folder: Path) -> CachedSource:
        url = http.url(name)
        cache = ShardCache(folder, limit="64MiB", retry=FAST)
        return CachedSource(url, cache=cache, expected=RangeSource(url, retry=FAST).stat())

    @pytest.fixture
    def source(self, http: HttpServer, tmp_path: Path) -> Iterator[ByteSource]:
        with self._cached(http, "data.tar", tmp_path / "cache") as source:
            yield source

    @pytest.fixture
    def changing(self, http: HttpServer, tmp_path: Path) -> tuple[ByteSource, Callable[[], None]]:
        source = self._cached(http, "data.tar", tmp_path)
        cached = source.cache.path_for(source.url, source.expected)
        return source, lambda: _rewrite(cached)  # the copy, changed under its map


class TestFillingSource(_Remote):
    """The shard cache filled by ranged reads: a range from the server until the cache
    entry holds it, then from the entry. Each test has a cache of its own."""

    @staticmethod
    def _filling(http: HttpServer, name: str, folder: Path) -> FillingSource:
        url = http.url(name)
        cache = ShardCache(folder, limit="64MiB", retry=FAST, fill="ranges")
        return FillingSource(url, cache=cache, expected=RangeSource(url, retry=FAST).stat())

    @pytest.fixture
    def source(self, http: HttpServer, tmp_path: Path) -> Iterator[ByteSource]:
        with self._filling(http, "data.tar", tmp_path / "cache") as source:
            yield source

    @pytest.fixture
    def changing(
        self, http: HttpServer, http_root: Path, tmp_path: Path
    ) -> tuple[ByteSource, Callable[[], None]]:
        name = f"changing-{next(_names)}.tar"
        path = http_root / name
        path.write_bytes((http_root / "data.tar").read_bytes())
        return self._filling(http, name, tmp_path), lambda: _rewrite(path)


class TestGzipSeekSource(ByteSourceConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, root: Path) -> bytes:
        return (root / "data.tar").read_bytes()

    @staticmethod
    def _open(path: Path) -> GzipSeekSource:
        source = shard_source(indextar.build_index(path, seek_spacing=SPACING))
        assert isinstance(source, GzipSeekSource) and len(source.points.points) > 2
        return source

    @pytest.fixture(scope="class")
    @classmethod
    def source(cls, root: Path) -> Iterator[ByteSource]:
        with cls._open(root / "packed.tar.gz") as source:
            yield source

    @pytest.fixture
    def changing(self, root: Path, tmp_path: Path) -> tuple[ByteSource, Callable[[], None]]:
        path = _copy(root, tmp_path, "packed.tar.gz")
        return self._open(path), lambda: _rewrite(path)


class TestZstdFramedSource(ByteSourceConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def expected(cls, root: Path) -> bytes:
        with open(root / "packed.tar.zst", "rb") as f:
            reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
            return reader.read()

    @staticmethod
    def _open(path: Path) -> FramedSource:
        source = shard_source(indextar.open_index(path))
        assert isinstance(source, FramedSource) and source.codec == "zstd"
        return source

    @pytest.fixture(scope="class")
    @classmethod
    def source(cls, root: Path) -> Iterator[ByteSource]:
        with cls._open(root / "packed.tar.zst") as source:
            yield source

    @pytest.fixture
    def changing(self, root: Path, tmp_path: Path) -> tuple[ByteSource, Callable[[], None]]:
        path = _copy(root, tmp_path, "packed.tar.zst")
        indextar.build_index(path)
        return self._open(path), lambda: _rewrite(path)


COVERED: dict[type[ByteSource], type[ByteSourceConformance]] = {
    LocalFileSource: TestLocalFileSource,
    RangeSource: TestS3RangeSource,  # and TestHttpRangeSource
    CachedSource: TestCachedSource,
    FillingSource: TestFillingSource,
    GzipSeekSource: TestGzipSeekSource,
    FramedSource: TestZstdFramedSource,
}


def test_the_suite_runs_over_every_source() -> None:
    """Every ByteSource in ``indextar.source`` has a subclass of the suite here: a new
    source passes it before anything else is written (the model: zarr's store tests)."""
    for module in pkgutil.iter_modules(indextar.source.__path__, "indextar.source."):
        importlib.import_module(module.name)

    def subclasses(cls: type[ByteSource]) -> Iterator[type[ByteSource]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = {cls for cls in subclasses(ByteSource) if cls.__module__.startswith("indextar.")}
    assert found <= COVERED.keys(), f"no conformance run for {found - COVERED.keys()}"
