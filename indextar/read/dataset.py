"""IndexedTarDataset: map-style random access over indexed tar shards.

What a dataset holds is O(shards): shard paths, per-shard sample counts and their
cumulative sums in numpy. Each process opens shards lazily, on first access, into an
LRU of at most ``max_open_shards`` :class:`~indextar.read.shard.OpenShard` objects
(numpy tables plus a byte source), shared by the process's threads: each read leases
its shard, which is closed when evicted only once no read holds it
(:mod:`~indextar.read.shard`). Pickling drops that cache (``spawn`` workers start
empty); a forked worker keeps the parent's tables, which are shared copy-on-write and
never written, while its byte sources unmap their inherited mappings at once and map
again on first read. No open file, mmap or SQLite connection crosses into a worker.
"""

from __future__ import annotations

import bisect
import contextlib
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
import numpy.typing as npt

from ..errors import SampleIndexError
from ..index.manifest import ManifestShard, is_manifest, read_manifest
from ..index.opener import open_entry, open_entry_index
from ..index.shard import PathLike, ShardIndex
from ..order.readahead import Hint
from ..source.location import remote_shards
from ..source.patterns import expand_shards
from ..source.prefetch import PrefetchStats
from .decode import DecodeArg
from .entries import index_entries
from .joining import JoinViews
from .pool import BatchPool, DecodeThreads
from .readahead import DEFAULT_PREFETCH_BYTES, ReadAhead
from .remote_batch import RemoteBatches
from .remote_options import dataset_options, fetch_spans
from .sample import SampleBuilder, fields_template
from .shard import Lease, LRUCache, OpenShard
from .subset import KeyViews

__all__ = ["IndexedTarDataset", "DEFAULT_MAX_OPEN_SHARDS"]

DEFAULT_MAX_OPEN_SHARDS = 64
"""Shards a process keeps open at once (file descriptors and loaded offset tables)."""

ShardsArg = Union[str, "os.PathLike[str]", Iterable[Union[str, "os.PathLike[str]"]]]


class IndexedTarDataset(RemoteBatches, KeyViews, JoinViews):
    """Map-style dataset over WebDataset tar shards, one sample per ``ds[i]``.

    Parameters
    ----------
    shards
        A brace pattern (``"data-{000000..000099}.tar"``), a glob, a list of paths, or
        the path of a dataset manifest (``*.json``, see :func:`~indextar.write_manifest`).
    decode
        ``None`` returns members as ``bytes``. A webdataset spec string (``"rgb8"``,
        ``"torchrgb"``, ``"pil"``, ...), a handler ``fn(key, data)`` returning ``None``
        to pass, or a list of those, decodes them as webdataset's ``decode()`` does.
    keys
        ``None`` returns dicts. A sequence such as ``("jpg;png", "cls")`` (or one
        space-separated string) returns a tuple of those members instead; ``;`` separates
        alternatives, as in webdataset's ``to_tuple``. Only these members are decoded.
    transform
        Applied to each sample (dict or tuple) after decoding.
    index_dir
        Folder of the indexes, when they are not next to their shards.
    build_missing
        Build missing indexes when the dataset is created (in parallel processes). If
        false, a missing index raises :class:`~indextar.MissingIndexError`. It gets the
        other indexes' ``attributes_from=``, if any (with ``on_error="skip"``; docs/metadata.md).
    max_open_shards
        Shards each process keeps open at once; older ones are closed.
    allow_unsafe
        Decode ``pyd``/``pickle``/``pkl``/``pth`` members, which runs code from the shard.
    progress
        Show a progress bar while building missing indexes.
    build_workers
        Processes for building missing indexes; default one per CPU.
    decode_threads
        Threads per process that decode a batch's samples in ``__getitems__`` (the
        DataLoader's batches): ``0`` or ``1`` decodes in the calling thread; ``"auto"``
        uses the cores left over when the DataLoader's workers each take one (none when
        there are as many workers as cores). See :mod:`indextar.read.pool`.
    prefetch_bytes
        Read-ahead budget of each process for remote shards read by ranges: bytes held
        and in flight. Used when batches come from :class:`~indextar.ReadAheadBatches`;
        ``0`` turns it off. A DataLoader worker that reads ahead also has glibc's
        ``malloc`` keep what it frees (:mod:`indextar.source.heap`). See
        docs/remote.md.
    cache_fill
        With ``remote="cache"``: ``"shards"`` downloads a shard whole at its first read;
        ``"ranges"`` reads it by ranges (and the read-ahead) as ``remote="ranges"`` does,
        and writes each range fetched into the cache, which holds the shard whole once
        its samples are read (an epoch). See docs/remote.md.

    Raises
    ------
    ShardNotFoundError
        If a pattern matches nothing or a shard does not exist.
    MissingIndexError
        If ``build_missing=False`` and shards lack an index (all are named).
    StaleIndexError
        If a shard changed since it was indexed.
    DecodeSpecError
        If ``decode`` is not a known spec or callable.
    """

    def __init__(
        self,
        shards: ShardsArg,
        *,
        decode: DecodeArg = None,
        keys: str | Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        index_dir: PathLike | None = None,
        build_missing: bool = True,
        max_open_shards: int = DEFAULT_MAX_OPEN_SHARDS,
        allow_unsafe: bool = False,
        progress: bool = False,
        build_workers: int | None = None,
        remote: Literal["ranges", "cache"] = "ranges",
        cache_dir: PathLike | None = None,
        cache_limit: int | str = "50GB",
        cache_fill: Literal["shards", "ranges"] = "shards",
        storage_options: Mapping[str, Any] | None = None,
        decode_threads: DecodeThreads = 0,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
    ):
        if max_open_shards < 1:
            raise ValueError(f"max_open_shards must be at least 1, got {max_open_shards}")
        self._builder = SampleBuilder.make(
            decode=decode, keys=keys, allow_unsafe=allow_unsafe, transform=transform
        )
        self._pool = BatchPool(decode_threads)
        self.index_dir: str | None = None if index_dir is None else os.fspath(index_dir)
        """The folder of the indexes, when they are not next to their shards."""
        self._options = dataset_options(
            remote,
            index_dir,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            cache_fill=cache_fill,
            storage_options=storage_options,
            build_missing=build_missing,
        )
        self.max_open_shards = max_open_shards
        self._ahead = ReadAhead(prefetch_bytes, fetch_spans)
        self.manifest: Path | None = None
        if isinstance(shards, (str, os.PathLike)) and is_manifest(shards):
            entries = list(read_manifest(shards).shards)
            self.manifest = Path(shards)
        else:
            entries = index_entries(
                expand_shards(shards),
                options=self._options,
                progress=progress,
                workers=build_workers,
            )
        self.shard_entries: tuple[ManifestShard, ...] = tuple(entries)
        """Each shard's entry: its URL, sample count and, if recorded, its index's path."""
        self.shards: tuple[str, ...] = tuple(entry.url for entry in entries)
        sizes = np.fromiter((entry.nsamples for entry in entries), np.int64, len(entries))
        sizes.flags.writeable = False
        self.shard_sizes: npt.NDArray[np.int64] = sizes
        """Samples per shard, in shard order (``ResumableSampler(order="blocks")`` reads it)."""
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        starts.flags.writeable = False
        self.shard_starts: npt.NDArray[np.int64] = starts
        """Each shard's first dataset index, and the dataset's length last."""
        # The same boundaries as Python ints, for bisect in __getitem__ (O(shards)).
        self._starts_list: list[int] = starts.tolist()
        self._len = int(starts[-1])
        # The remote shards read by ranges, whose spans a batch fetches together.
        self._ranged: frozenset[int] = (
            remote_shards(self.shards)
            if self._options.source.cache is None or self._options.source.cache.fill == "ranges"
            else frozenset()
        )
        self._has_ranges = bool(self._ranged)
        self._reset_process_state()

    # -- per-process state ----------------------------------------------------------

    def _reset_process_state(self) -> None:
        self._open: LRUCache[int, OpenShard] = LRUCache(self.max_open_shards, OpenShard.close)
        self._templates: dict[tuple[Any, ...], dict[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_open"], state["_templates"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    def close(self) -> None:
        """Close every open shard of this process (they reopen on the next access), and
        stop its decode threads and its read-ahead."""
        self._open.clear()
        self._pool.close()
        self._ahead.close()

    def prefetch_stats(self) -> PrefetchStats | None:
        """This process's read-ahead figures (bytes held, in flight, at most; spans
        fetched, taken, missed, wasted); ``None`` before its first hinted batch."""
        return self._ahead.stats()

    def _lease(self, shard_no: int) -> Lease[OpenShard]:
        """Shard ``shard_no``, opened if it is not, leased until the caller gives it
        back (``self._open.release``): not closed under a read (:mod:`.shard`)."""
        lease = self._open.acquire(shard_no)
        if lease is None:
            opened = open_entry(
                self.shard_entries[shard_no], self._options, number=shard_no, manifest=self.manifest
            )
            lease = self._open.insert(shard_no, OpenShard.load(opened))
        return lease

    @contextlib.contextmanager
    def _leased(self, shard_no: int) -> Iterator[OpenShard]:
        """Shard ``shard_no``, opened, leased for the ``with`` block (:meth:`_lease`):
        the tools' and tests' look at the shard the dataset reads through."""
        lease = self._lease(shard_no)
        try:
            yield lease.value
        finally:
            self._open.release(lease)

    def shard_index(self, shard_no: int) -> ShardIndex:
        """Shard ``shard_no``'s index, opened and validated (and checked against its
        manifest entry); for the views, :mod:`indextar.read.protocols`."""
        return open_entry_index(
            self.shard_entries[shard_no], self._options, number=shard_no, manifest=self.manifest
        )

    @property
    def storage_options(self) -> Mapping[str, Any] | None:
        """fsspec's options for the remote shards (``storage_options=``)."""
        return self._options.storage_options

    # -- access -----------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def _normalize(self, index: int) -> int:
        position = operator.index(index)
        if position < 0:
            position += self._len
        if not 0 <= position < self._len:
            raise SampleIndexError(
                f"index {index} is out of range for a dataset of {self._len} samples"
            )
        return position

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, sample number within the shard)`` of dataset index ``index``."""
        position = self._normalize(index)
        shard_no = int(np.searchsorted(self.shard_starts, position, side="right")) - 1
        return shard_no, position - int(self.shard_starts[shard_no])

    def __getitem__(self, index: int) -> Any:
        # The common case first: a plain int in range skips operator.index and wrapping.
        position = (
            index if type(index) is int and 0 <= index < self._len else self._normalize(index)
        )
        shard_no = bisect.bisect_right(self._starts_list, position) - 1
        return self._sample(shard_no, position - self._starts_list[shard_no], position)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of samples (the DataLoader calls this with each batch's indices);
        a :class:`~indextar.ReadAheadBatches` batch then starts fetching the next ones
        (after its own reads: the first batch is not kept waiting behind them)."""
        batch = self.read_batch(self._positions(indices))
        hint = getattr(indices, "hint", None)
        if hint is not None:
            self.read_ahead(hint)
        return batch

    def read_ahead(self, hint: Hint) -> None:
        """Start fetching the remote samples of the batches ``hint`` names (those this
        process will read, within ``prefetch_bytes``); a batch of
        :class:`~indextar.ReadAheadBatches` does it in ``__getitems__``. Datasets built
        on this one (a mixture, packs) pass their hints on through it."""
        if self._has_ranges:
            self._ahead.announce(hint, self._plan_ahead)

    def read_batch(
        self, positions: npt.NDArray[np.int64], extra: dict[str, Any] | None = None
    ) -> list[Any]:
        """The samples at ``positions`` (checked), each sample's fields with ``extra``
        added before it is built: a mixture's ``__source__``, without a second pass
        (:class:`~indextar.read.protocols.BatchReader`)."""
        shard_nos = self.shard_starts.searchsorted(positions, side="right") - 1
        locals_ = positions - self.shard_starts[shard_nos]
        # Every sample is read first, in this thread; then decoded, in the pool if any.
        shard_list, local_list, position_list = (
            shard_nos.tolist(),
            locals_.tolist(),
            positions.tolist(),
        )
        if self._has_ranges and not self._ranged.isdisjoint(shard_list):
            built = self._read_remote_batch(shard_list, local_list, position_list, extra)
        else:
            built = self._read_local_batch(shard_list, local_list, position_list, extra)
        if extra and self._builder.transform is not None:
            # The transform saw the fields; a dict it returns gets them too.
            for sample in built:
                if isinstance(sample, MutableMapping):
                    sample.update(extra)
        return built

    def _read_local_batch(
        self,
        shard_nos: list[int],
        locals_: list[int],
        positions: list[int],
        extra: dict[str, Any] | None,
    ) -> list[Any]:
        # Shard by shard: one read_many, so one size check of a local file, per shard.
        groups: dict[int, list[int]] = {}
        for at, shard_no in enumerate(shard_nos):
            groups.setdefault(shard_no, []).append(at)
        # Without a pool, each sample is built as it is read: no second pass.
        build = self._builder.build if self._pool.threads() <= 1 else None
        read: list[Any] = [None] * len(positions)
        for shard_no, group in groups.items():
            self.read_into(read, group, shard_no, locals_, positions, extra, build)
        return read if build is not None else self._pool.map(self._builder.build, read)

    def read_into(
        self,
        out: list[Any],
        ats: list[int],
        shard_no: int,
        locals_: list[int],
        positions: list[int],
        extra: dict[str, Any] | None,
        build: Callable[[dict[str, Any], Any], Any] | None,
    ) -> None:
        """Read samples ``locals_[at]`` of local shard ``shard_no`` (dataset positions
        ``positions[at]``) into ``out[at]`` for each ``at`` in ``ats``: built, or as
        ``(fields, members)`` for a pool to build when ``build`` is ``None``. For
        ``MixtureDataset``, which reads its parts' shards as one list."""
        lease = self._lease(shard_no)
        try:
            name = lease.value.shard
            many = lease.value.read_many([locals_[at] for at in ats])
        finally:
            self._open.release(lease)
        if extra is None:
            for at, (key, members) in zip(ats, many):
                fields = {"__key__": key, "__shard__": name, "__index__": positions[at]}
                out[at] = (fields, members) if build is None else build(fields, members)
            return
        # A mixture's part: one more field, in copies of a template with room for the
        # members (a dict literal of four fields grows at the second member: 55 ns).
        copy = self._fields_template(name, extra).copy
        for at, (key, members) in zip(ats, many):
            fields = copy()
            fields["__key__"], fields["__index__"] = key, positions[at]
            out[at] = (fields, members) if build is None else build(fields, members)

    def _fields_template(self, shard: str, extra: dict[str, Any]) -> dict[str, Any]:
        """A sample's fields with ``extra``, for :meth:`read_into` to copy; the
        template kept per ``extra`` (a mixture's part has one), once per process."""
        key = tuple(extra.items())
        base = self._templates.get(key)
        if base is None:
            fields = {"__key__": None, "__shard__": None, "__index__": None, **extra}
            base = self._templates[key] = fields_template(fields)
        template = base.copy()
        template["__shard__"] = shard
        return template

    def direct_builder(self) -> Callable[[dict[str, Any], Any], Any] | None:
        """The build that :meth:`read_into` can run as it reads, when batches need
        nothing more (local shards, no decode pool, no transform); else ``None``."""
        if self._has_ranges or self._pool.threads() > 1 or self._builder.transform is not None:
            return None
        return self._builder.build

    def _positions(self, indices: Sequence[int]) -> npt.NDArray[np.int64]:
        """A batch's indices as positions, wrapped and checked as ``ds[i]`` does."""
        # operator.index refuses floats, which np.fromiter would truncate.
        with contextlib.suppress(OverflowError):
            positions = np.fromiter(map(operator.index, indices), np.int64, len(indices))
            if not len(positions) or (positions.min() >= 0 and positions.max() < self._len):
                return positions
        return np.fromiter(map(self._normalize, indices), np.int64, len(indices))

    def _sample(self, shard_no: int, local: int, position: int) -> Any:
        # ds[i]'s hot path: _read inlined (a call costs about 3% of a cached read).
        lease = self._open.acquire(shard_no) or self._lease(shard_no)
        try:
            key, members = lease.value.read(local)
        finally:
            self._open.release(lease)
        fields = {"__key__": key, "__shard__": lease.value.shard, "__index__": position}
        return self._builder.build(fields, members)

    def __repr__(self) -> str:
        source = (
            f"manifest={str(self.manifest)!r}"
            if self.manifest is not None
            else f"{len(self.shards)} shards"
        )
        return f"IndexedTarDataset({source}, {self._len} samples)"
