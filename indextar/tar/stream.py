"""Read tar members front to back from a file object, with the scanner's checks.

:func:`iter_members` is the streaming counterpart of :func:`~indextar.tar.scan.scan_tar`:
it needs no seek, so it reads pipes, gzip streams and HTTP bodies. Unlike
``tarfile`` in stream mode, which stops silently at a damaged header, every header's
checksum is verified and a bad one, a truncated member or a missing end marker raises
:class:`~indextar.errors.ShardFormatError` naming the shard and the byte offset.

Headers are read with the scanner's own functions (checksums and names from
:mod:`~indextar.tar.fields`, numbers from :func:`~indextar.tar.blocks.header_number`,
extension headers through :class:`~indextar.tar.ext.PendingExtensions`), so that the
two agree on every member's name and size, and refuse the same headers alike.
Opening URLs, pipes and gzip is the caller's: :mod:`indextar.read.opening`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Literal, overload

from ..errors import ShardFormatError, TruncatedShardError
from .blocks import BLOCK, REGULAR_TYPES, header_number
from .ext import EXTENSION_TYPES, GNU_LONGNAME, PendingExtensions
from .fields import checksum_ok, header_name
from .sparse import GNU_MULTIVOL, GNU_SPARSE, multivolume_error, sparse_error

__all__ = ["StreamEntry", "StreamMember", "iter_entries", "iter_members"]

_ZERO_BLOCK = bytes(BLOCK)
_BUFFER = 1 << 20


@dataclass(frozen=True, slots=True)
class StreamMember:
    """A regular file read from a tar stream.

    Attributes
    ----------
    name
        Its full name (after GNU long names and PAX ``path`` records).
    data
        Its bytes.
    offset
        Offset of its (first) header in the uncompressed stream.
    """

    name: str
    data: bytes
    offset: int


@dataclass(frozen=True, slots=True)
class StreamEntry:
    """Any entry read from a tar stream (a file, a directory, a link, ...), with the
    blocks it takes: what a copy of it writes.

    Attributes
    ----------
    name
        Its full name (after GNU long names and PAX ``path`` records).
    typeflag
        Its type flag byte (``ord("0")`` for a regular file).
    size
        Its data size.
    offset
        Offset of its first header block (extension headers included).
    blocks
        Its header blocks as read (extension headers included), then its padded data.
    data_start
        Where its data starts in ``blocks``.
    """

    name: str
    typeflag: int
    size: int
    offset: int
    blocks: bytes
    data_start: int

    @property
    def data(self) -> bytes:
        return self.blocks[self.data_start : self.data_start + self.size]


def _read_exact(stream: BinaryIO, length: int, shard: str, offset: int, what: str) -> bytes:
    if length <= _BUFFER:
        data = stream.read(length)
    else:
        # In pieces: ``read(n)`` allocates n bytes up front, and a forged size field
        # may claim exabytes. The stream's real end stops the loop.
        parts = bytearray()
        while len(parts) < length:
            part = stream.read(min(_BUFFER * 16, length - len(parts)))
            if not part:
                break
            parts += part
        data = bytes(parts)
    if len(data) != length:
        raise TruncatedShardError(
            f"the stream ends inside {what}: wanted {length} bytes, got {len(data)}",
            shard=shard,
            offset=offset,
        )
    return data


def iter_members(
    stream: BinaryIO, *, shard: str, ignore_zeros: bool = False
) -> Iterator[StreamMember]:
    """Yield the regular files of the tar read from ``stream``, in order.

    Directories, links and devices are skipped, as webdataset skips them. With
    ``ignore_zeros``, zero blocks are skipped rather than ending the archive, as GNU
    tar's ``--ignore-zeros`` does: every member of concatenated archives is read.

    Raises
    ------
    ShardFormatError
        On a header whose checksum does not match (naming the offset), a malformed
        number or PAX record, a sparse member (:class:`UnsupportedMemberError`), a stream
        that ends inside a member or without the end-of-archive marker
        (:class:`TruncatedShardError`).
    """
    return _read(stream, shard, ignore_zeros, every=False)


def iter_entries(stream: BinaryIO, *, shard: str) -> Iterator[StreamEntry]:
    """Yield every entry of the tar read from ``stream``, in order, with its blocks as
    read (for a copy that keeps every header byte: names, modes, owners, times and
    extension headers). Raises as :func:`iter_members` does."""
    return _read(stream, shard, False, every=True)


@overload
def _read(
    stream: BinaryIO, shard: str, ignore_zeros: bool, *, every: Literal[False]
) -> Iterator[StreamMember]: ...
@overload
def _read(
    stream: BinaryIO, shard: str, ignore_zeros: bool, *, every: Literal[True]
) -> Iterator[StreamEntry]: ...
def _read(
    stream: BinaryIO, shard: str, ignore_zeros: bool, *, every: bool
) -> Iterator[StreamMember | StreamEntry]:
    """:func:`iter_members`, or with ``every`` :func:`iter_entries`: one loop, so the
    two read and refuse the same headers."""
    offset = 0
    extension_blocks: list[bytes] = []  # with ``every``: the entry's headers so far
    pending = PendingExtensions(shard)  # the scanner's rules: which header wins
    chained = False  # extension headers precede this header
    ended = False  # with ignore_zeros: an end marker was passed since the last member
    while True:
        header = stream.read(BLOCK)
        if not header:
            if ended and not chained:
                return
            if offset == 0:
                raise TruncatedShardError("the stream is empty, not a tar", shard=shard, offset=0)
            raise TruncatedShardError(
                "the stream ends without the end-of-archive marker (two zero blocks)",
                shard=shard,
                offset=offset,
            )
        if len(header) != BLOCK:
            header += _read_exact(stream, BLOCK - len(header), shard, offset, "a header")
        if header == _ZERO_BLOCK:
            if not ignore_zeros:
                return  # end of archive; a second zero block and padding may follow
            ended, offset = True, offset + BLOCK
            continue
        ended = False
        if not checksum_ok(header):
            raise ShardFormatError(
                "bad header checksum: not a tar header (corrupt or truncated shard, or a "
                "compressed file not named .gz/.tgz)",
                shard=shard,
                offset=offset,
            )
        size = header_number(header[124:136], "size", shard, offset + 124)
        typeflag = header[156]
        extension = typeflag in EXTENSION_TYPES
        raw_name = b"" if extension else header_name(header)
        if not extension:
            size = pending.data_size(typeflag, size)
            if typeflag in (GNU_SPARSE, GNU_MULTIVOL):
                shown, start = pending.shown_name(raw_name), pending.start(offset)
                if typeflag == GNU_SPARSE:
                    raise sparse_error(header, shown, shard, start)
                raise multivolume_error(shown, shard, start)
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        data_offset = offset + BLOCK
        padded_data = _read_exact(stream, padded, shard, data_offset, "a member's data")
        header_offset, offset = offset, data_offset + padded
        chained = extension
        if extension:  # a long name runs to its NUL, padding included, as in the scanner
            data = padded_data if typeflag == GNU_LONGNAME else padded_data[:size]
            pending.read(typeflag, data, header_offset)
            if every:
                extension_blocks += (header, padded_data)
            continue
        name, start = pending.member(raw_name, header_offset)  # PAX sparse refused: any type
        if every:
            extension_blocks.append(header)
            headers = b"".join(extension_blocks)
            extension_blocks.clear()
            yield StreamEntry(name, typeflag, size, start, headers + padded_data, len(headers))
        elif typeflag in REGULAR_TYPES:
            yield StreamMember(name, padded_data[:size], start)
