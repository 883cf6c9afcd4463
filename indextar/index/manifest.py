"""Dataset manifests: one JSON file listing every shard with its sample count.

The format is a superset of wids' shard list, so wids' ``ShardListDataset`` reads it
too::

    {
      "wids_version": 1,
      "indextar_manifest_version": 1,
      "indextar_version": "0.1.0",
      "name": "train",
      "shardlist": [
        {"url": "train-000000.tar", "nsamples": 1000, "filesize": 51210240,
         "fingerprint": "9f1c...", "index": "train-000000.tar.idx.sqlite"},
        ...
      ]
    }

``url`` and ``index`` are relative to the manifest's folder when they lie inside it,
absolute otherwise. ``filesize`` is wids' name for the shard's size in bytes;
``fingerprint`` is the index's content fingerprint of the shard. Opening a dataset
through a manifest reads this one file; each shard's index is opened, and checked
against the entry, only when the shard is first read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..atomic import write_atomic
from ..errors import ManifestError
from ..patterns import is_url
from .shard import ShardIndex

__all__ = [
    "MANIFEST_VERSION",
    "ManifestShard",
    "Manifest",
    "read_manifest",
    "write_manifest",
    "is_manifest",
]

MANIFEST_VERSION = 1


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


def _relative(path: str, folder: Path) -> str:
    if is_url(path):
        return path
    absolute = Path(path).absolute()
    try:
        return absolute.relative_to(folder).as_posix()
    except ValueError:
        return str(absolute)


def _resolve(path: str, folder: str) -> str:
    if is_url(path) or os.path.isabs(path):
        return path
    return os.path.join(folder, path)  # not pathlib: 10k shards should open in well under 1 s


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
    document["shardlist"] = [
        {
            "url": _relative(index.shard, folder),
            "nsamples": index.meta.num_samples,
            "filesize": index.meta.shard_size,
            "fingerprint": index.meta.fingerprint,
            "index": _relative(str(index.path), folder),
        }
        for index in indexes
    ]
    write_atomic(target, json.dumps(document, indent=1) + "\n")
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
    folder = str(source.parent.absolute())
    shards = []
    for position, entry in enumerate(document["shardlist"]):
        try:
            url = _resolve(str(entry["url"]), folder)
            nsamples = int(entry["nsamples"])
            index = entry.get("index")
            shards.append(
                ManifestShard(
                    url=url,
                    nsamples=nsamples,
                    filesize=None if entry.get("filesize") is None else int(entry["filesize"]),
                    fingerprint=entry.get("fingerprint"),
                    index=None if index is None else _resolve(str(index), folder),
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(
                f"manifest {str(source)!r}: shardlist entry {position} is malformed ({e!r}); "
                "each needs 'url' and an integer 'nsamples'"
            ) from e
    name = document.get("name")
    return Manifest(path=source, name=None if name is None else str(name), shards=tuple(shards))
