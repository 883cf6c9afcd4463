"""Resource faults: a full disk, a read-only index folder, few file descriptors, and a
shard deleted or truncated under an open dataset.

Limits are set in child processes (``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``), so this
process keeps its own. A full or read-only filesystem is a small tmpfs mounted in a
private mount namespace (``unshare -m``), which disappears with the child.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes
from loopback_servers import HttpServer

from indextar import IndexedTarDataset, StaleIndexError, TruncatedShardError, build_index
from indextar.errors import ShardNotFoundError
from indextar.index.build import build_indexes
from indextar.source import local as sources

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def run_child(code: str, *args: str, unshare: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; ``unshare`` gives it a private mount namespace."""
    prelude = f"import sys; sys.path[:0] = [{str(TESTS)!r}, {str(REPO / 'tools')!r}]\n"
    command = [sys.executable, "-c", prelude + textwrap.dedent(code), *args]
    if unshare:
        command = ["unshare", "-m", "--propagation", "private", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
    )
    return done.returncode == 0


needs_mounts = pytest.mark.skipif(
    not can_unshare(), reason="needs unshare -m and mount (root in a container that allows it)"
)


def shard_file(folder: Path, samples: int = 3000, name: str = "data.tar") -> Path:
    path = folder / name
    path.write_bytes(tar_bytes(sample_members(samples)))
    return path


# -- disk full -------------------------------------------------------------------------

INDEX_DISK_FULL = """
    import os, resource, signal, sys
    from pathlib import Path
    from indextar import build_index, IndextarError
    shard, limit, mount = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if mount:  # a tmpfs of `limit` bytes for the index folder
        os.makedirs(mount, exist_ok=True)
        assert os.system(f"mount -t tmpfs -o size={limit} tmpfs {mount}") == 0
        index_dir = mount
    else:  # files may not grow past `limit` bytes: writes fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        index_dir = None
    try:
        build_index(shard, index_dir=index_dir)
    except IndextarError as e:
        print(type(e).__name__, e)
    print("left:", sorted(os.listdir(index_dir or shard.parent)))
"""


@pytest.mark.parametrize("how", ["RLIMIT_FSIZE", pytest.param("tmpfs", marks=needs_mounts)])
def test_disk_full_while_writing_an_index(how: str, tmp_path: Path) -> None:
    shard = shard_file(tmp_path)
    mount = str(tmp_path / "small") if how == "tmpfs" else ""
    done = run_child(INDEX_DISK_FULL, str(shard), str(64 * 1024), mount, unshare=how == "tmpfs")
    assert done.returncode == 0, done.stderr
    error, left = done.stdout.splitlines()
    assert error.startswith("IndexWriteError cannot write the index"), error
    assert "No space left" in error or "full" in error, error
    assert "data.tar" in error and ".idx.sqlite" in error
    # Nothing half-written is kept: not the index, not its temporary file.
    assert left == ("left: []" if mount else "left: ['data.tar']"), left


CACHE_DISK_FULL = """
    import os, resource, signal, sys
    from pathlib import Path
    from indextar.source.cache import CachedSource, ShardCache
    from indextar.errors import IndextarError
    from indextar.source.remote import RangeSource
    url, folder, limit, mount = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if mount:
        folder.mkdir(parents=True, exist_ok=True)
        assert os.system(f"mount -t tmpfs -o size={limit} tmpfs {folder}") == 0
    else:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    stat = RangeSource(url).stat()
    source = CachedSource(url, cache=ShardCache(folder, limit=10 * stat.size), expected=stat)
    try:
        source.read(0, 512)
        print("read")
    except IndextarError as e:
        print(type(e).__name__, e)
    print("left:", sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")))
"""


@pytest.mark.parametrize("how", ["RLIMIT_FSIZE", pytest.param("tmpfs", marks=needs_mounts)])
def test_disk_full_while_downloading_into_the_shard_cache(how: str, tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    shard_file(served, samples=2000)
    with HttpServer(served) as http:
        done = run_child(
            CACHE_DISK_FULL,
            http.url("data.tar"),
            str(tmp_path / "cache"),
            str(256 * 1024),
            "1" if how == "tmpfs" else "",
            unshare=how == "tmpfs",
        )
    assert done.returncode == 0, done.stderr
    error, left = done.stdout.splitlines()
    assert error.startswith("CacheFullError"), error
    assert "data.tar" in error and str(tmp_path / "cache") in error, error
    assert left == "left: []", left  # no partial download kept


# -- read-only index folder ----------------------------------------------------------------

READ_ONLY = """
    import os, sys
    from indextar import build_index, IndextarError
    shard, folder = sys.argv[1], sys.argv[2]
    os.makedirs(folder, exist_ok=True)
    assert os.system(f"mount -t tmpfs -o ro,size=64k tmpfs {folder}") == 0
    try:
        build_index(shard, index_dir=folder)
    except IndextarError as e:
        print(type(e).__name__, e)
"""


@needs_mounts
def test_read_only_index_folder_says_where_and_how_to_choose(tmp_path: Path) -> None:
    # As root, chmod does not stop writes: a read-only mount does.
    shard = shard_file(tmp_path, samples=10)
    done = run_child(READ_ONLY, str(shard), str(tmp_path / "ro"), unshare=True)
    assert done.returncode == 0, done.stderr
    message = done.stdout.strip()
    assert message.startswith("IndexWriteError cannot write the index"), message
    assert str(tmp_path / "ro") in message and "Read-only file system" in message, message
    assert "index_dir=" in message


# -- few file descriptors ----------------------------------------------------------------

FEW_FDS = """
    import random, resource, sys
    from conftest import sample_members
    from indextar import IndexedTarDataset
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    shards = sys.argv[1:]
    ds = IndexedTarDataset(shards)
    rng = random.Random(3)
    for _ in range(1500):
        i = rng.randrange(len(ds))
        sample = ds[i]
        n = int(sample["__shard__"].rsplit("-", 1)[1].split(".")[0])
        expected = sample_members(10, prefix=f"p{n}_")
        assert sample["jpg"] == expected[sample["__key__"] + ".jpg"], i
    print("ok", len(ds._open))
"""


def test_ulimit_n_64_and_200_shards_read_at_random(tmp_path: Path) -> None:
    shards = []
    for n in range(200):
        path = tmp_path / f"shard-{n:03d}.tar"
        path.write_bytes(tar_bytes(sample_members(10, prefix=f"p{n}_")))
        shards.append(str(path))
    build_indexes(shards, workers=2)
    done = run_child(FEW_FDS, *shards)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok"), done.stdout


# -- shards changed under an open dataset -------------------------------------------------


@pytest.mark.usefixtures("map_reader")
def test_shard_truncated_while_open_is_an_error_not_sigbus(tmp_path: Path) -> None:
    shard = shard_file(tmp_path, samples=200)
    build_index(shard)
    ds = IndexedTarDataset(shard)
    first = ds[0]
    with open(shard, "r+b") as f:  # in place, as a careless copy or a full disk would
        f.truncate(shard.stat().st_size // 2)
    with pytest.raises(TruncatedShardError, match="truncated while open") as info:
        ds[len(ds) - 1]
    assert str(shard) in str(info.value)
    # Nor what is left: a shard shrinking in place is being rewritten (cp over it
    # truncates first), so its first bytes may already be another file's.
    with pytest.raises(TruncatedShardError, match="truncated while open"):
        ds[0]
    assert first["__key__"] == "s000000"
    ds.close()


def test_shard_deleted_while_open_reads_its_old_bytes_then_fails_on_reopen(tmp_path: Path) -> None:
    shard = shard_file(tmp_path, samples=200)
    build_index(shard)
    ds = IndexedTarDataset(shard)
    before = [ds[i] for i in range(0, len(ds), 37)]
    shard.unlink()
    # The mapping keeps the deleted file's bytes: the same samples, never garbage.
    assert [ds[i] for i in range(0, len(ds), 37)] == before
    ds.close()  # as an LRU eviction would
    with pytest.raises(ShardNotFoundError, match="no longer exists"):
        ds[0]


@pytest.mark.usefixtures("map_reader")
def test_random_truncations_under_a_reader_never_give_wrong_bytes(tmp_path: Path) -> None:
    shard = shard_file(tmp_path, samples=300)
    build_index(shard)
    expected = sample_members(300)
    rng = random.Random(5)
    size = shard.stat().st_size
    for _ in range(20):
        ds = IndexedTarDataset(shard)
        ds[0]
        cut = rng.randrange(size)
        os.truncate(shard, cut)
        for i in rng.sample(range(len(ds)), 30):
            try:
                sample = ds[i]
            except TruncatedShardError:
                continue
            assert sample["jpg"] == expected[sample["__key__"] + ".jpg"]
        ds.close()
        shard.write_bytes(tar_bytes(expected))
        build_index(shard, force=True)


UNGUARDED_SIGBUS = """
    import faulthandler, os, sys
    from pathlib import Path
    from indextar import IndexedTarDataset
    if sys.argv[2] == "faulthandler":
        faulthandler.enable()
    shard = Path(sys.argv[1])
    ds = IndexedTarDataset(shard)
    ds[0]  # maps the shard: indextar's SIGBUS handler is in place
    os.truncate(shard, 1024)
    with ds._leased(0) as opened:
        mapped = opened.source._map
    print("touching", flush=True)
    mapped[len(mapped) - 1]  # not a guarded copy: must crash as it would without indextar
    print("survived", flush=True)
"""


@pytest.mark.parametrize("before", ["default", "faulthandler"])
def test_a_sigbus_outside_indextars_copies_still_crashes(before: str, tmp_path: Path) -> None:
    shard = shard_file(tmp_path, samples=50)
    build_index(shard)
    done = run_child(UNGUARDED_SIGBUS, str(shard), before)
    assert done.stdout.splitlines() == ["touching"], done.stdout
    if before == "default":
        assert done.returncode == -signal.SIGBUS, (done.returncode, done.stderr)
    else:  # the handler that was there first (faulthandler) still runs
        assert "Fatal Python error: Bus error" in done.stderr, done.stderr
        assert done.returncode != 0


def test_short_writes_into_the_cache_are_finished_not_left_as_holes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A nearly full disk makes pwrite write part of a chunk without an error; the
    # pre-sized file would keep zeros where the rest should be.
    from indextar.source import download

    real_pwrite = os.pwrite
    calls = []

    def half_pwrite(fd: int, data: bytes, offset: int) -> int:
        calls.append(len(data))
        return real_pwrite(fd, bytes(data[: max(1, len(data) // 2)]), offset)

    monkeypatch.setattr(download.os, "pwrite", half_pwrite)
    path = tmp_path / "part"
    payload = os.urandom(10_000)
    with open(path, "wb") as f:
        f.truncate(len(payload))
        download.pwrite_all(f.fileno(), payload, 0)
    assert path.read_bytes() == payload and len(calls) > 10


def test_a_shard_replaced_while_open_is_not_read_through_its_old_index(tmp_path: Path) -> None:
    # Under fd pressure an open shard's map is dropped and made again on the next read:
    # a file replaced meanwhile must not be read with the old index's offsets.
    shard = shard_file(tmp_path, samples=200)
    build_index(shard)
    ds = IndexedTarDataset(shard)
    ds[0]
    replacement = tmp_path / "new.tar"
    replacement.write_bytes(tar_bytes(sample_members(150, prefix="other")))
    replacement.replace(shard)
    assert ds[1]["__key__"] == "s000001"  # still the old file's map
    for source in list(sources._mapped):  # what _make_room_for_a_map does at the fd limit
        source.close()
    with pytest.raises(StaleIndexError, match="replaced or rewritten"):
        ds[1]
    ds.close()
