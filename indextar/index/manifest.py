"""Dataset manifests: one JSON file listing every shard with its sample count.

The format is a superset of wids' shard list, so wids' ``ShardListDataset`` reads it
too. It is written one shard a line, so that :func:`append_to_manifest` adds shards
without reading the others::

    {"wids_version": 1, "indextar_manifest_version": 1, ..., "shardlist": [
    {"url": "train-000000.tar", "nsamples": 1000, "filesize": 51210240, ...},
    {"url": "train-000001.tar", "nsamples": 1000, "filesize": 51199488, ...},
    ]}

``url`` and ``index`` are relative to the manifest's folder when they lie inside it,
absolute otherwise. ``filesize`` is wids' name for the shard's size in bytes;
``fingerprint`` is the index's content fingerprint of the shard. Opening a dataset
through a manifest reads this one file; each shard's index is opened, and checked
against the entry, only when the shard is first read.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..atomic import atomic_path, rewrite_lock, write_atomic
from ..errors import ManifestError
from ..source.location import ShardLocation
from .shard import ShardIndex

__all__ = [
    "MANIFEST_VERSION",
    "ManifestShard",
    "Manifest",
    "read_manifest",
    "write_manifest",
    "append_to_manifest",
    "is_manifest",
]

MANIFEST_VERSION = 1

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ManifestShard:
    """One shard of a manifest, with its paths resolved against the manifest's folder."""

    url: str
    nsamples: int
    filesize: int | None = None
    fingerprint: str | None = None
    index: str | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """A read manifest: where it was read from and its shards in order."""

    path: Path
    name: str | None
    shards: tuple[ManifestShard, ...]

    @property
    def num_samples(self) -> int:
        """Total number of samples over all shards."""
        return sum(shard.nsamples for shard in self.shards)


def is_manifest(path: str | os.PathLike[str]) -> bool:
    """Whether ``shards=`` names a manifest (a ``.json`` file) rather than tar shards."""
    return os.fspath(path).lower().endswith(".json")


_POSIX = os.sep == "/"


def _relative(path: str, prefix: str) -> str:
    """The local ``path`` relative to the folder ``prefix`` (ending in a separator) if
    inside it."""
    absolute = os.path.abspath(path)
    if absolute.startswith(prefix):
        relative = absolute[len(prefix) :]
        return relative if _POSIX else Path(relative).as_posix()
    return absolute


def _resolve(path: str, prefix: str) -> str:
    """``path`` relative to the folder ``prefix`` (ending in a separator), unless absolute
    or a URL. Plain string tests, not pathlib: 100k shards open in well under 1 s."""
    if path.startswith("/") if _POSIX else os.path.isabs(path):
        return path
    return path if ShardLocation.of(path).remote else prefix + path


def write_manifest(
    path: str | os.PathLike[str], indexes: Sequence[ShardIndex], *, name: str | None = None
) -> Path:
    """Write a manifest of the indexed shards ``indexes``, in the order given.

    Parameters
    ----------
    path
        The manifest file to write (conventionally ``*.json``); written atomically.
    indexes
        Opened indexes, as returned by :func:`~indextar.build_index` or
        :func:`~indextar.open_index`.
    name
        Optional dataset name (wids uses it for its cache folder).

    Returns
    -------
    Path
        The path written.
    """
    target = Path(path)
    folder = target.parent.absolute()
    document: dict[str, Any] = {
        "wids_version": 1,
        "indextar_manifest_version": MANIFEST_VERSION,
        "indextar_version": __version__,
    }
    if name is not None:
        document["name"] = name
    head = json.dumps(document)[:-1] + ', "shardlist": ['
    lines = _entry_lines(indexes, folder)
    with rewrite_lock(target):  # not between an append's read and its rename
        write_atomic(target, head + (",".join(lines) + "\n" if lines else "") + _TRAILER)
    return target


# A manifest is written one shard a line, ending in this: new shards go in before it.
_TRAILER = "]}\n"


def _entry_lines(indexes: Sequence[ShardIndex], folder: Path) -> list[str]:
    prefix = os.path.join(str(folder), "")
    return [
        "\n"
        + json.dumps(
            {
                "url": index.shard if index.location.remote else _relative(index.shard, prefix),
                "nsamples": index.meta.num_samples,
                "filesize": index.meta.shard_size,
                "fingerprint": index.meta.fingerprint,
                "index": _relative(str(index.path), prefix),
            }
        )
        for index in indexes
    ]


def append_to_manifest(path: str | os.PathLike[str], indexes: Sequence[ShardIndex]) -> Path:
    """Add the shards ``indexes`` to the end of the manifest at ``path``, in time O(new).

    The old entries are not read: their bytes are copied (by the kernel, where it
    can) into a temporary file, the new entries are written after them, and the
    file is renamed over the old one, so readers see the old manifest or the new,
    never a part. The read and the rename hold the manifest's lock
    (:func:`~indextar.atomic.rewrite_lock`): appends at once from many processes all
    land. A manifest not written by :func:`write_manifest` (wids' own) is
    read and rewritten whole. Shards already listed are not looked for: give only
    new ones. Shards the manifest already ends with, unchanged and in the same order,
    are the exception: they are not added again, so a re-run of an append after a
    crash that may or may not have landed it changes nothing.

    Raises
    ------
    ManifestError
        If ``path`` is not a manifest.
    FileNotFoundError
        If it does not exist (write it with :func:`write_manifest` first).
    """
    target = Path(path)
    folder = target.parent.absolute()
    target.stat()  # FileNotFoundError now, not after the lock made a missing folder
    with rewrite_lock(target), open(target, "rb") as old:
        size = os.fstat(old.fileno()).st_size
        old.seek(max(0, size - 3))
        if old.read() != _TRAILER.encode() or size < 3:
            return _rewrite_with(target, indexes)
        old.seek(max(0, size - 4))
        empty = old.read(1) == b"["
        lines = _entry_lines(indexes, folder)
        added = ("" if empty else ",") + ",".join(lines) + "\n" + _TRAILER
        if lines and _ends_with(old, size, ",".join(lines) + "\n" + _TRAILER):
            log.info("%s already ends with these %d shards: not appended again", target, len(lines))
            return target
        with atomic_path(target) as tmp, open(tmp, "wb") as new:
            _copy_range(old, new, size - len(_TRAILER) - (0 if empty else 1))
            new.write(added.encode())
    return target


def _ends_with(file: Any, size: int, tail: str) -> bool:
    """Whether the manifest ``file`` (of ``size`` bytes) ends with the entries ``tail``
    (and its trailer), as a whole run of entries: after ``[`` or ``,``."""
    encoded = tail.encode()
    if size < len(encoded) + 1:
        return False
    file.seek(size - len(encoded) - 1)
    return file.read(1) in (b"[", b",") and file.read() == encoded


def _copy_range(source: Any, target: Any, length: int) -> None:
    """The first ``length`` bytes of ``source`` into ``target``, in the kernel where it can."""
    source.seek(0)
    copied = 0
    if hasattr(os, "copy_file_range"):
        try:
            while copied < length:
                n = os.copy_file_range(
                    source.fileno(), target.fileno(), length - copied, copied, copied
                )
                if n == 0:
                    break
                copied += n
        except OSError:  # another filesystem or an old kernel: copy in user space
            copied = 0
        target.seek(copied)
    source.seek(copied)
    while copied < length:
        chunk = source.read(min(1 << 20, length - copied))
        if not chunk:
            break
        target.write(chunk)
        copied += len(chunk)


def _rewrite_with(target: Path, indexes: Sequence[ShardIndex]) -> Path:
    """Append by reading and rewriting a manifest in another layout (wids', or older)."""
    document = json.loads(target.read_text())
    if not isinstance(document, dict) or not isinstance(document.get("shardlist"), list):
        raise ManifestError(f"manifest {str(target)!r} has no 'shardlist'")
    folder = target.parent.absolute()
    document["shardlist"] += [json.loads(line) for line in _entry_lines(indexes, folder)]
    write_atomic(target, json.dumps(document) + "\n")
    return target


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest written by :func:`write_manifest`, or a wids shard list.

    Raises
    ------
    ManifestError
        If the file is not valid JSON or lacks ``shardlist`` entries with ``url`` and
        ``nsamples``; or it uses wids' nested ``datasets``, which indextar does not read.
    FileNotFoundError
        If the file does not exist.
    """
    source = Path(path)
    try:
        document = json.loads(source.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"manifest {str(source)!r} is not valid JSON: {e}") from e
    if not isinstance(document, dict) or "shardlist" not in document:
        raise ManifestError(f"manifest {str(source)!r} has no 'shardlist'")
    if document.get("datasets"):
        raise ManifestError(
            f"manifest {str(source)!r} nests 'datasets'; indextar reads flat shard lists only"
        )
    version = document.get("indextar_manifest_version", MANIFEST_VERSION)
    if version != MANIFEST_VERSION:
        raise ManifestError(
            f"manifest {str(source)!r} has indextar_manifest_version {version!r}; "
            f"indextar {__version__} reads version {MANIFEST_VERSION}"
        )
    prefix = os.path.join(str(source.parent.absolute()), "")
    entries = document["shardlist"]
    try:
        shards = tuple([_entry(entry, prefix) for entry in entries])
    except (KeyError, TypeError, ValueError, AttributeError):
        for position, entry in enumerate(entries):  # again, slowly, to say which entry
            try:
                _entry(entry, prefix)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ManifestError(
                    f"manifest {str(source)!r}: shardlist entry {position} is malformed "
                    f"({e!r}); each needs 'url' and an integer 'nsamples'"
                ) from e
        raise
    name = document.get("name")
    return Manifest(path=source, name=None if name is None else str(name), shards=shards)


def _entry(entry: dict[str, Any], prefix: str) -> ManifestShard:
    index, filesize = entry.get("index"), entry.get("filesize")
    return ManifestShard(
        url=_resolve(str(entry["url"]), prefix),
        nsamples=int(entry["nsamples"]),
        filesize=None if filesize is None else int(filesize),
        fingerprint=entry.get("fingerprint"),
        index=None if index is None else _resolve(str(index), prefix),
    )
