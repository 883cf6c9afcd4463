"""Tar extension headers: GNU long names (``L``/``K``) and PAX records (``x``/``g``).

An extension header's data describes the header that follows it: a longer name, or
PAX records that override its path and size. :class:`PendingExtensions` holds the
rules, GNU tar's, of which header wins: the scan's fold (:func:`fold_extensions`, which
applies them to the entries they describe) and sequential walk (which must honour PAX
sizes to find the next header), and the stream, all read extension headers through it.
:mod:`indextar.tar.scan` builds on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ShardFormatError, UnsupportedMemberError
from .blocks import (
    BLOCK,
    MAX_MEMBER_SIZE,
    NO_DATA_TYPES,
    ShardBytes,
    decode_name,
    size_too_large,
)

__all__ = [
    "EXTENSION_TYPES",
    "GNU_LONGLINK",
    "GNU_LONGNAME",
    "PAX_GLOBAL",
    "PAX_LOCAL",
    "Folded",
    "PendingExtensions",
    "fold_extensions",
    "is_pax_sparse",
    "pax_sparse_error",
    "parse_pax",
    "pax_size",
]

# Extension headers: their data describes the next header.
GNU_LONGNAME, GNU_LONGLINK = ord("L"), ord("K")
PAX_LOCAL, PAX_GLOBAL = ord("x"), ord("g")
EXTENSION_TYPES = frozenset({GNU_LONGNAME, GNU_LONGLINK, PAX_LOCAL, PAX_GLOBAL})
_MAX_SIZE_DIGITS = len(str(MAX_MEMBER_SIZE))
# GNU tar --sparse --format=posix writes one of these records, by sparse format version.
_PAX_SPARSE_KEYS = frozenset({"GNU.sparse.major", "GNU.sparse.size", "GNU.sparse.map"})


@dataclass(frozen=True, slots=True)
class Folded:
    """A shard's headers with their extension headers applied.

    Attributes
    ----------
    names
        The name of each entry (each header that is not an extension header).
    header_offsets
        For every header: where its entry starts, extension headers included.
    sizes
        For every header: its data size, PAX ``size`` records applied.
    """

    names: list[str]
    header_offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]


def fold_extensions(
    shard: ShardBytes,
    offsets: npt.NDArray[np.int64],
    types: npt.NDArray[np.uint8],
    sizes: npt.NDArray[Any],
    raw_names: list[bytes],
) -> Folded:
    """Fold GNU and PAX extension headers into the entries they describe.

    ``offsets``, ``types``, ``sizes`` and ``raw_names`` describe every header in
    archive order. Old V7 tars mark a directory as a regular file whose name ends in
    '/': such entries get type ``'5'`` in ``types``.
    """
    # Python lists in the loop: a numpy element access costs several list accesses.
    size_list: list[int] = sizes.tolist()
    start_list: list[int] = offsets.tolist()
    names: list[str] = []
    pending = PendingExtensions(shard.shard)
    for i, (pos, t) in enumerate(zip(start_list, types.tolist())):
        if t in EXTENSION_TYPES:
            size = size_list[i]
            if t == GNU_LONGNAME:  # the chain guarantees its padded blocks are in the file
                data = shard.read_data(pos, -(-size // BLOCK) * BLOCK)
            else:
                data = b"" if t == GNU_LONGLINK else shard.read_data(pos, size)
            pending.read(t, data, pos)
            continue
        size_list[i] = pending.data_size(t, size_list[i])
        name, start_list[i] = pending.member(raw_names[i], pos)
        if t == 0 and name.endswith("/"):
            types[i] = ord("5")
        names.append(name)
    if pending.first_header is not None:
        raise shard.error(
            ShardFormatError,
            "an extension header (GNU long name or PAX) is not followed by a member",
            pending.first_header,
        )
    return Folded(
        names=names,
        header_offsets=np.array(start_list, dtype=np.int64),
        sizes=np.array(size_list, dtype=np.int64),
    )


class PendingExtensions:
    """The extension headers read so far, and what they say about the next member.

    Every reader that goes header by header keeps one through the archive: the scan's
    fold (:func:`fold_extensions`) and sequential walk (:mod:`indextar.tar.walk`, for
    sizes only), and the stream (:mod:`indextar.tar.stream`). The rules are GNU tar's:

    * a local PAX header (``x``) replaces an earlier one, and applies to the next member;
    * a global PAX header (``g``) replaces every earlier one, applies to every later
      member, and of its records with one keyword the first counts;
    * local records win over global ones, and of GNU long names (``L``) the last counts;
    * a member is named by a PAX ``path``, else a GNU long name, else its own header.
    """

    __slots__ = (
        "shard",
        "global_records",
        "global_size",
        "local_records",
        "local_size",
        "records",
        "long_name",
        "first_header",
    )

    def __init__(self, shard: str | None) -> None:
        self.shard = shard
        self.global_records: dict[str, str] = {}
        self.local_records: dict[str, str] = {}
        self.global_size: int | None = None  # their size records, read
        self.local_size: int | None = None
        #: The PAX records that apply to the next member: local before global.
        self.records: dict[str, str] = {}
        self.long_name: str | None = None
        self.first_header: int | None = None  # of the next member's extension headers

    def read(self, typeflag: int, data: bytes, offset: int) -> None:
        """Take in the extension header at ``offset``: ``data`` is its data, or for a GNU
        long name its padded data (the name runs to its NUL, as GNU tar reads it)."""
        if self.first_header is None:
            self.first_header = offset
        if typeflag == GNU_LONGNAME:
            self.long_name = decode_name(data.split(b"\0", 1)[0])
        elif typeflag in (PAX_LOCAL, PAX_GLOBAL):
            is_global = typeflag == PAX_GLOBAL
            records = parse_pax(data, self.shard, offset, keep_first=is_global)
            size = records.get("size")
            parsed = None if size is None else pax_size(size, self.shard, offset)
            if is_global:
                self.global_records, self.global_size = records, parsed
            else:
                self.local_records, self.local_size = records, parsed
            local, global_ = self.local_records, self.global_records
            self.records = {**global_, **local} if global_ and local else local or global_

    def start(self, offset: int) -> int:
        """Where the member whose own header is at ``offset`` starts: at its first
        extension header, if it has any."""
        return offset if self.first_header is None else self.first_header

    def data_size(self, typeflag: int, header_size: int) -> int:
        """The data size of the next member, whose own header has ``typeflag`` and
        ``header_size``: none for links, folders and devices, else a PAX ``size``."""
        if typeflag in NO_DATA_TYPES:
            return 0
        if self.local_size is not None:
            return self.local_size
        return header_size if self.global_size is None else self.global_size

    def shown_name(self, raw_name: bytes) -> str:
        """The next member's name for a message, its own header's name being ``raw_name``."""
        return self.records.get("path") or self.long_name or decode_name(raw_name)

    def member(self, raw_name: bytes, offset: int) -> tuple[str, int]:
        """The name and the start of the member whose own header, at ``offset``, holds
        ``raw_name``; then what applied to it only is forgotten.

        Raises if PAX records make it sparse, or give it a path with a NUL byte.
        """
        records, start = self.records, self.start(offset)
        if records and is_pax_sparse(records):
            raise pax_sparse_error(records, self.shown_name(raw_name), self.shard, start)
        name = records.get("path")
        if name is not None and "\0" in name:  # GNU tar would cut it there; no file can be named so
            raise ShardFormatError(
                f"PAX path {name!r} contains a NUL byte", shard=self.shard, offset=start
            )
        if name is None:
            name = self.long_name if self.long_name is not None else decode_name(raw_name)
        self.next_member()
        return name, start

    def next_member(self) -> None:
        """Forget what applied to the member just read; global records stay."""
        if self.local_records:
            self.local_records, self.local_size, self.records = {}, None, self.global_records
        self.long_name, self.first_header = None, None


def is_pax_sparse(records: Mapping[str, str]) -> bool:
    """Whether PAX ``records`` describe a GNU sparse file (in any of its formats)."""
    return not _PAX_SPARSE_KEYS.isdisjoint(records)


def pax_sparse_error(
    records: Mapping[str, str], name: str, shard: str | None, offset: int
) -> UnsupportedMemberError:
    """The error for the PAX sparse member ``name`` (its header's) described by ``records``."""
    # GNU tar gives the file's own name in a record; the header holds "GNUSparseFile.N/...".
    shown = records.get("GNU.sparse.name") or name
    return UnsupportedMemberError(
        f"member {shown!r} is a PAX sparse file; indextar cannot give random access to it "
        "(re-create the shard without --sparse)",
        shard=shard,
        offset=offset,
    )


def pax_size(value: str, shard: str | None, offset: int) -> int:
    """The PAX ``size`` record ``value`` of the extension header at ``offset`` of ``shard``.

    The scan and the stream (:mod:`indextar.tar.stream`) both read sizes here, so
    that they refuse the same records with the same message.
    """
    if not (value.isascii() and value.isdigit()):
        raise ShardFormatError(
            f"PAX header has an invalid size {value!r}", shard=shard, offset=offset
        )
    digits = value.lstrip("0") or "0"
    # Counted before int(), which refuses more than 4300 digits with a bare ValueError.
    if len(digits) > _MAX_SIZE_DIGITS or int(digits) > MAX_MEMBER_SIZE:
        raise ShardFormatError(size_too_large(digits), shard=shard, offset=offset)
    return int(digits)


def parse_pax(
    payload: bytes, shard: str | None, where: int, *, keep_first: bool = False
) -> dict[str, str]:
    """Parse PAX records: ``"%d %s=%s\\n" % (length, key, value)``.

    Of two records with one keyword the last counts, or the first if ``keep_first``:
    GNU tar reads a global header's records so.
    """
    records: dict[str, str] = {}
    pos = 0
    while pos < len(payload):
        if payload[pos] == 0:  # NUL padding after the last record
            break
        space = payload.find(b" ", pos)
        try:
            length = int(payload[pos:space])
        except ValueError:
            length = 0
        record = payload[pos : pos + length]
        if (
            space < 0
            or length <= space - pos
            or len(record) != length  # the length runs past the header's data
            or not record.endswith(b"\n")
            or b"=" not in record
        ):
            raise ShardFormatError(
                f"malformed PAX record {payload[pos : pos + 40]!r} in extended header",
                shard=shard,
                offset=where,
            )
        key, _, value = record[space - pos + 1 : -1].partition(b"=")
        try:
            keyword, text = key.decode("utf-8"), value.decode("utf-8")
        except UnicodeDecodeError:
            raise ShardFormatError(
                f"PAX record {key!r} is not valid UTF-8", shard=shard, offset=where
            ) from None
        if key == b"size":  # every size record must be valid, not only the one that counts
            pax_size(text, shard, where)
        if not (keep_first and keyword in records):
            records[keyword] = text
        pos += length
    return records
