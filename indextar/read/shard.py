"""One opened shard: its sample table in flat numpy arrays and its byte source.

A sample's members are contiguous in the tar, so a sample is one read of its span
``[start_offset, end_offset)``, split into members by offsets relative to the span,
after a check that the span still begins with the sample's own headers
(:mod:`indextar.tar.spancheck`). Keys are one ``bytes`` blob of raw names plus offsets,
not a list of ``str``: a DataLoader worker that reads them copies no per-sample
Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import RemoteReadError, StaleIndexError
from ..index.shard import ShardIndex
from ..source.base import ByteSource, Span, split_members

__all__ = ["OpenShard"]


@dataclass(frozen=True, slots=True)
class OpenShard:
    """A shard ready for random access, in one process.

    Attributes
    ----------
    shard
        The shard's path or URL.
    source
        Where its bytes are read from.
    samples, members, key_blob, ext_names
        The shard's :class:`~indextar.index.arrays.ShardArrays`, unpacked: a read then looks
        up one attribute, not two.
    check_names
        Whether a read checks that the span's headers name the sample's key, or (where
        the index found a global PAX header naming members, ``IndexMeta.span_names``)
        only their checksums.
    """

    shard: str
    source: ByteSource
    samples: npt.NDArray[np.int64]
    members: npt.NDArray[np.int64]
    key_blob: bytes
    ext_names: tuple[str, ...]
    check_names: bool = True

    @classmethod
    def load(cls, index: ShardIndex, source: ByteSource) -> OpenShard:
        """Load the arrays of an opened index: one query and ``np.frombuffer``."""
        arrays = index.load_arrays()
        return cls(
            shard=index.shard,
            source=source,
            samples=arrays.samples,
            members=arrays.members,
            key_blob=arrays.key_blob,
            ext_names=arrays.ext_names,
            check_names=index.meta.span_names,
        )

    def __len__(self) -> int:
        return len(self.samples)

    def span(self, local: int) -> tuple[int, int]:
        """``(offset, length)`` of sample ``local``'s bytes in the shard."""
        start, end = self.samples[local, :2].tolist()
        return start, end - start

    def read(self, local: int, span: bytes | None = None) -> tuple[str, list[tuple[str, bytes]]]:
        """Sample ``local``'s key and ``(extension, data)`` members, in one read.

        ``span``, if given, is the sample's bytes already fetched (remote batches); if
        its headers are not the sample's, the source reads it again (a remote source
        retries a wrong answer and refuses a changed object).
        """
        start, end, first, count, key_start, key_end = self.samples[local].tolist()
        names = self.ext_names
        key = self.key_blob[key_start:key_end]
        checked = key if self.check_names else b""  # b"": the checksums only
        try:
            if span is not None:
                try:
                    members = split_members(
                        span, self.members, first, count, names, checked,
                        shard=self.shard, offset=start,
                    )  # fmt: skip
                    return key.decode("utf-8", "surrogateescape"), members
                except StaleIndexError:
                    pass  # read again: the source tells a changed shard from a wrong answer
            members = self.source.read_members(
                start, end - start, self.members, first, count, names, checked
            )
        except RemoteReadError as e:
            raise e.for_sample(key.decode("utf-8", "surrogateescape")) from e
        return key.decode("utf-8", "surrogateescape"), members

    def key(self, local: int) -> str:
        """Sample ``local``'s key."""
        key_start, key_end = self.samples[local, 4:6].tolist()
        return self.key_blob[key_start:key_end].decode("utf-8", "surrogateescape")

    def read_many(self, local: list[int]) -> list[tuple[str, list[tuple[str, bytes]]]]:
        """What :meth:`read` returns for each of the samples ``local``, with one
        ``read_many`` of their spans (local files: one size check for all)."""
        key_blob = self.key_blob
        rows = self.samples[local].tolist()
        if not self.check_names:  # b"": the checksums only
            keys = [key_blob[row[4] : row[5]] for row in rows]
            spans: list[Span] = [(s, e - s, f, c, b"") for s, e, f, c, _, _ in rows]
            read = self.source.read_members_many(spans, self.members, self.ext_names)
            return [(k.decode("utf-8", "surrogateescape"), m) for k, m in zip(keys, read)]
        spans = [(s, e - s, f, c, key_blob[ks:ke]) for s, e, f, c, ks, ke in rows]
        read = self.source.read_members_many(spans, self.members, self.ext_names)
        return [
            (span[4].decode("utf-8", "surrogateescape"), members)  # type: ignore[union-attr]
            for span, members in zip(spans, read)
        ]

    def close(self) -> None:
        """Close the byte source."""
        self.source.close()
