"""Atomic files: complete or absent, and dead writers' temporary files cleaned up."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import sample_members, tar_bytes

from indextar import build_index
from indextar.atomic import STALE_SECONDS, atomic_path, remove_stale_temps, write_atomic


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_success_replaces_the_target_and_leaves_nothing_else(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "m.json"
    write_atomic(target, "old")
    old_umask = os.umask(0o027)
    try:
        write_atomic(target, "new ü")
    finally:
        os.umask(old_umask)
    assert target.read_text() == "new ü"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the umask's, not mkstemp's 0600
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.json"]


def test_failure_keeps_the_old_file_and_removes_the_temporary_one(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="mid-write"), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("mid-write")
    assert target.read_text() == "old" and temps(tmp_path) == []


def test_stale_temporary_files_go_young_and_live_ones_stay(tmp_path: Path) -> None:
    target = tmp_path / "s.tar.idx.sqlite"
    dead, young, live = (
        tmp_path / f".{target.name}.{n * 12}.tmp"
        for n in ("d", "e", "f")  # as writers name them
    )
    for path in (dead, young, live):
        path.write_bytes(b"partial")
    other = tmp_path / ".other.idx.sqlite.0123456789ab.tmp"  # another target's: not ours to judge
    other.write_bytes(b"x")
    for path in (dead, live, other):
        age(path, STALE_SECONDS + 60)
    # A writer that is still running, in another process, holds its file's lock.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(live),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        write_atomic(target, b"index")  # sweeps before it writes
        assert temps(tmp_path) == sorted(p.name for p in (young, live, other))
    finally:
        os.kill(holder.pid, 9)
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()
    assert remove_stale_temps(target) == 1  # the writer died: its file is stale now
    assert temps(tmp_path) == sorted(p.name for p in (young, other))
    assert target.read_bytes() == b"index"


def test_build_index_sweeps_a_killed_builds_temporary_file(tmp_path: Path) -> None:
    shard = tmp_path / "data.tar"
    shard.write_bytes(tar_bytes(sample_members(20)))
    left = tmp_path / ".data.tar.idx.sqlite.0123456789ab.tmp"
    left.write_bytes(b"SQLite format 3\0 and then nothing")  # as a SIGKILL leaves it
    age(left, STALE_SECONDS + 1)
    assert len(build_index(shard)) == 20
    assert temps(tmp_path) == []


def test_a_shard_writer_sweeps_a_killed_writers_partial_shard(tmp_path: Path) -> None:
    from indextar import TarWriter

    left = tmp_path / ".s.tar.0123456789ab.tmp"
    left.write_bytes(b"\0" * 1024)  # the start of a shard a killed writer never finished
    age(left, STALE_SECONDS + 1)
    with TarWriter(tmp_path / "s.tar") as writer:
        assert temps(tmp_path) != [] and left.name not in temps(tmp_path)  # ours, locked
        writer.write({"__key__": "a", "txt": b"x"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.tar", "s.tar.idx.sqlite"]


def test_writing_many_files_lists_their_folder_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from indextar import atomic

    listed: list[str] = []
    real = os.scandir

    def counting(path: str) -> object:
        listed.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(atomic.os, "scandir", counting)
    for n in range(20):  # one listing, not twenty: n files in a folder must not cost n²
        write_atomic(tmp_path / f"m-{n}.json", "{}")
    assert listed == [str(tmp_path)]
