"""Per-sample checksums: a fast hash of each sample's span, recorded in its index.

Nothing else catches a flipped byte inside a member's data: the size, mtime and
fingerprint of a shard see its first and last 64 KiB, the reads' header checks see
headers only, and HTTP serves what the disk holds. An index built with
``checksums=`` (:func:`~indextar.build_index`, :class:`~indextar.TarWriter`) records,
per sample, the hash of its whole span ``[start_offset, end_offset)``: its members'
headers, data and padding, the bytes a read fetches anyway. Reads of such an index
check every sample they return (:mod:`indextar.read.shard`).

Algorithms (``meta.checksum`` names the one an index used):

* ``"crc32"``: :func:`zlib.crc32`, in the standard library; about 1 GB/s on a
  600-byte span, 2 GB/s on 100 KB (measured, docs/benchmarks.md).
* ``"xxh3_64"``: xxHash's XXH3, 64 bits; ``pip install indextar[checksums]``
  (the ``xxhash`` package). About 3 GB/s on 600 bytes, 28 GB/s on 100 KB.

The values are stored as the ``checksums`` row of the index's ``arrays`` table
(``<u8``, one per sample, in sample order; see ``schema.sql``).
"""

from __future__ import annotations

import functools
import importlib
import mmap
import zlib
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from ..errors import ChecksumMismatchError, IndextarError

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "ChecksumsArg",
    "checksum_algorithm",
    "hasher",
    "span_checksums",
    "hash_parts",
    "mismatch_error",
]

ALGORITHMS = ("crc32", "xxh3_64")
DEFAULT_ALGORITHM = "crc32"
"""What ``checksums=True`` records: the one that needs no package beyond Python."""

ChecksumsArg = bool | str
"""``False`` (none), ``True`` (:data:`DEFAULT_ALGORITHM`) or an algorithm's name."""

Buffer = bytes | bytearray | memoryview
Hasher = Callable[[Buffer], int]


def checksum_algorithm(checksums: ChecksumsArg) -> str:
    """The algorithm ``checksums=`` asks for: ``""`` for none; checked, and its package
    imported, now rather than after a scan."""
    if checksums is False:
        return ""
    algorithm = DEFAULT_ALGORITHM if checksums is True else checksums
    hasher(algorithm)
    return algorithm


@functools.cache
def hasher(algorithm: str) -> Hasher:
    """The function that hashes a buffer to an int under ``algorithm``.

    Raises
    ------
    IndextarError
        If ``algorithm`` is unknown, or its package is not installed.
    """
    if algorithm == "crc32":
        return zlib.crc32
    if algorithm == "xxh3_64":
        try:
            xxhash = importlib.import_module("xxhash")
        except ImportError as e:
            raise IndextarError(
                "checksums 'xxh3_64' need the xxhash package: pip install indextar[checksums]"
                " (or record 'crc32', which needs none)"
            ) from e
        hash_: Hasher = xxhash.xxh3_64_intdigest
        return hash_
    raise IndextarError(
        f"checksums must be True, False or one of {', '.join(map(repr, ALGORITHMS))}; "
        f"got {algorithm!r}"
    )


def span_checksums(
    buf: Buffer | mmap.mmap,
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    algorithm: str,
) -> npt.NDArray[np.uint64]:
    """The hash of each span ``buf[starts[i]:ends[i]]`` (no copy of a span)."""
    hash_ = hasher(algorithm)
    view = memoryview(buf)
    try:
        return np.fromiter(
            (hash_(view[s:e]) for s, e in zip(starts.tolist(), ends.tolist())),
            np.uint64,
            len(starts),
        )
    finally:
        view.release()


def hash_parts(parts: Sequence[Buffer], algorithm: str) -> int:
    """The hash under ``algorithm`` of the concatenation of ``parts``, not joined."""
    if algorithm == "crc32":
        value = 0
        for part in parts:
            value = zlib.crc32(part, value)
        return value
    hasher(algorithm)  # refuses an unknown algorithm, or a missing package
    state = importlib.import_module("xxhash").xxh3_64()
    for part in parts:
        state.update(part)
    digest: int = state.intdigest()
    return digest


def mismatch_error(
    *, shard: str, key: str, offset: int, length: int, algorithm: str, expected: int, got: int
) -> ChecksumMismatchError:
    """The error for a sample whose span's bytes do not hash to its recorded checksum."""
    return ChecksumMismatchError(
        f"its {length} bytes hash to {algorithm} {got:#x}, but its index recorded "
        f"{expected:#x}: the shard's bytes changed since they were hashed (a damaged disk or "
        "copy, or a server that answered other bytes); restore the shard, or rebuild its "
        "index with build_index(shard, force=True, checksums=...) if the new bytes are right",
        shard=shard,
        offset=offset,
        key=key,
    )
