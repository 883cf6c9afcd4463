"""Which sample of one shard set has the key of each sample of another, from their indexes.

The join of :meth:`IndexedTarDataset.join <indextar.IndexedTarDataset.join>` is two
arrays: for each joined sample, its index in the left dataset and in the right one
(``-1`` where a left join found no right sample). They come from the indexes alone:
every shard's key blob and key lengths (one ``SELECT`` each, shards in threads,
not the rest of the index's arrays: :mod:`indextar.index.keyblob`);
the right keys put in a hash table and each left key looked up in it, every match
compared byte for byte, in C (``_keyjoin.c``), each left shard's keys as soon as they are
read (the table built and the left indexes read at once). The numpy reference hashes each key
to 64 bits (8 bytes at a time, however long), sorts the right hashes, finds the left
ones by ``searchsorted`` and compares every match; two distinct right keys with one
hash (about one chance in 1e5 at 1e7 keys a side) fall back to a dict of the right
keys. The shards' boundaries and order on either side do not matter.

The plan is cached as ``.npy`` files (opened memory-mapped: milliseconds at 1e7 keys)
under the selection cache's ``joins/`` folder, keyed by both sides' index identities
(:func:`~indextar.read.selection.update_identity`): a side changed since is another
key, and computing it again opens that side's indexes, which refuse a changed shard
(:class:`~indextar.StaleIndexError`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..atomic import atomic_path, write_atomic
from ..errors import IndexFormatError, JoinError
from ..index.keyblob import ShardKeys
from ..index.shard import PathLike
from .extensions import keyjoin
from .protocols import IndexedShards
from .selection import default_selection_cache, nonempty_shards, update_identity

__all__ = ["JoinHow", "KeyColumn", "JoinPlan", "hash_keys", "join_keys", "plan_join"]

log = logging.getLogger(__name__)

JoinHow = Literal["inner", "left"]
Array = npt.NDArray[np.int64]

_CACHE_VERSION = b"indextar.join.v1"
_THREADS = 8
# Bytes 0..n of a little-endian word kept: _MASKS[n], n clipped to 0..8.
_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [2**64 - 1], dtype=np.uint64)
_MULTIPLY = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(29)


@dataclass(frozen=True, slots=True)
class KeyColumn:
    """Every key of a dataset, in dataset order: one blob, and where each key is in it."""

    blob: bytes
    starts: Array
    ends: Array
    exts: frozenset[str]
    """The member extensions of any sample (each shard's ``ext_names``)."""

    def __len__(self) -> int:
        return len(self.starts)

    def key(self, at: int) -> str:
        """Key number ``at``."""
        start, end = int(self.starts[at]), int(self.ends[at])
        return self.blob[start:end].decode("utf-8", "surrogateescape")

    def words(self) -> npt.NDArray[np.uint64]:
        """Element ``j``: the 8 bytes of the blob from byte ``j``, little-endian (a view
        with a stride of one byte over the blob and 8 zero bytes)."""
        padded = self.blob + bytes(8)
        return np.ndarray((len(self.blob) + 1,), dtype="<u8", buffer=padded, strides=(1,))

    @classmethod
    def of(cls, dataset: IndexedShards) -> KeyColumn:
        """The keys of every non-empty shard's index (opened and validated: a changed
        shard raises :class:`~indextar.StaleIndexError`), read in threads: each index's
        keys and their lengths alone (:meth:`~indextar.ShardIndex.load_keys`)."""
        numbers = nonempty_shards(dataset)

        def load(number: int) -> ShardKeys:
            return dataset.shard_index(number).load_keys()

        with ThreadPoolExecutor(max(1, min(_THREADS, len(numbers)))) as pool:
            loaded = list(pool.map(load, numbers))
        total = sum(len(keys.starts) for keys in loaded)
        starts, ends = np.empty(total, np.int64), np.empty(total, np.int64)
        exts: set[str] = set()
        offset = at = 0
        for keys in loaded:
            count = len(keys.starts)
            np.add(keys.starts, offset, out=starts[at : at + count])
            np.add(keys.ends, offset, out=ends[at : at + count])
            exts.update(keys.ext_names)
            offset += len(keys.blob)
            at += count
        blob = b"".join(keys.blob for keys in loaded)
        return cls(blob=blob, starts=starts, ends=ends, exts=frozenset(exts))


def hash_keys(keys: KeyColumn) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of each key: its length, then 8 bytes at a time, multiplied and
    shifted (the words past a key's end masked off)."""
    lengths = keys.ends - keys.starts
    hashes = lengths.astype(np.uint64) * _MULTIPLY
    if not lengths.size:
        return hashes
    words, last = keys.words(), len(keys.blob)
    with np.errstate(over="ignore"):
        for column in range(0, int(lengths.max()), 8):
            word = words[np.minimum(keys.starts + column, last)]
            word &= _MASKS[np.clip(lengths - column, 0, 8)]
            hashes ^= word
            hashes *= _MULTIPLY
            hashes ^= hashes >> _SHIFT
    return hashes


def _equal(left: KeyColumn, at: Array, right: KeyColumn, to: Array) -> npt.NDArray[np.bool_]:
    """Whether left key ``at[i]`` is right key ``to[i]``, byte for byte."""
    lengths = left.ends[at] - left.starts[at]
    same: npt.NDArray[np.bool_] = lengths == right.ends[to] - right.starts[to]
    if not at.size:
        return same
    left_words, right_words = left.words(), right.words()
    left_starts, right_starts = left.starts[at], right.starts[to]
    for column in range(0, int(lengths.max()), 8):
        mask = _MASKS[np.clip(lengths - column, 0, 8)]
        a = left_words[np.minimum(left_starts + column, len(left.blob))] & mask
        b = right_words[np.minimum(right_starts + column, len(right.blob))] & mask
        same &= a == b
    return same


def join_keys(
    left: KeyColumn,
    right: KeyColumn,
    *,
    hashes: Callable[[KeyColumn], npt.NDArray[np.uint64]] | None = None,
) -> Array:
    """For each left key, the position of the right sample with that key, or ``-1``:
    by the C hash join where it is built (and ``hashes`` is not given), else in numpy
    with ``hashes`` (default :func:`hash_keys`).

    Raises
    ------
    JoinError
        If a key is held by more than one right sample (the first such key named).
    """
    native = keyjoin()
    if native is not None and hashes is None:
        table = _key_table(native, right)
        found = np.empty(len(left), dtype=np.int64)
        table.probe(left.blob, left.starts, left.ends, found)
        return found
    return _join_numpy(left, right, hash_keys if hashes is None else hashes)


def _key_table(native: ModuleType, right: KeyColumn) -> Any:
    """The C hash table of the right keys (``_keyjoin.KeyTable``)."""
    table = native.KeyTable(right.blob, right.starts, right.ends)
    if table.duplicate >= 0:
        raise _duplicate_error(right, int(table.duplicate))
    return table


def _join_native(
    native: ModuleType, left: IndexedShards, right_keys: KeyColumn
) -> tuple[Array, frozenset[str]]:
    """:func:`join_keys` of ``left``'s keys in C, shard by shard as each shard's keys
    are read (in threads), while the table of the right keys is built: reading the left
    indexes overlaps the join. Returns each left sample's right position (or ``-1``),
    and the left shards' member extensions."""
    found = np.empty(len(left), dtype=np.int64)
    numbers = nonempty_shards(left)
    with ThreadPoolExecutor(max(2, min(_THREADS, len(numbers) + 1))) as pool:
        building = pool.submit(_key_table, native, right_keys)  # first: it never waits

        def probe(number: int) -> tuple[str, ...]:
            index = left.shard_index(number)
            keys = index.load_keys()
            if len(keys.starts) != left.shard_sizes[number]:  # never a slot left unwritten
                raise IndexFormatError(
                    f"index {str(index.path)!r} of shard {left.shards[number]!r} has "
                    f"{len(keys.starts)} keys, not the {left.shard_sizes[number]} samples "
                    "the dataset counts"
                )
            start = int(left.shard_starts[number])
            into = found[start : start + len(keys.starts)]
            starts, ends = np.ascontiguousarray(keys.starts), np.ascontiguousarray(keys.ends)
            building.result().probe(keys.blob, starts, ends, into)
            return keys.ext_names

        exts = list(pool.map(probe, numbers))
        building.result()  # raises a duplicate right key where no left shard did
    return found, frozenset(name for names in exts for name in names)


def _duplicate_error(right: KeyColumn, at: int) -> JoinError:
    return JoinError(
        f"the key {right.key(at)!r} is held by more than one sample of the joined dataset; "
        "a join needs one sample per key on that side"
    )


def _join_numpy(
    left: KeyColumn, right: KeyColumn, hashes: Callable[[KeyColumn], npt.NDArray[np.uint64]]
) -> Array:
    """:func:`join_keys` in numpy: the right hashes sorted, the left ones (sorted, for
    a fast ``searchsorted``) found among them, every match compared byte for byte."""
    right_hashes = hashes(right)
    order = np.argsort(right_hashes, kind="stable").astype(np.int64)
    ordered = right_hashes[order]
    tied = np.flatnonzero(ordered[1:] == ordered[:-1])
    if tied.size:
        first, second = order[tied], order[tied + 1]
        duplicate = np.flatnonzero(_equal(right, first, right, second))
        if duplicate.size:
            raise _duplicate_error(right, int(first[duplicate[0]]))
        log.info("%d 64-bit key hashes collide; joining by the keys themselves", tied.size)
        return _join_by_dict(left, right)
    found = np.full(len(left), -1, dtype=np.int64)
    if not len(right) or not len(left):
        return found
    left_hashes = hashes(left)
    left_order = np.argsort(left_hashes)  # sorted queries: searchsorted walks forward
    slot = np.empty(len(left), dtype=np.int64)
    slot[left_order] = np.searchsorted(ordered, left_hashes[left_order])
    np.minimum(slot, ordered.size - 1, out=slot)
    hit = np.flatnonzero(ordered[slot] == left_hashes)
    candidates = order[slot[hit]]
    same = _equal(left, hit, right, candidates)  # a different key with the same hash: no match
    found[hit[same]] = candidates[same]
    return found


def _join_by_dict(left: KeyColumn, right: KeyColumn) -> Array:
    """:func:`join_keys` without hashes, for when two right keys share one."""
    blob = right.blob
    where = {
        blob[s:e]: at for at, (s, e) in enumerate(zip(right.starts.tolist(), right.ends.tolist()))
    }
    return np.fromiter(
        (where.get(left.blob[s:e], -1) for s, e in zip(left.starts.tolist(), left.ends.tolist())),
        np.int64,
        len(left),
    )


@dataclass(frozen=True, slots=True)
class JoinPlan:
    """The joined samples: each one's left index (``None``: all of the left dataset, in
    order: a left join, or an inner join that matched every left sample) and right
    index (``-1``: none), and both sides' member extensions."""

    left: Array | None
    right: Array
    left_exts: frozenset[str]
    right_exts: frozenset[str]
    digest: str

    def __len__(self) -> int:
        return len(self.right)

    def keeping_right(self, kept: Array, how: JoinHow) -> JoinPlan:
        """The join with a view of the right dataset, its sorted indices ``kept``: a
        pair whose right sample is not in the view is dropped (an inner join) or has
        no right sample (a left join)."""
        right = np.asarray(self.right)
        in_view = np.zeros(int(kept.max()) + 1 if kept.size else 0, dtype=bool)
        in_view[kept] = True
        held = (right >= 0) & (right < in_view.size)
        held[held] = in_view[right[held]]
        digest = hashlib.blake2b(self.digest.encode(), digest_size=16)
        digest.update(np.ascontiguousarray(kept, dtype="<i8").tobytes())
        if how == "left":
            right, left = np.where(held, right, -1), None
        else:
            lefts = np.arange(right.size) if self.left is None else np.asarray(self.left)
            right, left = right[held], lefts[held]
        return dataclasses.replace(self, left=left, right=right, digest=digest.hexdigest())


def _cache_files(folder: Path, digest: str) -> tuple[Path, Path, Path]:
    return folder / f"{digest}.left.npy", folder / f"{digest}.right.npy", folder / f"{digest}.json"


def _join_digest(left: IndexedShards, right: IndexedShards, how: JoinHow) -> str:
    digest = hashlib.blake2b(_CACHE_VERSION, digest_size=16)
    for side in (left, right):
        numbers = nonempty_shards(side)
        digest.update(f"{how}\0{len(side)}\0{len(numbers)}\0".encode())
        update_identity(digest, side, numbers)
    return digest.hexdigest()


def _load(folder: Path, digest: str, how: JoinHow) -> JoinPlan | None:
    left_file, right_file, meta_file = _cache_files(folder, digest)
    with contextlib.suppress(OSError, ValueError, KeyError):
        meta = json.loads(meta_file.read_text())  # written last: the other two are whole
        right = np.load(right_file, mmap_mode="r", allow_pickle=False)
        left = None
        if how == "inner" and not meta.get("whole_left", False):
            left = np.load(left_file, mmap_mode="r", allow_pickle=False)
        return JoinPlan(
            left, right, frozenset(meta["left_exts"]), frozenset(meta["right_exts"]), digest
        )
    return None


def _save(folder: Path, plan: JoinPlan) -> None:
    left_file, right_file, meta_file = _cache_files(folder, plan.digest)
    try:
        for path, array in ((left_file, plan.left), (right_file, plan.right)):
            if array is not None:
                with atomic_path(path) as temp, open(temp, "wb") as f:
                    np.save(f, array, allow_pickle=False)
        meta = {
            "left_exts": sorted(plan.left_exts),
            "right_exts": sorted(plan.right_exts),
            "whole_left": plan.left is None,
        }
        write_atomic(meta_file, json.dumps(meta).encode())
    except OSError as e:  # a read-only home still joins, uncached
        log.warning("cannot cache the join in %s: %s", folder, e)


def plan_join(
    left: IndexedShards,
    right: IndexedShards,
    how: JoinHow,
    *,
    cache_dir: PathLike | None | bool = None,
) -> JoinPlan:
    """The join of ``left`` and ``right`` by key, from the cache or their indexes.

    Raises
    ------
    JoinError
        If ``how`` is not ``"inner"`` or ``"left"``, or a key is held by more than one
        right sample.
    StaleIndexError
        If a shard of either side changed since it was indexed.
    """
    if how not in ("inner", "left"):
        raise JoinError(f"how= must be 'inner' or 'left'; got {how!r}")
    folder = None
    if cache_dir is not False:
        root = default_selection_cache() if cache_dir in (None, True) else Path(cache_dir)  # type: ignore[arg-type]
        folder = root / "joins"
    digest = _join_digest(left, right, how)
    if folder is not None:
        cached = _load(folder, digest, how)
        if cached is not None:
            log.debug("join of %r and %r from the cache %s", left, right, folder)
            return cached
    right_keys, native = KeyColumn.of(right), keyjoin()
    if native is not None:
        found, left_exts = _join_native(native, left, right_keys)
    else:
        left_keys = KeyColumn.of(left)
        found, left_exts = join_keys(left_keys, right_keys), left_keys.exts
    matched = np.flatnonzero(found >= 0)
    log.info(
        "joined %d of %d left samples to %d right samples",
        matched.size,
        len(found),
        len(right_keys),
    )
    if how == "inner" and matched.size < found.size:
        plan = JoinPlan(matched, found[matched], left_exts, right_keys.exts, digest)
    else:
        plan = JoinPlan(None, found, left_exts, right_keys.exts, digest)
    if folder is not None:
        _save(folder, plan)
    return plan
