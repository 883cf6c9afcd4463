"""The bytes a tar scan reads, and the errors that point into them.

:class:`ShardBytes` holds the scanned buffer and the shard's name. The scan's modules
(:mod:`indextar.tar.scan`, :mod:`indextar.tar.walk`, :mod:`indextar.tar.ext`) build on
it: bounds-checked reads, header checksums and the end of the archive, each failing
with a :class:`ShardFormatError` that names the shard and the byte offset. Numeric
fields, octal or base-256, are read by :func:`header_number`, which the stream
(:mod:`indextar.tar.stream`) uses too.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ShardFormatError, TruncatedShardError
from .fields import checksums_ok, parse_number

__all__ = [
    "BLOCK",
    "MAX_MEMBER_SIZE",
    "NO_DATA_TYPES",
    "REGULAR_TYPES",
    "ShardBytes",
    "decode_name",
    "header_number",
    "size_too_large",
]

BLOCK = 512
# Type flags that carry no data blocks, whatever their size field says
# (as in tarfile and GNU tar).
NO_DATA_TYPES = b"123456"
# Type flags of regular files: '0', '7' (contiguous) and NUL (old tars).
REGULAR_TYPES = frozenset(b"07\0")
# Sizes are int64 arrays and offsets add to them: a size field claiming more than this
# (GNU base-256 and PAX sizes are unbounded) is refused before it can overflow.
MAX_MEMBER_SIZE = 1 << 62
_CHECK_CHUNK = 1 << 15  # header rows checksummed at once (16 MiB)


def size_too_large(size: int | str) -> str:
    """The message for a member ``size`` (a number, or its decimal digits) over the limit."""
    return (
        f"corrupt tar header: a member size of {size} bytes is more than any shard holds "
        f"(at most {MAX_MEMBER_SIZE})"
    )


def header_number(raw: bytes, name: str, shard: str | None, where: int) -> int:
    """The numeric header field ``name``, ``raw`` at offset ``where`` of ``shard``: octal
    or GNU base-256; a size may be neither negative nor more than any shard holds.

    The scan and the stream (:mod:`indextar.tar.stream`) both read numbers here, so
    that they refuse the same fields with the same message.
    """
    value = parse_number(raw)
    if value is None:
        raise ShardFormatError(
            f"corrupt tar header: the {name} field {raw!r} is neither octal nor base-256",
            shard=shard,
            offset=where,
        )
    if name == "size" and not 0 <= value <= MAX_MEMBER_SIZE:
        wrong = f"corrupt tar header: negative size {value}" if value < 0 else size_too_large(value)
        raise ShardFormatError(wrong, shard=shard, offset=where)
    return value


def decode_name(raw: bytes) -> str:
    """A member name's bytes as text: UTF-8, each byte that is not as a lone surrogate.

    As tarfile (and so webdataset) decode names: an archive from a Latin-1 system
    keeps its names, and ``name.encode("utf-8", "surrogateescape")`` gives the bytes back.
    """
    return raw.decode("utf-8", "surrogateescape")


class ShardBytes:
    """A shard's bytes, read for a scan.

    ``buf``, ``shard`` and ``fd`` are as :func:`~indextar.tar.scan.scan_tar` takes
    them, except that ``fd`` is -1 when there is no file descriptor.
    """

    def __init__(self, buf: Any, shard: str | None, fd: int = -1):
        self.buf = buf
        self.fd = fd
        self.data = np.frombuffer(buf, dtype=np.uint8)
        # mmap and bytes slice to bytes cheaply; anything else through a memoryview.
        self.raw = buf if isinstance(buf, (bytes, mmap.mmap)) else memoryview(buf).cast("B")
        self.size = int(self.data.size)
        # The whole blocks as rows: headers are block-aligned, so a header's row is
        # ``blocks[offset // BLOCK]``, a view with no copy.
        self.blocks = self.data[: (self.size // BLOCK) * BLOCK].reshape(-1, BLOCK)
        self.shard = shard

    def error(
        self, cls: type[ShardFormatError], message: str, offset: int | None
    ) -> ShardFormatError:
        """An error of class ``cls`` about this shard at byte ``offset``."""
        return cls(message, shard=self.shard, offset=offset)

    # -- reads --------------------------------------------------------------

    def is_zero_block(self, pos: int) -> bool:
        """Whether the block at ``pos`` (or what the file holds of it) is all zeros."""
        end = min(pos + BLOCK, self.size)
        return not self.data[pos:end].any()

    def read_data(self, header_pos: int, size: int) -> bytes:
        """The first ``size`` data bytes of the (extension) header at ``header_pos``."""
        start = header_pos + BLOCK
        if start + size > self.size:
            raise self.error(
                TruncatedShardError,
                f"shard ends inside an extension header's data: needs {size} bytes from offset "
                f"{start}, file has {self.size}",
                header_pos,
            )
        return self.data[start : start + size].tobytes()

    def next_part(self, end: int) -> int | None:
        """The first block after ``end`` that is not all zeros, if any (a later part)."""
        if end % BLOCK or end >= len(self.blocks) * BLOCK:
            return None  # past the last whole block: check_end judges what is left
        nonzero = np.flatnonzero(self.blocks[end // BLOCK :].any(axis=1))
        return end + int(nonzero[0]) * BLOCK if nonzero.size else None

    def decode_all(self, raw_names: list[bytes]) -> list[str]:
        """Every name of ``raw_names`` decoded as :func:`decode_name` does."""
        return [raw.decode("utf-8", "surrogateescape") for raw in raw_names]

    # -- checks -------------------------------------------------------------

    def check_checksums(
        self,
        rows: npt.NDArray[np.uint8],
        offsets: npt.NDArray[np.int64],
        parsed: tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]] | None = None,
    ) -> None:
        """Raise for the first header row (at ``offsets``) whose checksum is wrong.

        ``parsed`` passes the stored checksums and canonical mask if already computed.
        """
        good = checksums_ok(rows, parsed)
        if not good.all():
            i = int(np.flatnonzero(~good)[0])
            raise self.error(
                ShardFormatError,
                f"corrupt tar header: the checksum field {rows[i, 148:156].tobytes()!r} does not "
                "match the header's contents",
                int(offsets[i]),
            )

    def check_checksums_at(self, offsets: list[int]) -> None:
        """Raise for the first of the headers at ``offsets`` whose checksum is wrong."""
        header_offsets = np.asarray(offsets, np.int64)
        # In chunks, in order: the rows gathered stay a few tens of MB, whatever the count.
        for lo in range(0, len(header_offsets), _CHECK_CHUNK):
            chunk = header_offsets[lo : lo + _CHECK_CHUNK]
            self.check_checksums(self.blocks[chunk // BLOCK], chunk)

    def check_end(self, end: int, last_header: int = 0) -> None:
        """Check the end of the archive at ``end``; ``last_header`` is the last header's offset."""
        if end > self.size:
            # Reported at the cut member's header: the end offset lies beyond the file.
            raise self.error(
                TruncatedShardError,
                f"shard is truncated: the data of the member with this header runs to "
                f"offset {end}, but the file has only {self.size} bytes",
                last_header,
            )
        if end == self.size:
            raise self.error(
                TruncatedShardError,
                "shard ends without the end-of-archive marker (two zero blocks); "
                "it was probably cut short at a member boundary",
                end,
            )
        if end + BLOCK > self.size and self.data[end:].any():
            raise self.error(
                TruncatedShardError,
                f"shard ends inside a header: {self.size - end} of 512 header bytes present",
                end,
            )
        # After the end marker only zero padding may follow (GNU pads to whole records).
        tail = self.data[end:]
        if tail.any():
            where = end + int(np.flatnonzero(tail)[0])
            raise self.error(
                ShardFormatError,
                f"non-zero data after the end-of-archive marker at offset {end}: a zeroed "
                "header, or concatenated archives (cat a.tar b.tar), which "
                "build_index(..., ignore_zeros=True) reads as GNU tar --ignore-zeros does",
                where,
            )
