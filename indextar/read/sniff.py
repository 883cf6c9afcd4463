"""Which encoded images a GPU JPEG decoder can take, read from their first bytes.

nvJPEG (through ``torchvision.io.decode_jpeg(device="cuda")``) and DALI's mixed decoder
take 8-bit baseline and progressive Huffman JPEGs with one or three components. Every
other image, and a JPEG whose EXIF orientation turns it (``image_decoder`` turns it
upright; the GPU decoders do not), goes to the CPU path instead: :func:`gpu_refusal`
names the reason, without decoding anything. It walks the JPEG's markers up to the
frame header, a few segments at the front of the file.
"""

from __future__ import annotations

import struct

__all__ = ["gpu_refusal", "exif_orientation"]

_SOI = b"\xff\xd8"
# Start-of-frame markers: C0 baseline, C1 extended, C2 progressive (Huffman coded);
# C3 lossless, C5-C7 hierarchical, C9-CB and CD-CF arithmetic coded. C4, C8 and CC are
# not frames (Huffman tables, a reserved marker, arithmetic conditioning).
_GPU_FRAMES = frozenset({0xC0, 0xC1, 0xC2})
_OTHER_FRAMES = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_STANDALONE = frozenset({0x01, 0xD8, *range(0xD0, 0xD8)})  # no length field follows
_SOS = 0xDA
_APP1 = 0xE1
_ORIENTATION_TAG = 0x0112


def gpu_refusal(data: bytes | memoryview, *, orient: bool = True) -> str | None:
    """``None`` if a GPU JPEG decoder takes ``data`` and gives what ``image_decoder``
    would; otherwise why not: the format (``"png"``, ``"webp"``, ``"gif"``, ``"bmp"``,
    ``"tiff"``, ``"other"``), or for JPEGs ``"cmyk"`` (four components),
    ``"components"`` (two or more than four), ``"precision"`` (12-bit), ``"coding"``
    (lossless, hierarchical or arithmetic), ``"orientation"`` (an EXIF orientation other
    than upright, with ``orient``) or ``"truncated"`` (no frame header)."""
    head = bytes(data[:12])
    if not head.startswith(_SOI):
        return _format(head)
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return "truncated"  # not at a marker: a damaged file the CPU path will name
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == _APP1 and orient:
            segment = bytes(data[pos + 4 : pos + 2 + length])
            if segment.startswith(b"Exif\0\0") and exif_orientation(segment[6:]) != 1:
                return "orientation"
        if marker in _GPU_FRAMES:
            if pos + 10 > end:
                return "truncated"
            if data[pos + 4] != 8:
                return "precision"
            components = data[pos + 9]
            if components == 4:
                return "cmyk"
            return None if components in (1, 3) else "components"
        if marker in _OTHER_FRAMES:
            return "coding"
        if marker == _SOS:
            return "truncated"  # scan data before any frame header
        pos += 2 + length
    return "truncated"


def _format(head: bytes) -> str:
    if head.startswith(b"\x89PNG"):
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] in (b"GIF8",):
        return "gif"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] in (b"II*\0", b"MM\0*"):
        return "tiff"
    return "other"


def exif_orientation(tiff: bytes) -> int:
    """The orientation tag (1-8) of an EXIF block's TIFF structure (what follows
    ``Exif\\0\\0``); 1 when it has none or the block is damaged, as ``image_decoder``."""
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None:
        return 1
    try:
        (ifd,) = struct.unpack_from(order + "I", tiff, 4)
        (count,) = struct.unpack_from(order + "H", tiff, ifd)
        for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
            tag, kind = struct.unpack_from(order + "HH", tiff, entry)
            if tag == _ORIENTATION_TAG:
                if kind != 3:  # SHORT
                    return 1
                (value,) = struct.unpack_from(order + "H", tiff, entry + 8)
                return value if 1 <= value <= 8 else 1
    except struct.error:
        return 1
    return 1
