"""Tar extension headers: GNU long names (``L``/``K``) and PAX records (``x``/``g``).

An extension header's data describes the header that follows it: a longer name, or
PAX records that override its path and size. :func:`fold_extensions` applies them to
the entries they describe; :func:`parse_pax` and :func:`pax_size` are also used by the
sequential walk, which must honour PAX sizes to find the next header.
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
    sizes = sizes.astype(np.int64).copy()
    names: list[str] = []
    header_offsets = offsets.copy()
    global_pax: dict[str, str] = {}
    pending: dict[str, str] = {}
    pending_name: str | None = None
    first_header: int | None = None
    for i in range(len(offsets)):
        pos = int(offsets[i])
        t = int(types[i])
        if t in EXTENSION_TYPES:
            if first_header is None:
                first_header = pos
            size = int(sizes[i])
            if t == GNU_LONGNAME:
                # As GNU tar: the name runs to its NUL, even past the size into the
                # padding (the chain guarantees the padded blocks are in the file).
                padded = shard.read_data(pos, -(-size // BLOCK) * BLOCK)
                pending_name = decode_name(padded.split(b"\0", 1)[0])
            elif t == PAX_LOCAL:  # a later one replaces an earlier one, as in GNU tar
                pending = parse_pax(shard.read_data(pos, size), shard, pos)
            elif t == PAX_GLOBAL:  # replaces every earlier one too, as in GNU tar
                global_pax = parse_pax(shard.read_data(pos, size), shard, pos, keep_first=True)
            continue
        pax = {**global_pax, **pending} if global_pax else pending
        if is_pax_sparse(pax):
            shown = pax.get("path") or pending_name or decode_name(raw_names[i])
            where = first_header if first_header is not None else pos
            raise pax_sparse_error(pax, shown, shard.shard, where)
        name: str
        if "path" in pax:
            name = pax["path"]
            if "\0" in name:  # GNU tar would cut it there; no file can be named so
                raise shard.error(
                    ShardFormatError,
                    f"PAX path {name!r} contains a NUL byte",
                    first_header if first_header is not None else pos,
                )
        elif pending_name is not None:
            name = pending_name
        else:
            name = decode_name(raw_names[i])
        if types[i] == 0 and name.endswith("/"):
            types[i] = ord("5")
        if "size" in pax and types[i] not in np.frombuffer(NO_DATA_TYPES, np.uint8):
            sizes[i] = pax_size(pax["size"], shard.shard, pos)
        if first_header is not None:
            header_offsets[i] = first_header
        names.append(name)
        pending, pending_name, first_header = {}, None, None
    if first_header is not None:
        raise shard.error(
            ShardFormatError,
            "an extension header (GNU long name or PAX) is not followed by a member",
            first_header,
        )
    return Folded(names=names, header_offsets=header_offsets, sizes=sizes)


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
    payload: bytes, shard: ShardBytes, where: int, *, keep_first: bool = False
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
            raise shard.error(
                ShardFormatError,
                f"malformed PAX record {payload[pos : pos + 40]!r} in extended header",
                where,
            )
        key, _, value = record[space - pos + 1 : -1].partition(b"=")
        try:
            keyword, text = key.decode("utf-8"), value.decode("utf-8")
        except UnicodeDecodeError:
            raise shard.error(
                ShardFormatError, f"PAX record {key!r} is not valid UTF-8", where
            ) from None
        if key == b"size":  # every size record must be valid, not only the one that counts
            pax_size(text, shard.shard, where)
        if not (keep_first and keyword in records):
            records[keyword] = text
        pos += length
    return records
