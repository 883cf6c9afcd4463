"""Deterministic tar headers for regular files: USTAR, with PAX only where needed.

Every header carries the same fixed mode, owner and mtime, so equal input gives
byte-identical archives. A member gets a PAX extended header (``././@PaxHeader``,
type ``x``) only when USTAR cannot hold it: a name that is not ASCII or does not
fit the 100-byte name plus 155-byte prefix fields, or a size of 8 GiB or more
(USTAR's size field holds 11 octal digits).
"""

from __future__ import annotations

__all__ = [
    "BLOCK",
    "END_OF_ARCHIVE",
    "MODE",
    "MTIME",
    "member_header",
    "padding",
    "padded_size",
]

BLOCK = 512
#: Two zero blocks end an archive; no record padding follows them.
END_OF_ARCHIVE = bytes(2 * BLOCK)
MODE = 0o644
MTIME = 0
_MAX_USTAR_SIZE = 8**11 - 1
_NAME_LEN, _PREFIX_LEN = 100, 155
_ZEROS = memoryview(bytes(BLOCK))

# Everything between the name and the checksum, and after the type flag, is fixed.
_MODE_UID_GID = b"%07o\0" % MODE + b"0000000\0" * 2
_MTIME_FIELD = b"%011o\0" % MTIME
# linkname, magic and version, uname and gname, devmajor and devminor (NUL, as tarfile).
_AFTER_TYPE = bytes(100) + b"ustar\x0000" + bytes(64) + bytes(16)
_TAIL = bytes(12)
_FIXED_SUM = (
    sum(_MODE_UID_GID) + sum(_MTIME_FIELD) + sum(_AFTER_TYPE) + 8 * ord(" ")  # chksum as spaces
)


def padded_size(size: int) -> int:
    """``size`` rounded up to whole blocks."""
    return -(-size // BLOCK) * BLOCK


def padding(size: int) -> memoryview:
    """The zero bytes that follow ``size`` data bytes to fill their last block."""
    return _ZEROS[: -size % BLOCK]


def _block(name: bytes, prefix: bytes, size: int, typeflag: bytes) -> bytes:
    size_field = b"%011o\0" % size
    checksum = _FIXED_SUM + sum(name) + sum(prefix) + sum(size_field) + typeflag[0]
    header = b"".join(
        (
            name.ljust(_NAME_LEN, b"\0"),
            _MODE_UID_GID,
            size_field,
            _MTIME_FIELD,
            b"%06o\0 " % checksum,
            typeflag,
            _AFTER_TYPE,
            prefix.ljust(_PREFIX_LEN, b"\0"),
            _TAIL,
        )
    )
    return header


def _split_ustar(name: bytes) -> tuple[bytes, bytes] | None:
    """``(prefix, name)`` fields for ``name``, or ``None`` if USTAR cannot hold it."""
    if len(name) <= _NAME_LEN:
        return b"", name
    # As tarfile does: the shortest prefix whose remainder fits the name field.
    slash = name.find(b"/")
    while 0 < slash <= _PREFIX_LEN:
        if len(name) - slash - 1 <= _NAME_LEN:
            return name[:slash], name[slash + 1 :]
        slash = name.find(b"/", slash + 1)
    return None


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:  # the length counts its own digits
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def member_header(name: str, size: int) -> bytes:
    """The header block(s) of a regular file ``name`` with ``size`` data bytes.

    One 512-byte USTAR block, or a PAX extended header (``x`` block plus its
    records) followed by that block when USTAR cannot hold the name or size.

    Raises
    ------
    UnicodeEncodeError
        If ``name`` cannot be encoded as UTF-8 (a lone surrogate).
    """
    raw = name.encode("utf-8")
    fields = _split_ustar(raw) if raw.isascii() else None
    if fields is not None and size <= _MAX_USTAR_SIZE:
        return _block(fields[1], fields[0], size, b"0")
    records = b""
    if fields is None:
        records += _pax_record("path", name)
        # Readers that ignore PAX still see a plain ASCII name.
        fields = (b"", name.encode("ascii", "replace")[:_NAME_LEN])
    if size > _MAX_USTAR_SIZE:
        records += _pax_record("size", str(size))
    pax = _block(b"././@PaxHeader", b"", len(records), b"x")
    member = _block(fields[1], fields[0], 0 if size > _MAX_USTAR_SIZE else size, b"0")
    return pax + records + bytes(padding(len(records))) + member
