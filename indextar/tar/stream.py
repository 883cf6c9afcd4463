"""Read tar members front to back from a file object, with the scanner's checks.

:func:`iter_members` is the streaming counterpart of :func:`~indextar.tar.scan.scan_tar`:
it needs no seek, so it reads pipes, gzip streams and HTTP bodies. Unlike
``tarfile`` in stream mode, which stops silently at a damaged header, every header's
checksum is verified and a bad one, a truncated member or a missing end marker raises
:class:`~indextar.errors.ShardFormatError` naming the shard and the byte offset.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..errors import (
    CompressedShardError,
    IndextarError,
    ShardFormatError,
    ShardNotFoundError,
    TruncatedShardError,
    UnsupportedMemberError,
)
from ..patterns import is_url
from ..source.remote import RangeSource, check_pipe_allowed
from ..source.stream import RemoteStream
from .blocks import decode_name
from .ext import is_pax_sparse, pax_size, pax_sparse_error
from .fields import MAGIC_OFFSET, POSIX_MAGIC, parse_octal
from .scan import BLOCK, sniff_compression
from .sparse import sparse_error

__all__ = ["StreamMember", "iter_members", "open_stream"]

_REGULAR = frozenset(b"07\0")
_GNU_LONGNAME, _GNU_LONGLINK, _PAX_LOCAL, _PAX_GLOBAL = b"L", b"K", b"x", b"g"
_GNU_SPARSE, _GNU_MULTIVOL = b"S", b"M"
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


def _number(field: bytes, shard: str, offset: int, name: str) -> int:
    if field[:1] in (b"\x80", b"\xff"):  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        value = value - (1 << (8 * len(field) - 8)) if field[:1] == b"\xff" else value
    else:
        octal = parse_octal(field)
        if octal is None:
            raise ShardFormatError(
                f"the {name} field {field!r} is not an octal number", shard=shard, offset=offset
            )
        value = octal
    if name == "size" and value < 0:
        raise ShardFormatError(f"the size field {field!r} is negative", shard=shard, offset=offset)
    return value


def _checksum_ok(header: bytes) -> bool:
    expected = parse_octal(header[148:156])  # strictly octal: int() takes "+7", "0o7", "1_0"
    if expected is None:
        return False
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    if unsigned == expected:
        return True
    signed = unsigned - 256 * sum(1 for b in header[:148] + header[156:] if b > 127)
    return signed == expected


def _header_name(header: bytes) -> str:
    """The name field, after the prefix field where the magic is POSIX ustar's."""
    name = header[:100].split(b"\0", 1)[0]
    # As the scanner and the C walker: the magic and the version "00" (GNU tar and tarfile
    # take "ustar\0" alone; GNU headers, "ustar  \0", use those bytes for other fields).
    if header[345] and header[MAGIC_OFFSET : MAGIC_OFFSET + len(POSIX_MAGIC)] == POSIX_MAGIC:
        name = header[345:500].split(b"\0", 1)[0] + b"/" + name
    return decode_name(name)


def _pax_records(
    payload: bytes, shard: str, offset: int, *, keep_first: bool = False
) -> dict[str, str]:
    """PAX records; of two with one keyword the last counts, or the first if ``keep_first``."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(payload):
        space = payload.find(b" ", pos)
        try:
            length = int(payload[pos:space])
        except ValueError:
            if not payload[pos:].strip(b"\0"):
                break
            raise ShardFormatError(
                "malformed PAX extended header record", shard=shard, offset=offset
            ) from None
        record = payload[space + 1 : pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise ShardFormatError(
                "malformed PAX extended header record", shard=shard, offset=offset
            )
        keyword, _, value = record[:-1].partition(b"=")
        key, text = keyword.decode("utf-8", "replace"), value.decode("utf-8", "surrogateescape")
        if keyword == b"size":  # every size record must be valid, as in the scanner
            pax_size(text, shard, offset)
        if not (keep_first and key in records):
            records[key] = text
        pos += length
    return records


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
    offset = 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    globals_: dict[str, str] = {}
    first_header = 0
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
        if not _checksum_ok(header):
            raise ShardFormatError(
                "bad header checksum: not a tar header (corrupt or truncated shard, or a "
                "compressed file not named .gz/.tgz)",
                shard=shard,
                offset=offset,
            )
        if not chained:
            first_header = offset
        size = _number(header[124:136], shard, offset, "size")
        typeflag = header[156:157]
        extension = typeflag in (_GNU_LONGNAME, _GNU_LONGLINK, _PAX_LOCAL, _PAX_GLOBAL)
        records = {**globals_, **pax} if globals_ else pax  # local before global
        size_record = records.get("size")
        if size_record is not None and typeflag in (b"0", b"7", b"\0"):
            size = pax_size(size_record, shard, offset)
        padded = (size + BLOCK - 1) // BLOCK * BLOCK
        data_offset = offset + BLOCK
        if typeflag in (_GNU_SPARSE, _GNU_MULTIVOL):
            shown = records.get("path") or long_name or _header_name(header)
            if typeflag == _GNU_SPARSE:
                raise sparse_error(header, shown, shard, first_header)
            raise UnsupportedMemberError(
                f"member {shown!r} is a GNU multi-volume continuation",
                shard=shard,
                offset=first_header,
            )
        if records and not extension and is_pax_sparse(records):  # as the scanner, any type
            shown = records.get("path") or long_name or _header_name(header)
            raise pax_sparse_error(records, shown, shard, first_header)
        if extension or typeflag[0] in _REGULAR:
            padded_payload = _read_exact(stream, padded, shard, data_offset, "a member's data")
            payload = padded_payload[:size]
        else:
            _read_exact(stream, padded, shard, data_offset, "a member's data")
            payload = b""
        offset = data_offset + padded
        chained = extension
        if typeflag == _GNU_LONGNAME:  # to its NUL, padding included, as the scanner
            long_name = padded_payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            continue
        if typeflag == _GNU_LONGLINK:
            continue
        if typeflag == _PAX_LOCAL:
            pax = _pax_records(payload, shard, data_offset)  # replaces an earlier one: GNU tar
            continue
        if typeflag == _PAX_GLOBAL:  # as the scanner and GNU tar: replaces, first record counts
            globals_ = _pax_records(payload, shard, data_offset, keep_first=True)
            continue
        # As the scanner (and GNU tar): a PAX path, local before global, then a GNU
        # long name, then the header's own name.
        name = records.get("path", long_name)
        if name is not None and "\0" in name:
            raise ShardFormatError(
                f"PAX path {name!r} contains a NUL byte", shard=shard, offset=first_header
            )
        if name is None:
            name = _header_name(header)
        long_name, pax = None, {}
        if typeflag[0] in _REGULAR:
            yield StreamMember(name, payload, first_header)


@contextlib.contextmanager
def open_stream(
    url: str, *, storage_options: Mapping[str, Any] | None = None, allow_pipe: bool = False
) -> Iterator[BinaryIO]:
    """A shard's uncompressed tar bytes, read front to back.

    ``url`` is a local path, an fsspec URL or (if allowed) ``pipe:CMD``. gzip is
    recognised by its magic bytes and decompressed; other compressions raise
    :class:`~indextar.errors.CompressedShardError`.
    """
    with contextlib.ExitStack() as stack:
        raw: Any  # a buffered binary reader: peek() works on every branch
        if url.startswith("pipe:"):
            check_pipe_allowed(url, allow_pipe)
            process = subprocess.Popen(url[5:], shell=True, stdout=subprocess.PIPE)  # noqa: S602 - opted in
            stack.callback(_check_pipe, process, url)
            assert process.stdout is not None
            raw = process.stdout
        elif is_url(url):
            remote = RemoteStream(RangeSource(url, storage_options=storage_options))
            stack.callback(remote.close)
            raw = io.BufferedReader(remote, _BUFFER)
        else:
            path = url.removeprefix("file://")
            try:
                raw = stack.enter_context(open(path, "rb", buffering=_BUFFER))
            except FileNotFoundError:
                raise ShardNotFoundError(f"shard {url!r} does not exist") from None
        compression = sniff_compression(raw.peek(8)[:8])
        if compression == "gzip":
            raw = io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), _BUFFER)
        elif compression is not None:
            raise CompressedShardError(
                f"is {compression}-compressed; streaming reads plain or gzip-compressed tars",
                shard=url,
            )
        yield raw


def _check_pipe(process: subprocess.Popen[bytes], url: str) -> None:
    assert process.stdout is not None
    process.stdout.close()
    status = process.wait()
    if status not in (0, -13):  # -13: SIGPIPE after we stopped reading early
        raise IndextarError(f"pipe shard {url[:60]!r} exited with status {status}")
