"""One opened shard: its sample table in flat numpy arrays and its byte source.

A sample's members are contiguous in the tar, so a sample is one read of its span
``[start_offset, end_offset)``, split into members by offsets relative to the span.
Keys are one UTF-8 ``bytes`` blob plus offsets, not a list of ``str``: a DataLoader
worker that reads them copies no per-sample Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .index import ShardIndex
from .sources import ByteSource

__all__ = ["OpenShard", "SAMPLE_COLUMNS", "MEMBER_COLUMNS"]

SAMPLE_COLUMNS = ("start_offset", "end_offset", "first_member", "member_count", "key_start", "key_end")
MEMBER_COLUMNS = ("span_offset", "size", "ext_code")


@dataclass(frozen=True, slots=True)
class OpenShard:
    """A shard ready for random access, in one process.

    Attributes
    ----------
    shard
        The shard's path or URL.
    source
        Where its bytes are read from.
    samples
        ``(num_samples, 6)`` int64, columns :data:`SAMPLE_COLUMNS`.
    members
        ``(num_members, 3)`` int64, columns :data:`MEMBER_COLUMNS`; ``span_offset`` is
        the member's data offset minus its sample's ``start_offset``.
    key_blob
        Every sample's key, UTF-8, concatenated; sample ``i`` is
        ``key_blob[key_start[i]:key_end[i]]``.
    ext_names
        Extension of each ``ext_code``.
    """

    shard: str
    source: ByteSource
    samples: npt.NDArray[np.int64]
    members: npt.NDArray[np.int64]
    key_blob: bytes
    ext_names: tuple[str, ...]

    @classmethod
    def load(cls, index: ShardIndex, source: ByteSource) -> OpenShard:
        """Load the tables of an opened index."""
        table = index.load_samples()
        encoded = [key.encode() for key in index.keys()]
        key_end = np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)))
        key_start = key_end - np.fromiter(map(len, encoded), np.int64, len(encoded))
        samples = np.stack(
            [table.start_offset, table.end_offset, table.first_member, table.member_count, key_start, key_end],
            axis=1,
        )
        sample_of_member = np.repeat(np.arange(len(table), dtype=np.int64), table.member_count)
        members = np.stack(
            [
                table.member_data_offset - table.start_offset[sample_of_member],
                table.member_size,
                table.member_ext_code.astype(np.int64),
            ],
            axis=1,
        )
        return cls(
            shard=index.shard,
            source=source,
            samples=np.ascontiguousarray(samples),
            members=np.ascontiguousarray(members),
            key_blob=b"".join(encoded),
            ext_names=table.ext_names,
        )

    def __len__(self) -> int:
        return len(self.samples)

    def key(self, local: int) -> str:
        """The ``__key__`` of sample ``local``."""
        key_start, key_end = self.samples[local, 4:6].tolist()
        return self.key_blob[key_start:key_end].decode()

    def read(self, local: int) -> tuple[str, list[tuple[str, bytes]]]:
        """Sample ``local``'s key and ``(extension, data)`` members, in one read."""
        start, end, first, count, key_start, key_end = self.samples[local].tolist()
        span = self.source.read(start, end - start)
        names = self.ext_names
        members = [
            (names[code], span[offset : offset + size])
            for offset, size, code in self.members[first : first + count].tolist()
        ]
        return self.key_blob[key_start:key_end].decode(), members

    def close(self) -> None:
        """Close the byte source."""
        self.source.close()
