"""Plans of :class:`~indextar.PackedDataset` cached on disk, keyed like selections.

One file holds what opening a ``PackedDataset`` computes for one ``(lengths source,
max_length, strategy, seed, epoch)``: the documents' lengths, a digest of them, and the
plan's arrays. The next open with the same arguments loads it instead of reading the
lengths from every shard's index and planning again. (``PackedDataset`` caches the
plan it opens with, epoch 0: one file a dataset, not one an epoch.)

The key is a digest of the lengths' source and the plan's arguments. For lengths named
by an attribute or SQL expression: the expression, and every shard's index and shard
identity (:func:`~indextar.read.selection.update_identity`: a rebuilt index, an import
into one or a changed shard makes another key) and, for a ``where``/``select`` view,
which of its dataset's samples it holds. For lengths given as an array: its values. A
callable of the shards' arrays has no identity to key on, nor has a joined view's
values: their plans are not cached.

A file is one ``.npz`` written through :func:`~indextar.atomic.atomic_path` (a temporary
file renamed over it), so no reader sees a part of one. A file that still does not load
whole (zip checks each member's CRC), or whose arrays disagree with each other or with
the dataset, is treated as absent: the plan is made again and the file rewritten.
"""

from __future__ import annotations

import hashlib
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..atomic import atomic_path
from ..index.shard import PathLike
from ..order.packing import PackPlan
from .protocols import KeyedView
from .selection import default_selection_cache, nonempty_shards, update_identity

__all__ = [
    "CachedPlan",
    "lengths_digest",
    "plan_cache_folder",
    "lengths_source",
    "plan_key",
    "load_plan",
    "save_plan",
]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]

_VERSION = b"indextar.packs.v1"
_ARRAYS = ("lengths", "offsets", "documents", "piece_lengths")


@dataclass(frozen=True, slots=True)
class CachedPlan:
    """What a ``PackedDataset`` keeps of its lengths and plan.

    Attributes
    ----------
    lengths
        Each document's token count, int64.
    digest
        The lengths' digest (hex), which the sampler records and checks on resume.
    plan
        The packs.
    """

    lengths: I64
    digest: str
    plan: PackPlan


def lengths_digest(lengths: I64) -> str:
    """The digest of documents' lengths that ``PackedDataset.selection`` records."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(np.ascontiguousarray(lengths, dtype="<i8").tobytes())
    return digest.hexdigest()


def plan_cache_folder(cache_dir: PathLike | None | bool) -> Path | None:
    """The folder of cached plans: ``packs`` under ``cache_dir`` (default: the selection
    cache's folder); ``None`` for ``cache_dir=False``."""
    if cache_dir is False:
        return None
    root = default_selection_cache() if cache_dir is None or cache_dir is True else cache_dir
    return Path(root) / "packs"


def lengths_source(data: Any, lengths: Any) -> bytes | None:
    """The identity of ``data``'s lengths as ``lengths=`` names them (see the module
    docstring), or ``None`` where they have none to key on."""
    digest = hashlib.blake2b(_VERSION, digest_size=16)
    digest.update(f"{len(data)}\0".encode())
    if isinstance(lengths, str):
        base = getattr(data, "base", data)
        if isinstance(base, KeyedView) or not hasattr(base, "shard_entries"):
            return None
        digest.update(f"expression\0{lengths}\0".encode())
        numbers = nonempty_shards(base)
        update_identity(digest, base, numbers)
        if base is not data:
            held = np.asarray(data.base_indices(np.arange(len(data))), dtype="<i8")
            digest.update(b"view\0" + held.tobytes())
        return digest.digest()
    if callable(lengths):
        return None
    given = np.asarray(lengths)
    if given.ndim != 1 or given.dtype.kind not in "iuf":
        return None  # refused by document_lengths, uncached
    digest.update(b"array\0" + np.ascontiguousarray(given, dtype="<f8").tobytes())
    return digest.digest()


def plan_key(source: bytes, *, max_length: int, strategy: str, seed: int, epoch: int) -> str:
    """The file name (without ``.npz``) of the plan of ``source``'s lengths."""
    digest = hashlib.blake2b(source, digest_size=16)
    digest.update(f"{max_length}\0{strategy}\0{seed}\0{epoch}".encode())
    return digest.hexdigest()


def load_plan(folder: Path, key: str, documents: int, *, split: bool) -> CachedPlan | None:
    """The plan cached under ``key`` for ``documents`` documents (``split``: with each
    piece's first token, as ``concat-split`` plans), or ``None`` where there is none,
    or it does not load whole and consistent."""
    path = folder / f"{key}.npz"
    try:
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}  # reads, checks CRCs
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        log.warning("the cached plan %s does not load (%s); planning again", path, e)
        return None
    cached = _checked(arrays, key, documents, split)
    if cached is None:
        log.warning("the cached plan %s is not one plan of %d documents; planning again",
                    path, documents)  # fmt: skip
    return cached


def _checked(arrays: dict[str, Any], key: str, documents: int, split: bool) -> CachedPlan | None:
    """The plan in ``arrays`` if they are one plan of ``documents`` documents."""
    if any(name not in arrays for name in (*_ARRAYS, "meta", "key", "digest")):
        return None
    meta = arrays["meta"]
    lengths, offsets = arrays["lengths"], arrays["offsets"]
    pieces, piece_lengths = arrays["documents"], arrays["piece_lengths"]
    starts = arrays.get("starts")
    if (
        str(arrays["key"]) != key
        or meta.shape != (3,)
        or lengths.shape != (documents,)
        or offsets.ndim != 1
        or offsets.size < 1
        or offsets[0] != 0
        or offsets[-1] != pieces.size
        or piece_lengths.shape != pieces.shape
        or (starts is not None) != split
        or (starts is not None and starts.shape != pieces.shape)
        or (pieces.size and (pieces.min() < 0 or pieces.max() >= documents))
    ):
        return None
    max_length, overlong, empty = (int(v) for v in meta)
    plan = PackPlan(offsets, pieces, piece_lengths, starts, max_length, overlong, empty)
    return CachedPlan(lengths.astype(np.int64), str(arrays["digest"]), plan)


def save_plan(folder: Path, key: str, cached: CachedPlan) -> None:
    """Write ``cached`` under ``key``, whole or not at all; a folder that cannot be
    written is logged, and the dataset stays uncached."""
    plan = cached.plan
    lengths = cached.lengths
    small = not lengths.size or int(lengths.max()) < (1 << 31)
    arrays: dict[str, npt.NDArray[Any]] = {
        "lengths": lengths.astype(np.int32) if small else lengths,
        "offsets": plan.offsets,
        "documents": plan.documents,
        "piece_lengths": plan.lengths,
        "meta": np.array([plan.max_length, plan.overlong, plan.empty], np.int64),
        "key": np.array(key),
        "digest": np.array(cached.digest),
    }
    if plan.starts is not None:
        arrays["starts"] = plan.starts
    try:  # straight to the file: a plan of 1e8 documents is 1.3 GB, never held twice
        with atomic_path(folder / f"{key}.npz") as tmp, open(tmp, "wb") as out:
            np.savez(out, allow_pickle=False, **arrays)
    except OSError as e:  # a read-only home still packs, uncached
        log.warning("cannot cache the plan in %s: %s", folder, e)
