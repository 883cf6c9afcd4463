"""Files that appear complete or not at all: written to a temporary file, then renamed.

Every file indextar writes for others to read (indexes, manifests, exports) goes
through :func:`atomic_path`, and shards written by ``TarWriter`` through
:func:`create_temp`: a temporary ``.<name>.<random>.tmp`` next to the target,
fsynced and renamed over it when the write succeeded, deleted when it failed. Readers
see the old file or the new one, never a part.

A process killed mid-write cannot delete its temporary file. While a writer is alive
it holds an exclusive ``flock`` on its file, so :func:`remove_stale_temps` can tell a
dead writer's leftover (unlocked, and older than a few minutes) from a live one, even
one in another process on this machine, and removes only the former. Writers sweep
before they write, listing each folder once per process.

A rename replaces the file whole, so two writers that each read a file, change it and
rename their copy over it would lose one change: the second rename carries the file as
it was before the first. Such writers hold :func:`rewrite_lock`, an exclusive ``flock``
on a hidden ``.<name>.lock`` beside the file, from their read to their rename. Readers
take no lock (they see the old file or the new), the kernel drops a dead writer's
lock, and the lock file is removed when the lock is released.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "atomic_path",
    "create_temp",
    "write_atomic",
    "rewrite_lock",
    "remove_stale_temps",
    "STALE_SECONDS",
]

log = logging.getLogger(__name__)

#: A temporary file untouched for this long, and unlocked, belongs to a dead writer.
STALE_SECONDS = 600.0


# ".<target name>.<12 hex digits>.tmp": what create_temp names a temporary file.
_TEMP_NAME = re.compile(r"^\.(.+)\.[0-9a-f]{12}\.tmp$")


def _temp_path(target: Path) -> Path:
    return target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")


def _temps_in(folder: Path) -> dict[str, list[str]]:
    """The temporary files in ``folder``, by the name of the file each was to become."""
    temps: dict[str, list[str]] = {}
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return temps
    for name in names:
        match = _TEMP_NAME.match(name)
        if match:
            temps.setdefault(match.group(1), []).append(name)
    return temps


@contextlib.contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """A temporary path next to ``target``, renamed over it if the block succeeds.

    The caller writes the temporary file by any means (it exists, empty, on entry).
    On success its contents are fsynced and it replaces ``target``; on any exception
    it is deleted and the exception propagates. The file's permissions follow the
    umask, as a plain ``open`` would leave them. Raises ``OSError`` if the folder
    cannot be created or written.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = create_temp(target)
    try:
        yield tmp
        os.fsync(fd)  # the inode's data, however it was written
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def create_temp(target: Path) -> tuple[int, Path]:
    """A new temporary file next to ``target``, locked as a live writer's: (fd, path).

    Dead writers' files for ``target`` are removed first. The file is hidden and does
    not end in ``target``'s suffix, so no shard or index pattern matches it; its
    permissions follow the umask (``mkstemp`` would make it 0600). The lock lasts
    until ``fd`` is closed.
    """
    _sweep_before_writing(target)
    while True:
        tmp = _temp_path(target)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            break
        except FileExistsError:  # pragma: no cover - 48 random bits collided
            continue
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # this file's writer is alive
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return fd, tmp


def write_atomic(target: Path, data: bytes | str) -> None:
    """Write ``data`` (str as UTF-8) to ``target`` through :func:`atomic_path`."""
    with atomic_path(target) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def rewrite_lock(target: Path) -> Iterator[None]:
    """Hold ``target``'s writers' lock: no other process (or thread) holding it runs
    the block at the same time.

    Take it around a read of ``target`` and the rename of its new version, so that no
    other writer's change lands in between. It is not reentrant: a second
    ``rewrite_lock`` of the same target inside the block waits forever. Raises
    ``OSError`` if the lock file cannot be created (a read-only folder), before the
    block runs.
    """
    lock = target.with_name(f".{target.name}.lock")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = _lock_file(lock)
    try:
        yield
    finally:
        # Removed while held: a process waiting on this file finds it gone (or another
        # in its place) once it gets the lock, and locks the file now at the path.
        with contextlib.suppress(OSError):
            lock.unlink()
        os.close(fd)


def _lock_file(lock: Path) -> int:
    """An fd holding the exclusive lock of the file now at ``lock`` (created if absent)."""
    while True:
        try:
            # Read-write where it can: NFS emulates flock by locks that need write access.
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except PermissionError as e:
            try:  # left by another user's writer that died
                fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # none there: the folder is not writable
                raise e from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for %s, held by another writer", lock)
                fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            now = os.stat(lock)
        except FileNotFoundError:  # its holder removed it as we locked it
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if (held.st_ino, held.st_dev) == (now.st_ino, now.st_dev):
            return fd
        os.close(fd)  # a lock file already released: lock the one now at the path


def remove_stale_temps(target: Path, *, older_than: float = STALE_SECONDS) -> int:
    """Delete dead writers' temporary files for ``target``; return how many.

    A temporary file is stale when no process holds its lock and it has not been
    modified for ``older_than`` seconds. Files that cannot be inspected are left.
    """
    names = _temps_in(target.parent).get(target.name, [])
    return _remove_if_stale([target.parent / name for name in names], older_than)


def _sweep_before_writing(target: Path) -> None:
    """:func:`remove_stale_temps` for ``target``, listing each folder once per process.

    Listing a folder for every file written into it would make writing n files into
    one folder cost O(n²): indexing 10,000 shards lists the folder once per worker
    process, not 10,000 times. Temporary files left by writers that die while this
    process runs are swept by the next process.
    """
    folder = os.fspath(target.parent)
    temps = _temps_by_target.get(folder)
    if temps is None:
        temps = _temps_by_target[folder] = _temps_in(target.parent)
    names = temps.pop(target.name, None)
    if names:
        _remove_if_stale([target.parent / name for name in names], STALE_SECONDS)


# Each folder's temporary files as this process first listed them (see above).
_temps_by_target: dict[str, dict[str, list[str]]] = {}


def _remove_if_stale(temps: list[Path], older_than: float) -> int:
    removed = 0
    now = time.time()
    for tmp in temps:
        try:
            if now - tmp.stat().st_mtime < older_than:
                continue
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # locked: its writer is alive
            continue
        else:
            tmp.unlink(missing_ok=True)
            removed += 1
            log.info("removed %s, left by a writer that did not finish", tmp)
        finally:
            os.close(fd)
    return removed
