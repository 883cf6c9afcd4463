"""Is this still the sample its index describes? A check of the headers its span begins with.

A sample's span ``[start_offset, end_offset)`` begins with its first member's header
blocks: any GNU long-name or PAX extension headers, then the member's own header.
Before a sample is returned, those blocks must carry valid checksums and name a member
``key + "."``. A shard rewritten under an open index (a source that cannot tell, such as
a server without ETags, or an in-place rewrite that kept size and mtime) then fails
loudly instead of returning another sample's bytes under this key.

The same rule is written in C in ``_mapread.c`` (``check_headers``); the two agree on
every input (``tests/source/test_stale.py``). Headers beyond :data:`MAX_HEADERS` bytes
(PAX records of several KiB) are checked as far as that reaches.
"""

from __future__ import annotations

from ..errors import StaleIndexError
from .blocks import MAX_MEMBER_SIZE
from .fields import checksum_ok, header_name, parse_number

__all__ = ["OK", "BAD_CHECKSUM", "OTHER_NAME", "MAX_HEADERS", "check_headers", "stale_error"]

OK, FILE_CHANGED, BAD_CHECKSUM, OTHER_NAME = 0, 1, 2, 3
MAX_HEADERS = 8192
_BLOCK = 512


def _pax_path(records: bytes, *, first: bool) -> bytes | None:
    """The value of the PAX record ``path`` (the first or the last one), or ``None``."""
    found = None
    at = 0
    while at < len(records) and records[at] != 0:
        space = records.find(b" ", at)
        digits = records[at:space] if space > at else b""
        if not digits.isdigit():
            return found
        length = int(digits)
        if length <= space + 1 - at or at + length > len(records):
            return found
        record = records[space + 1 : at + length - 1]
        if record.startswith(b"path="):
            found = record[5:]
            if first:
                return found
        at += length
    return found


def check_headers(headers: bytes, key: bytes) -> int:
    """:data:`OK` if ``headers`` (a span's bytes before its first member's data) hold
    valid checksums and end in a member named ``key + "."``; else :data:`BAD_CHECKSUM`
    or :data:`OTHER_NAME`. An empty ``key`` checks the checksums only.

    The name is taken as GNU tar takes it (:class:`~indextar.tar.ext.PendingExtensions`):
    a local PAX ``path`` (the last local header, its last record), else a global one
    (the last global header, its first record), else the last GNU long name (to its
    NUL), else the header's own name (after its prefix, where the magic is POSIX).
    A global header before the span can name a member too; the index records whether
    its names can be checked so (:func:`names_checkable`).
    """
    headers = headers[:MAX_HEADERS]
    local: bytes | None = None
    global_: bytes | None = None
    long_name: bytes | None = None
    at = 0
    while at + _BLOCK <= len(headers):
        block = headers[at : at + _BLOCK]
        size = parse_number(block[124:136])
        if size is None or not 0 <= size <= MAX_MEMBER_SIZE or not checksum_ok(block):
            return BAD_CHECKSUM
        data = at + _BLOCK
        payload = headers[data : data + size]
        kind = block[156:157]
        if kind == b"x":
            local = _pax_path(payload, first=False)
        elif kind == b"g":
            global_ = _pax_path(payload, first=True)
        elif kind == b"L":
            long_name = payload.split(b"\0", 1)[0]
        elif kind != b"K":  # the member's own header
            if not key:
                return OK
            name = next(
                (n for n in (local, global_, long_name) if n is not None), header_name(block)
            )
            return OK if name.startswith(key + b".") else OTHER_NAME
        at = data + -(-size // _BLOCK) * _BLOCK
    return OK


def member_name(headers: bytes) -> bytes:
    """The name field of the member's own header (the last block), for error messages."""
    return headers[-_BLOCK:][:100].split(b"\0", 1)[0]


def stale_error(
    code: int, *, shard: str, offset: int, key: bytes, headers: bytes
) -> StaleIndexError:
    """The error for a failed check: what the index promised at ``offset``, and what is there."""
    # b"": a read by the checksums only, whose caller names the sample
    wanted = f"sample {key.decode('utf-8', 'surrogateescape')!r}" if key else "a sample's headers"
    if code == BAD_CHECKSUM:
        found = "a header with a bad checksum"
    else:
        found = f"a member named {member_name(headers).decode('utf-8', 'surrogateescape')!r}"
    return StaleIndexError(
        f"shard {shard!r} changed since it was indexed: at byte offset {offset} its index "
        f"promised {wanted} but the shard holds {found}; rebuild its index "
        "(build_index(shard, force=True))"
    )
