"""Write a numbered series of shards, starting a new one at a sample count or size limit.

:class:`ShardWriter` names each shard from a ``%``-pattern, hands samples to one
:class:`~indextar.write.tarwriter.TarWriter` at a time, and can list the finished shards
in a dataset manifest (:mod:`indextar.index.manifest`). :func:`plan_shards` splits
samples into shards by the same rule without writing anything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import WriterError
from ..index.attribute_json import OnError, attributes_member
from ..index.checksums import ChecksumsArg, checksum_algorithm
from ..index.manifest import write_manifest
from ..index.shard import PathLike, ShardIndex
from ..tar.header import END_OF_ARCHIVE
from .closing import ClosingWriter, compressor_for
from .sample import TarSample, encode_sample
from .tarwriter import TarWriter

__all__ = [
    "ShardWriter",
    "plan_shards",
]

log = logging.getLogger(__name__)


def _starts_new_shard(count: int, size: int, nbytes: int, maxcount: int, maxsize: float) -> bool:
    """Whether a sample of ``nbytes`` starts a new shard after ``count`` samples, ``size`` bytes."""
    return count >= maxcount or (count > 0 and size + nbytes + len(END_OF_ARCHIVE) > maxsize)


def plan_shards(nbytes: Sequence[int], *, maxcount: int, maxsize: float) -> list[range]:
    """Split samples of the given on-disk sizes into shards, exactly as :class:`ShardWriter` does.

    Returns the range of sample positions of each shard.
    """
    plan: list[range] = []
    start, count, size = 0, 0, 0
    for i, n in enumerate(nbytes):
        if _starts_new_shard(count, size, n, maxcount, maxsize):
            plan.append(range(start, i))
            start, count, size = i, 0, 0
        count += 1
        size += n
    if count:
        plan.append(range(start, len(nbytes)))
    return plan


class ShardWriter(ClosingWriter):
    """Write samples to numbered shards, starting a new one at ``maxcount`` or ``maxsize``.

    Parameters
    ----------
    pattern
        Shard path with one ``%`` format for the shard number: ``"out-%06d.tar"``.
    maxcount
        At most this many samples per shard.
    maxsize
        At most this many bytes per shard, counting headers, padding and the end
        blocks. A sample larger than this on its own is written to a shard of its own.
    start_shard
        Number of the first shard.
    index
        Index each shard as it is written.
    manifest
        Also write a dataset manifest (:mod:`indextar.index.manifest`, readable by wids) to
        this path on close; needs ``index=True``.
    encoder, compress
        As for :class:`TarWriter`: ``compress="gzip"`` or ``"zstd"`` writes every sample
        as its own gzip member or zstd frame (``maxsize`` counts uncompressed bytes).
    attributes_from, on_error
        As for :class:`TarWriter`: store each sample's JSON attributes in its shard's
        index as it is written (``attributes_from="json"``); needs ``index=True``.
        ``meta=`` is the deprecated name of ``attributes_from=``.
    checksums
        As for :class:`TarWriter`: record each sample's checksum in its shard's index;
        needs ``index=True``.
    """

    def __init__(
        self,
        pattern: str,
        *,
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        start_shard: int = 0,
        index: bool = True,
        manifest: PathLike | None = None,
        encoder: bool = True,
        compress: str | None = None,
        attributes_from: str | None = None,
        on_error: OnError = "fail",
        checksums: ChecksumsArg = False,
        meta: str | None = None,
    ):
        member = attributes_member(attributes_from, meta, call="ShardWriter")
        if member is not None and not index:
            raise WriterError(
                "attributes_from= stores attributes in the shards' indexes; it needs index=True"
            )
        compressor_for(compress)  # refuses an unknown codec, or a missing library, now
        try:
            distinct = (pattern % 0) != (pattern % 1)
        except (TypeError, ValueError) as e:
            raise WriterError(
                f"shard pattern {pattern!r} needs one %-format for the shard number, "
                f"such as 'out-%06d.tar' ({e})"
            ) from None
        if not distinct:
            raise WriterError(f"shard pattern {pattern!r} gives the same name for every shard")
        if maxcount < 1 or maxsize <= 0:
            raise WriterError(
                f"maxcount and maxsize must be positive, got {maxcount} and {maxsize}"
            )
        if manifest is not None and not index:
            raise WriterError("manifest= lists indexed shards; it needs index=True")
        if checksums and not index:
            raise WriterError("checksums= are stored in the shards' indexes; it needs index=True")
        self.checksum = checksum_algorithm(checksums)
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.encoder = encoder
        self.compress = compress
        self.attributes_from, self.on_error = member, on_error
        self._index = index
        self._manifest = manifest
        self._next_shard = start_shard
        self._writer: TarWriter | None = None
        self._closed = False
        #: Paths of the shards finished so far.
        self.shards: list[str] = []
        #: Their indexes (when ``index=True``).
        self.indexes: list[ShardIndex] = []

    def write(self, sample: Mapping[str, Any]) -> int:
        """Encode and write one sample; return the bytes it added."""
        self._check_open()
        shard = self._writer.name if self._writer is not None else self.pattern % self._next_shard
        return self.append(encode_sample(sample, encoder=self.encoder, shard=shard))

    def append(self, sample: TarSample) -> int:
        """Write an already encoded sample; return the bytes it added."""
        self._check_open()
        writer = self._writer
        if writer is not None and _starts_new_shard(
            writer.count, writer.size, sample.nbytes, self.maxcount, self.maxsize
        ):
            self._finish_shard()
            writer = None
        if writer is None:
            writer = self._writer = TarWriter(
                self.pattern % self._next_shard,
                encoder=self.encoder,
                index=self._index,
                compress=self.compress,
                attributes_from=self.attributes_from,
                on_error=self.on_error,
                checksums=self.checksum or False,
            )
            self._next_shard += 1
        return writer.append(sample)

    def _check_open(self) -> None:
        if self._closed:
            raise WriterError(f"cannot write: the ShardWriter for {self.pattern!r} is closed")

    def _finish_shard(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        index = writer.close()
        self.shards.append(writer.name)
        if index is not None:
            self.indexes.append(index)
        log.info("finished %s: %d samples, %d bytes", writer.name, writer.count, writer.size)

    def close(self) -> None:
        """Finish the last shard and write the manifest. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._finish_shard()
        if self._manifest is not None:
            write_manifest(self._manifest, self.indexes)

    def abort(self) -> None:
        """Abandon the shard being written; finished shards stay. No manifest is written."""
        self._closed = True
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
