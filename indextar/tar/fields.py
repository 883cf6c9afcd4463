"""Tar header fields, decoded and checked a batch at a time with numpy.

Pure functions over header bytes: numeric fields (octal in the canonical layout
every writer emits, or the general form strict readers accept), checksums (unsigned
or signed), and member names (the name field, cut at its first NUL, and the POSIX
ustar prefix). Each rule is written once for one header (:func:`parse_number`,
:func:`checksum_ok`, :func:`header_name`), which the stream and the span check use,
and where the scan needs it, once more over a batch of headers in numpy.
:mod:`indextar.tar.scan` builds on them.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt

__all__ = [
    "FIELDS",
    "MAGIC_OFFSET",
    "POSIX_MAGIC",
    "canonical_numbers",
    "checksum_ok",
    "checksums_ok",
    "decode_names",
    "header_name",
    "names_at",
    "parse_number",
    "parse_numeric",
    "parse_octal",
    "cached_octal",
]

MAGIC_OFFSET = 257
_MAGIC_OFFSET = MAGIC_OFFSET
# POSIX ustar (and PAX) headers: the magic "ustar\0" and the version "00". Only these
# have a prefix field; GNU headers ("ustar  \0") use the bytes for other things.
POSIX_MAGIC = b"ustar\x0000"

# Numeric header fields: (offset, width). All must be valid octal or base-256.
FIELDS = {
    "mode": (100, 8),
    "uid": (108, 8),
    "gid": (116, 8),
    "size": (124, 12),
    "mtime": (136, 12),
    "chksum": (148, 8),
}
_FIELDS = FIELDS


@functools.lru_cache(maxsize=4096)
def cached_octal(field: bytes) -> int | None:
    """:func:`parse_octal`, memoised: a shard's size fields repeat a lot."""
    return parse_octal(field)


def checksum_ok(header: bytes) -> bool:
    """Whether one 512-byte ``header`` carries a valid checksum: :func:`checksums_ok`'s
    rule, for readers that see one header at a time."""
    stored = parse_octal(header[148:156])  # strictly octal: int() takes "+7", "0o7", "1_0"
    if stored is None:
        return False
    # The checksum field counts as eight spaces.
    unsigned = sum(header) - sum(header[148:156]) + 8 * ord(" ")
    if stored == unsigned:
        return True
    # Old tars summed signed bytes; only headers with bytes >= 128 differ.
    high = sum(1 for b in header[:148] + header[156:] if b > 127)
    return stored == unsigned - 256 * high


def checksums_ok(
    rows: npt.NDArray[np.uint8],
    parsed: tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]] | None = None,
) -> npt.NDArray[np.bool_]:
    """Which header rows carry a valid checksum (unsigned, or signed as old tars wrote)."""
    if parsed is None:
        _, stored, canonical = canonical_numbers(rows)
    else:
        stored, canonical = parsed[0].copy(), parsed[1]
    for i in np.flatnonzero(~canonical):  # rare: the general parser, -1 if not octal
        value = parse_octal(rows[i, 148:156].tobytes())
        stored[i] = -1 if value is None else value
    field_sum = rows[:, 148:156].sum(axis=1, dtype=np.int64)
    # uint32 accumulation is twice as fast as int64 and cannot overflow (512 * 255).
    unsigned = rows.sum(axis=1, dtype=np.uint32).astype(np.int64) - field_sum + 8 * ord(" ")
    good: npt.NDArray[np.bool_] = stored == unsigned
    retry = np.flatnonzero(~good & (stored >= 0))
    if retry.size:  # rare: only headers with bytes >= 128 can differ when signed
        signed = rows[retry].astype(np.int8).sum(axis=1, dtype=np.int64)
        signed -= rows[retry, 148:156].astype(np.int8).sum(axis=1, dtype=np.int64) - 8 * ord(" ")
        good[retry] = stored[retry] == signed
    return good


# Byte classes for the canonical numeric layout: 1 = octal digit, 2 = NUL or space.
_BYTE_CLASS = np.zeros(256, np.uint8)
_BYTE_CLASS[ord("0") : ord("8")] = 1
_BYTE_CLASS[[0, ord(" ")]] = 2
# The numeric fields mode..chksum are contiguous (bytes 100-155). In the canonical
# layout every writer emits, a field of width w is w-2 digits, then a digit or a pad,
# then a pad: "0000644\0", or "012345\0 " for checksums.
_NUMERIC = slice(100, 156)
_TEMPLATE = np.zeros(56, np.uint8)
for _start, _width in _FIELDS.values():
    _col = _start - 100
    _TEMPLATE[_col : _col + _width - 2] = 1
    _TEMPLATE[_col + _width - 2] = 3
    _TEMPLATE[_col + _width - 1] = 2


def canonical_numbers(
    rows: npt.NDArray[np.uint8],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Sizes and stored checksums of header rows in one vectorised pass.

    Returns ``(sizes, checksums, canonical)``: values are valid only where
    ``canonical`` is true, i.e. where all six numeric fields have the canonical
    layout. Other rows (unusual padding, base-256, corrupt) need the general parser.
    """
    classes = _BYTE_CLASS[rows[:, _NUMERIC]]
    # 56 flags a row, compared as 7 machine words rather than 56 bytes.
    fits = ((classes & _TEMPLATE) != 0).view(np.uint64)
    canonical = (fits == np.uint64(0x0101010101010101)).all(axis=1)
    return _octal_column(rows, classes, 124, 12), _octal_column(rows, classes, 148, 8), canonical


def _octal_column(
    rows: npt.NDArray[np.uint8], classes: npt.NDArray[np.uint8], start: int, width: int
) -> npt.NDArray[np.int64]:
    """Values of one canonical octal field: ``width - 1`` or ``width - 2`` digits."""
    digits = rows[:, start : start + width - 1].astype(np.int64) - ord("0")
    long_form = digits @ (8 ** np.arange(width - 2, -1, -1, dtype=np.int64))
    short_form = digits[:, :-1] @ (8 ** np.arange(width - 3, -1, -1, dtype=np.int64))
    last_is_digit = classes[:, start - 100 + width - 2] == 1
    return np.where(last_is_digit, long_form, short_form)


def parse_numeric(
    fields: npt.NDArray[np.uint8], *, values: bool = True
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Parse octal fields row-wise, as strict tar readers do.

    A field is: optional spaces, octal digits, then a NUL or spaces; anything after
    the first NUL is ignored, an empty field is 0. Returns the values (zeros unless
    ``values``) and a mask of rows that parsed; base-256 rows do not parse here.
    """
    n, width = fields.shape
    result = np.zeros(n, dtype=np.int64)
    canonical = np.zeros(n, dtype=bool)
    # Fast path: the canonical forms every common writer emits, a run of digits
    # padded with a NUL or space ("0000644\0"), or with two (checksums, "012345\0 ").
    is_digit = (fields - ord("0")) < 8
    is_pad = (fields == 0) | (fields == ord(" "))
    for ndigits in (width - 1, width - 2):
        form = is_digit[:, :ndigits].all(axis=1) & is_pad[:, ndigits:].all(axis=1) & ~canonical
        if values and form.any():
            powers = 8 ** np.arange(ndigits - 1, -1, -1, dtype=np.int64)
            parsed = (fields[:, :ndigits].astype(np.int64) - ord("0")) @ powers
            result = np.where(form, parsed, result)
        canonical |= form
    ok = canonical.copy()
    for i in np.flatnonzero(~canonical):  # rare: other layouts take the general parser
        parsed = parse_octal(fields[i].tobytes())
        if parsed is not None:
            ok[i] = True
            result[i] = parsed
    return result, ok


def parse_number(raw: bytes) -> int | None:
    """A numeric field: octal, or GNU base-256 (first byte 0x80, or 0xff if negative);
    ``None`` if it is neither."""
    if raw[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(raw[1:], "big")
        return value - (1 << (8 * len(raw) - 8)) if raw[0] == 0xFF else value
    return parse_octal(raw)


def parse_octal(raw: bytes) -> int | None:
    """General octal field parser: ``None`` unless the field is valid octal."""
    text = raw.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    # Digits 0-7 only: int(text, 8) alone would also take "+7", "0o7" and "1_0".
    if not text.isdigit() or b"8" in text or b"9" in text:
        return None
    return int(text, 8)


def header_name(header: bytes) -> bytes:
    """The raw name of one header: its name field to the first NUL, after its prefix
    field where the header is POSIX ustar.

    As the scanner and the C walker: the magic and the version "00" (GNU tar and tarfile
    take "ustar\\0" alone; GNU headers, "ustar  \\0", use those bytes for other fields).
    """
    name = header[:100].split(b"\0", 1)[0]
    if header[345] and header[_MAGIC_OFFSET : _MAGIC_OFFSET + len(POSIX_MAGIC)] == POSIX_MAGIC:
        name = header[345:500].split(b"\0", 1)[0] + b"/" + name
    return name


def decode_names(rows: npt.NDArray[np.uint8], types: npt.NDArray[np.uint8]) -> list[bytes]:
    """Raw names from the name and (POSIX ustar) prefix fields of header ``rows``."""
    return names_at(rows, np.arange(len(rows)), types)


def names_at(
    blocks: npt.NDArray[np.uint8], rows: npt.NDArray[np.int64], types: npt.NDArray[np.uint8]
) -> list[bytes]:
    """Raw names of the headers ``blocks[rows]``; reads only the fields it needs.

    Old V7 tars mark a directory as a regular file whose name ends in '/': such
    entries get type ``'5'`` in ``types``.
    """
    name_field = blocks[rows, :100]
    names: list[bytes] = name_field.view("S100").ravel().tolist()  # trailing NULs dropped
    # A name ends at its first NUL, whatever follows: find rows with bytes after a NUL.
    lengths = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
    for i in np.flatnonzero(np.count_nonzero(name_field, axis=1) != lengths):
        names[i] = names[i].split(b"\0", 1)[0]
    # The rows whose name has a prefix, found at once; each is named by header_name.
    magic = blocks[rows, _MAGIC_OFFSET : _MAGIC_OFFSET + len(POSIX_MAGIC)]
    posix = (magic == np.frombuffer(POSIX_MAGIC, np.uint8)).all(axis=1)
    for i in np.flatnonzero(posix & (blocks[rows, 345] != 0)):
        names[i] = header_name(blocks[rows[i]].tobytes())
    for i in np.flatnonzero(types == 0):
        if names[i].endswith(b"/"):
            types[i] = ord("5")
    return names
