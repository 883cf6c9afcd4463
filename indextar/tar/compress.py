"""Recognising compressed shards by their first bytes, and the layout of zstd frames.

The tar scanner needs uncompressed bytes: :mod:`indextar.tar.scan` refuses a compressed
buffer with the command that turns it into a plain one. Indexes of gzip and zstd shards
are built from their decompressed bytes (:mod:`indextar.index.decompress`), which finds
a zstd file's frames from their headers with :func:`zstd_frame_spans`.
"""

from __future__ import annotations

import shlex
from typing import Any

from ..errors import ShardFormatError, TruncatedShardError

__all__ = [
    "CODECS",
    "ZSTD_MAGIC",
    "ZstdFrameWalk",
    "compressed_message",
    "sniff_codec",
    "sniff_compression",
    "split_compression_suffix",
    "zstd_frame_spans",
]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

CODECS = ("gzip", "zstd")
"""The compressions indextar reads in place, indexed and at random; others are refused
with a command that decompresses them (:func:`compressed_message`)."""

# (magic, format, its command-line tool, the file name suffixes it goes with)
_COMPRESSION_MAGIC = (
    (b"\x1f\x8b", "gzip", "gzip", (".gz", ".tgz")),
    (b"BZh", "bzip2", "bzip2", (".bz2",)),
    (b"\xfd7zXZ\x00", "xz", "xz", (".xz",)),
    (ZSTD_MAGIC, "zstd", "zstd", (".zst", ".zstd")),
    (b"\x04\x22\x4d\x18", "lz4", "lz4", (".lz4",)),
)


def sniff_compression(head: bytes) -> str | None:
    """Name the compression format ``head`` starts with, or ``None``."""
    for magic, name, _, _ in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            return name
    return None


def sniff_codec(head: bytes) -> str | None:
    """The codec of :data:`CODECS` that ``head`` starts as, or ``None`` (a plain tar, or
    another compression, which the tar scanner refuses with a command to convert)."""
    codec = sniff_compression(head)
    return codec if codec in CODECS else None


def split_compression_suffix(name: str) -> tuple[str, str | None]:
    """``name`` without its compression suffix (``.tgz`` becomes ``.tar``), and the format
    that suffix names; ``(name, None)`` if it has none.

    >>> split_compression_suffix("a.tgz"), split_compression_suffix("a.tar")
    (('a.tar', 'gzip'), ('a.tar', None))
    """
    lowered = name.lower()
    for _, format_name, _, suffixes in _COMPRESSION_MAGIC:
        for suffix in suffixes:
            if lowered.endswith(suffix) and len(name) > len(suffix):
                return name[: -len(suffix)] + (".tar" if suffix == ".tgz" else ""), format_name
    return name, None


def compressed_message(
    head: bytes, shard: str | None, *, reading: str = "random access", remote: bool = False
) -> str | None:
    """Why ``shard``, starting with ``head``, cannot be scanned (or read as ``reading``
    says, for example ``"streaming"``), or ``None`` if not compressed. A ``remote``
    shard (a URL: the caller's location says so) is told to download, decompress and
    upload."""
    for magic, name, tool, _ in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            hint = _decompress_command(tool, shard or "SHARD", remote=remote)
            return (
                f"shard is {name}-compressed; {reading} needs a plain, gzip- or "
                f"zstd-compressed tar (decompress it first, for example: {hint})"
            )
    return None


def _decompress_command(tool: str, shard: str, *, remote: bool = False) -> str:
    """A shell command that turns the compressed ``shard`` into a plain tar; for a URL,
    the steps around that command (no command decompresses an object in place).

    ``gunzip`` and friends refuse names without their suffix, and compressed shards
    are often named ``.tar``: ``tool -dc`` works whatever the name.
    """
    quote = shlex.quote
    if remote:
        path = shard.partition("?")[0]  # a signed URL's query names no file
        name = path.rstrip("/").rpartition("/")[2] or "shard"
        plain_url, named = split_compression_suffix(path)
        if named == tool:
            where = f"upload {quote(split_compression_suffix(name)[0])} as {plain_url}"
        else:
            where = f"upload {quote(name)} in place of {shard}"
        return f"download it as {quote(name)}, run `{_decompress_command(tool, name)}`, and {where}"
    plain, named = split_compression_suffix(shard)
    if named == tool:
        return f"{tool} -dc {quote(shard)} > {quote(plain)}"
    tmp = shard + ".tmp"
    return f"{tool} -dc {quote(shard)} > {quote(tmp)} && mv {quote(tmp)} {quote(shard)}"


# -- zstd frames -------------------------------------------------------------------

_FCS_SIZES = (0, 2, 4, 8)
_DICT_ID_SIZES = (0, 1, 2, 4)


def _skippable(magic: bytes) -> bool:
    """Whether ``magic`` is a skippable frame's magic number (0x184D2A50 to 0x184D2A5F)."""
    return len(magic) == 4 and magic[1:] == b"\x2a\x4d\x18" and magic[0] & 0xF0 == 0x50


def _frame_header(descriptor: int) -> tuple[int, int]:
    """From a zstd frame's descriptor byte: the header bytes after it (window
    descriptor, dictionary ID, content size) and the size of the checksum after the
    frame's last block (RFC 8878, section 3.1.1.1)."""
    single_segment = descriptor >> 5 & 1
    fcs_size = _FCS_SIZES[descriptor >> 6] or single_segment
    rest = (0 if single_segment else 1) + _DICT_ID_SIZES[descriptor & 3] + fcs_size
    return rest, 4 * (descriptor >> 2 & 1)


def zstd_frame_spans(buf: Any, *, shard: str | None = None) -> list[tuple[int, int, bool]]:
    """Every frame of a zstd file as ``(offset, size, is_data)``, from its headers alone.

    Skippable frames (the seekable format's seek table, say) have ``is_data`` false.
    No byte is decompressed: a data frame's size is its header plus its blocks' headers
    and sizes (RFC 8878, section 3.1.1), and its checksum if it has one.

    Raises
    ------
    TruncatedShardError
        If the file ends inside a frame.
    ShardFormatError
        If a frame starts with neither zstd's nor a skippable frame's magic number.
    """
    view = memoryview(buf).cast("B")
    size = len(view)
    spans: list[tuple[int, int, bool]] = []
    pos = 0
    while pos < size:
        start = pos
        magic = bytes(view[pos : pos + 4])
        if _skippable(magic):
            pos += 8 + _little(view, pos + 4, 4, start, shard)
            if pos > size:
                raise _truncated(shard, start, "a skippable zstd frame")
            spans.append((start, pos - start, False))
            continue
        if magic != ZSTD_MAGIC:
            raise ShardFormatError(
                f"expected a zstd frame (magic {ZSTD_MAGIC.hex()}) or a skippable frame, found "
                f"{magic.hex() or 'the end of the file'}",
                shard=shard,
                offset=start,
            )
        header_rest, checksum = _frame_header(_little(view, pos + 4, 1, start, shard))
        pos += 5 + header_rest
        while True:
            header = _little(view, pos, 3, start, shard)
            kind, block_size = header >> 1 & 3, header >> 3
            if kind == 3:
                raise ShardFormatError(
                    "zstd block of reserved type 3 (corrupt data)", shard=shard, offset=pos
                )
            pos += 3 + (1 if kind == 1 else block_size)
            if header & 1:
                break
        pos += checksum
        if pos > size:
            raise _truncated(shard, start, "a zstd frame")
        spans.append((start, pos - start, True))
    return spans


class ZstdFrameWalk:
    """:func:`zstd_frame_spans` for a stream: fed a zstd file's bytes in order, it
    follows the frames' headers and knows whether the bytes so far end between frames,
    which tells a stream cut inside a frame (zstd's streaming reader then just stops)
    from a complete one. Bytes that are no zstd frame stop the walk; the decompressor
    reports those itself."""

    __slots__ = ("offset", "frame_start", "_state", "_need", "_partial", "_skip", "_checksum")

    def __init__(self) -> None:
        self.offset = 0  # bytes fed so far
        self.frame_start = 0  # where the frame being read starts
        self._state = "magic"  # the field being read: magic, skip-size, descriptor, block
        self._need = 4  # its length
        self._partial = bytearray()  # its bytes so far
        self._skip = 0  # bytes to pass over before the next field
        self._checksum = 0

    @property
    def between_frames(self) -> bool:
        """Whether the bytes fed so far end where a frame ends (or the walk stopped)."""
        return self._state == "lost" or (
            self._state == "magic" and not self._partial and not self._skip
        )

    def feed(self, data: Any) -> None:
        """Follow the next bytes of the file."""
        view = memoryview(data).cast("B")
        at, size = 0, len(view)
        while at < size and self._state != "lost":
            if self._skip:
                step = min(self._skip, size - at)
                self._skip -= step
                at += step
                continue
            if self._state == "magic" and not self._partial:
                self.frame_start = self.offset + at
            take = min(self._need - len(self._partial), size - at)
            self._partial += view[at : at + take]
            at += take
            if len(self._partial) == self._need:
                field = bytes(self._partial)
                self._partial.clear()
                self._field(field)
        self.offset += size

    def _field(self, field: bytes) -> None:
        """Act on the field just read whole."""
        if self._state == "magic":
            if _skippable(field):
                self._state = "skip-size"
            elif field == ZSTD_MAGIC:
                self._state, self._need = "descriptor", 1
            else:
                self._state = "lost"
        elif self._state == "skip-size":
            self._state, self._skip = "magic", int.from_bytes(field, "little")
        elif self._state == "descriptor":
            self._skip, self._checksum = _frame_header(field[0])
            self._state, self._need = "block", 3
        else:  # a block header
            header = int.from_bytes(field, "little")
            kind = header >> 1 & 3
            if kind == 3:  # reserved: corrupt, which the decompressor says
                self._state = "lost"
                return
            self._skip = 1 if kind == 1 else header >> 3
            if header & 1:  # the frame's last block, then its checksum if it has one
                self._skip += self._checksum
                self._state, self._need = "magic", 4


def _little(view: memoryview, pos: int, length: int, frame: int, shard: str | None) -> int:
    """The little-endian number of ``length`` bytes at ``pos``, in the frame at ``frame``."""
    if pos + length > len(view):
        raise _truncated(shard, frame, "a zstd frame")
    return int.from_bytes(view[pos : pos + length], "little")


def _truncated(shard: str | None, frame: int, what: str) -> TruncatedShardError:
    return TruncatedShardError(
        f"the compressed shard is truncated: it ends inside {what} that starts at compressed "
        f"byte offset {frame}",
        shard=shard,
        offset=frame,
    )
