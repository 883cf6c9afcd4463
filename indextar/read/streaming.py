"""StreamingTarDataset: read shards front to back, no index needed.

For shards without an index, compressed shards (``.tar.gz``), or when random access
is not wanted. Shards are split over distributed ranks and DataLoader workers; a
seeded shuffle buffer, resampling and a fixed global epoch length work as in
webdataset, but a damaged shard raises (or, with ``handler="warn"``, is logged and
skipped) instead of ending the epoch silently.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import torch.utils.data

from ..errors import IndextarError, SampleFormatError
from ..index.naming import skip_reason, split_name
from ..source.location import check_pipe_allowed
from ..source.objectstream import ObjectStream
from ..source.patterns import expand_shards
from ..tar.stream import iter_members
from .decode import DecodeArg
from .opening import open_stream, start_stream
from .sample import Sample, SampleBuilder

__all__ = ["StreamingTarDataset"]

log = logging.getLogger(__name__)


def _split_info() -> tuple[int, int, int, int]:
    """``(rank, world_size, worker, num_workers)`` of the calling process."""
    rank, world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    info = torch.utils.data.get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank, world, worker, workers


class StreamingTarDataset(torch.utils.data.IterableDataset[Any]):
    """An iterable dataset that reads each shard once, front to back.

    Parameters
    ----------
    urls
        Brace patterns, globs, URLs (any fsspec protocol) or a list of them; ``.tar`` or
        gzip-compressed ``.tar.gz``/``.tgz``.
    shuffle
        Size of the shuffle buffer; ``0`` keeps the shards' order. A positive value also
        shuffles the order of the shards. The order depends on ``seed`` and the epoch.
    seed
        Seed of every random choice, so that runs repeat.
    resampled
        Draw shards with replacement, forever (use ``epoch_length`` to end epochs).
    epoch_length
        Samples per epoch over all ranks and workers; shards are read again as needed.
    decode, keys
        As :class:`~indextar.IndexedTarDataset`: ``decode`` a spec string, handler or list;
        ``keys`` a tuple of members (``"jpg;png"`` for alternatives) to yield tuples.
    handler
        ``"raise"`` stops at a damaged shard or sample; ``"warn"`` logs it with its shard
        and key and goes on (with the next sample, or the next shard if the tar itself
        is damaged).
    allow_pipe
        Allow ``pipe:CMD`` shards (or set ``INDEXTAR_ALLOW_PIPE=1``).
    storage_options
        fsspec options for remote URLs (endpoint, anonymous access, ...).
    allow_unsafe
        Decode pickle/torch members, which runs code from the shard.

    Notes
    -----
    Shards are split over ``rank * num_workers + worker``; with fewer shards than
    that, iteration raises :class:`~indextar.IndextarError` rather than leaving some
    workers without data (unless ``resampled``). Each ``iter()`` advances the epoch;
    DataLoader workers that are not persistent get a fresh copy each epoch, so call
    :meth:`set_epoch` then.
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        shuffle: int = 0,
        seed: int = 0,
        resampled: bool = False,
        epoch_length: int | None = None,
        decode: DecodeArg = None,
        keys: str | Sequence[str] | None = None,
        handler: Literal["raise", "warn"] = "raise",
        allow_pipe: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        allow_unsafe: bool = False,
    ):
        super().__init__()
        if handler not in ("raise", "warn"):
            raise ValueError(f"handler must be 'raise' or 'warn', got {handler!r}")
        if shuffle < 0 or (epoch_length is not None and epoch_length < 1):
            raise ValueError(
                f"need shuffle >= 0 and epoch_length >= 1, got {shuffle} and {epoch_length}"
            )
        self.urls: tuple[str, ...] = tuple(expand_shards(urls))
        for url in self.urls:
            check_pipe_allowed(url, allow_pipe)
        self.shuffle = shuffle
        self.seed = seed
        self.resampled = resampled
        self.epoch_length = epoch_length
        self.handler = handler
        self.allow_pipe = allow_pipe
        self.storage_options = dict(storage_options or {})
        self._builder = SampleBuilder.make(decode=decode, keys=keys, allow_unsafe=allow_unsafe)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch that the next ``iter()`` uses (it then advances by one)."""
        self.epoch = epoch

    def __len__(self) -> int:
        if self.epoch_length is None:
            raise TypeError("a StreamingTarDataset has a length only with epoch_length=")
        return self.epoch_length

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        self.epoch += 1
        rank, world, worker, workers = _split_info()
        slot, slots = rank * workers + worker, world * workers
        quota = None
        if self.epoch_length is not None:
            quota = self.epoch_length // slots + (slot < self.epoch_length % slots)
        if not self.resampled and len(self.urls) < slots:
            raise IndextarError(
                f"{len(self.urls)} shards cannot be split over {world} rank(s) x {workers} "
                f"DataLoader worker(s) = {slots} readers; use at least {slots} shards, fewer "
                "workers, or resampled=True"
            )
        samples = self._samples(epoch, slot, slots)
        if self.shuffle > 0:
            samples = _shuffled(
                samples, self.shuffle, random.Random(f"{self.seed}/{epoch}/{slot}/buffer")
            )
        produced = 0
        for sample in samples:
            if quota is not None and produced >= quota:
                break
            produced += 1
            yield sample

    def _shard_passes(self, epoch: int, slot: int, slots: int) -> Iterator[str]:
        """This reader's shards: its share of each pass, or draws with replacement."""
        if self.resampled:
            rng = random.Random(f"{self.seed}/{epoch}/{slot}/resample")
            while True:
                yield rng.choice(self.urls)
        passes = 1 if self.epoch_length is None else None
        run = 0
        while passes is None or run < passes:
            order = list(self.urls)
            if self.shuffle > 0:
                random.Random(f"{self.seed}/{epoch}/{run}/shards").shuffle(order)
            yield from order[slot::slots]
            run += 1

    def _samples(self, epoch: int, slot: int, slots: int) -> Iterator[Any]:
        empty_run = 0
        urls = self._shard_passes(epoch, slot, slots)
        url = next(urls, None)
        started, ahead = self._start(url), None
        try:
            while url is not None:
                # the next shard's GET goes out now, its round trip hidden behind this one
                following = next(urls, None)
                ahead = self._start(following)
                count = 0
                for sample in self._shard_samples(url, started):
                    count += 1
                    yield sample
                url, started = following, ahead
                empty_run = 0 if count else empty_run + 1
                if empty_run > len(self.urls):  # every shard gave nothing: never loop forever
                    log.warning("no shard of this reader yields samples; ending the epoch")
                    return
        finally:  # GETs sent for shards that are not read now (open_stream closes the rest)
            for stream in (started, ahead):
                if stream is not None:
                    stream.close()

    def _start(self, url: str | None) -> ObjectStream | None:
        if url is None:
            return None
        return start_stream(url, storage_options=self.storage_options)

    def _shard_samples(self, url: str, started: ObjectStream | None) -> Iterator[Any]:
        try:
            with open_stream(
                url, storage_options=self.storage_options, allow_pipe=self.allow_pipe,
                started=started,
            ) as stream:  # fmt: skip
                for sample in _group(iter_members(stream, shard=url), url):
                    if isinstance(sample, SampleFormatError):
                        self._handle(sample, url, None)
                        continue
                    try:
                        yield self._finish(sample)
                    except IndextarError as e:
                        self._handle(e, url, sample["__key__"])
        except IndextarError as e:
            self._handle(e, url, None)

    def _handle(self, error: IndextarError, url: str, key: str | None) -> None:
        if self.handler == "raise":
            raise error
        where = f"sample {key!r} of shard {url!r}" if key is not None else f"shard {url!r}"
        log.warning("skipping %s: %s", where, error)

    def _finish(self, sample: Sample) -> Any:
        # _group has put the members into the sample already; those named like a
        # field (an extension such as "__bad__") stay as they are, never decoded.
        members = [(name, data) for name, data in sample.items() if not name.startswith("__")]
        return self._builder.build(sample, members)

    def __repr__(self) -> str:
        return (
            f"StreamingTarDataset({len(self.urls)} shards, shuffle={self.shuffle}, "
            f"resampled={self.resampled})"
        )


def _group(members: Iterator[Any], url: str) -> Iterator[Sample | SampleFormatError]:
    """Consecutive members with one key form a sample, by the index's naming rules.

    A repeated extension is returned as an error in the stream (the sample is dropped,
    the shard goes on); errors from the tar itself propagate.
    """
    current: Sample | None = None
    broken = False
    for member in members:
        if skip_reason(member.name) is not None:
            continue
        split = split_name(member.name)
        if split is None:
            continue
        key, ext = split
        if current is None or current["__key__"] != key:
            if current is not None and not broken:
                yield current
            current, broken = {"__key__": key, "__shard__": url}, False
        if ext in current:
            if not broken:
                yield SampleFormatError(
                    f"sample {key!r} has two {ext!r} members", shard=url, offset=member.offset
                )
            broken = True
            continue
        current[ext] = member.data
    if current is not None and not broken:
        yield current


def _shuffled(samples: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A shuffle buffer: each incoming sample swaps out a random one once it is full."""
    buffer: list[Any] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        position = rng.randrange(size)
        yield buffer[position]
        buffer[position] = sample
    rng.shuffle(buffer)
    yield from buffer
