"""Scan an uncompressed tar held in memory (bytes or an mmap) into its members.

No SQLite and no torch here: this module only turns bytes into arrays.

How the scan works
------------------
A tar is a chain of 512-byte header blocks, each followed by its member's data
rounded up to whole blocks. Finding the chain is inherently sequential, so the
scan proceeds in three steps:

1. **Walk.** Find the offset of every header block. Two walkers exist:

   * the *sequential* walker reads one header at a time and jumps over the data.
     It reads only the headers, which is what large members want;
   * the *vectorised* walker looks at every block of a window at once: blocks
     carrying the ``ustar`` magic are header candidates; their sizes give each
     candidate's successor, and the window is accepted only if the candidates form
     one unbroken chain. A block in a member's data that merely looks like a
     header (a tar inside a tar) breaks the chain, and the window is walked
     sequentially instead. Dense shards (many small members) take this path.

   The scan starts sequentially and switches to the vectorised walker once the
   members it has seen are small on average.
2. **Decode.** All header blocks are gathered into one ``(n, 512)`` array and
   checked at once: checksums (unsigned or signed, as strict readers accept),
   numeric fields (octal or base-256), names (ending at their first NUL), the
   ustar ``prefix`` field and type flags.
3. **Resolve.** GNU long-name (``L``/``K``) and PAX (``x``/``g``) extension
   headers are applied to the member they precede. The final sizes are checked
   against the chain found in step 1; a mismatch (possible only when an extension
   header changes a size) means the walk is redone sequentially with full
   knowledge of the extension headers.

The result is a :class:`TarScan`: parallel numpy arrays plus the member names.
"""

from __future__ import annotations

import logging
import mmap
import shlex
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from . import native
from .errors import (
    CompressedShardError,
    IndextarError,
    ShardFormatError,
    TruncatedShardError,
    UnsupportedMemberError,
)
from .tarfields import (
    FIELDS as _FIELDS,
)
from .tarfields import cached_octal as _cached_octal
from .tarfields import canonical_numbers as _canonical_numbers
from .tarfields import checksums_ok as _checksums_ok
from .tarfields import decode_names as _decode_names
from .tarfields import names_at as _names_at
from .tarfields import parse_numeric as _parse_numeric
from .tarfields import parse_octal as _parse_octal

__all__ = ["TarScan", "scan_tar", "MEMBER_KINDS", "sniff_compression"]

log = logging.getLogger(__name__)

BLOCK = 512
_MAGIC_OFFSET = 257
_POSIX_MAGIC = b"ustar\x0000"

# Type flags that carry no data blocks, whatever their size field says
# (as in tarfile and GNU tar).
_NO_DATA_TYPES = b"123456"
# Extension headers: their data describes the next header.
_GNU_LONGNAME, _GNU_LONGLINK = ord("L"), ord("K")
_PAX_LOCAL, _PAX_GLOBAL = ord("x"), ord("g")
_GNU_SPARSE, _GNU_MULTIVOL, _GNU_VOLHDR = ord("S"), ord("M"), ord("V")
_EXTENSION_TYPES = frozenset({_GNU_LONGNAME, _GNU_LONGLINK, _PAX_LOCAL, _PAX_GLOBAL})

#: What each skipped type flag is reported as.
MEMBER_KINDS: dict[int, str] = {
    ord("1"): "hardlink",
    ord("2"): "symlink",
    ord("3"): "chardev",
    ord("4"): "blockdev",
    ord("5"): "directory",
    ord("6"): "fifo",
    _GNU_VOLHDR: "volume-header",
}
_REGULAR_TYPES = frozenset({ord("0"), 0, ord("7")})

# Switch to the vectorised walker once members average under this many bytes:
# it reads every block, which only pays off when headers are dense.
_DENSE_MEMBER_BYTES = 16 * 1024
_PROBE_HEADERS = 64
_WINDOW_BLOCKS = 1 << 16  # 32 MiB per vectorised window
_DECODE_CHUNK = 1 << 15
_ZERO_BLOCK = bytes(BLOCK)  # header rows decoded at once (16 MiB)
# Sizes are int64 arrays and offsets add to them: a size field claiming more than this
# (GNU base-256 and PAX sizes are unbounded) is refused before it can overflow.
_MAX_MEMBER_SIZE = 1 << 62

# (magic, format, its command-line tool, the file name suffixes it goes with)
_COMPRESSION_MAGIC = (
    (b"\x1f\x8b", "gzip", "gzip", (".gz", ".tgz")),
    (b"BZh", "bzip2", "bzip2", (".bz2",)),
    (b"\xfd7zXZ\x00", "xz", "xz", (".xz",)),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd", (".zst", ".zstd")),
    (b"\x04\x22\x4d\x18", "lz4", "lz4", (".lz4",)),
)


@dataclass(frozen=True, slots=True)
class TarScan:
    """Every entry of a tar, in archive order.

    Extension headers (GNU ``L``/``K``, PAX ``x``/``g``) are folded into the entry
    they describe, so each row is one logical entry.

    Attributes
    ----------
    names
        Entry names, decoded as UTF-8.
    types
        Type flag byte of each entry (``ord('0')`` for a regular file).
    header_offsets
        Offset of each entry's first header block, extension headers included.
    data_offsets
        Offset of each entry's data.
    sizes
        Each entry's data size in bytes (0 for entries that carry no data).
    end_offset
        Offset of the end-of-archive marker.
    file_size
        Size of the scanned bytes.
    """

    names: list[str]
    types: npt.NDArray[np.uint8]
    header_offsets: npt.NDArray[np.int64]
    data_offsets: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    end_offset: int
    file_size: int
    extension_headers: int = field(default=0)

    def __len__(self) -> int:
        return len(self.names)

    def is_regular(self) -> npt.NDArray[np.bool_]:
        """Mask of entries that are regular files."""
        return np.isin(self.types, np.array(sorted(_REGULAR_TYPES), dtype=np.uint8))

    def kind(self, i: int) -> str:
        """What entry ``i`` is: ``"file"``, ``"directory"``, ``"symlink"``, ..."""
        t = int(self.types[i])
        if t in _REGULAR_TYPES:
            return "file"
        return MEMBER_KINDS.get(t, f"type-{chr(t)!r}")


def sniff_compression(head: bytes) -> str | None:
    """Name the compression format ``head`` starts with, or ``None``."""
    for magic, name, _, _ in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            return name
    return None


def scan_tar(buf: Any, *, shard: str | None = None, fd: int | None = None) -> TarScan:
    """Scan an uncompressed tar in ``buf`` (bytes, bytearray, memoryview or mmap).

    Parameters
    ----------
    buf
        The whole archive, supporting the buffer protocol.
    shard
        Name used in error messages.
    fd
        Optionally, an open descriptor of the file that ``buf`` maps. Headers are then
        read with ``pread`` rather than through the map: on large members a page
        fault per header costs several times a read on some machines.

    Raises
    ------
    ShardFormatError
        On any malformed header, with the byte offset (subclasses
        :class:`TruncatedShardError`, :class:`CompressedShardError`,
        :class:`UnsupportedMemberError` say more).
    """
    scanner = _Scanner(buf, shard, -1 if fd is None else fd)
    return scanner.scan()


# The C walker's chain: offsets, sizes, types, the end marker's offset, decoded names.
_Chain = tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint8], int, "list[str] | None"
]


class _Scanner:
    def __init__(self, buf: Any, shard: str | None, fd: int = -1):
        self.buf = buf
        self.fd = fd
        self.data = np.frombuffer(buf, dtype=np.uint8)
        # mmap and bytes slice to bytes cheaply; anything else through a memoryview.
        self.raw = buf if isinstance(buf, (bytes, mmap.mmap)) else memoryview(buf).cast("B")
        self.size = int(self.data.size)
        self.shard = shard

    def error(
        self, cls: type[ShardFormatError], message: str, offset: int | None
    ) -> ShardFormatError:
        return cls(message, shard=self.shard, offset=offset)

    # -- entry point --------------------------------------------------------

    def scan(self) -> TarScan:
        self.check_start()
        plain = self.walk_c()
        if plain is not None:
            return self.resolve_plain(*plain)
        try:
            offsets, end = self.walk_fast()
            return self.resolve(offsets, end)
        except (_ChainMismatch, ShardFormatError):
            # The fast walk can be misled where extension headers change sizes, or stop
            # at a point where a sequential walk reports the problem better. The
            # sequential walk is the reference: its result, or its error, stands.
            log.debug("%s: walking sequentially", self.shard)
        offsets, end = self.walk_sequential(0, self.size)
        try:
            return self.resolve(offsets, end)
        except _ChainMismatch as e:
            raise self.error(
                ShardFormatError,
                "header chain is inconsistent: an extension header gives a size that does not "
                "match where the next header starts",
                e.offset,
            ) from None

    def check_start(self) -> None:
        if self.size == 0:
            raise self.error(ShardFormatError, "file is empty (0 bytes); not a tar archive", 0)
        head = self.data[:8].tobytes()
        for magic, name, tool, suffixes in _COMPRESSION_MAGIC:
            if head.startswith(magic):
                hint = _decompress_command(tool, suffixes, self.shard or "SHARD")
                raise self.error(
                    CompressedShardError,
                    f"shard is {name}-compressed; random access needs an uncompressed tar "
                    f"(decompress it first, for example: {hint})",
                    0,
                )
        if self.size < BLOCK:
            raise self.error(
                TruncatedShardError,
                f"file has {self.size} bytes, less than one 512-byte tar header",
                0,
            )
        first = self.data[:BLOCK].reshape(1, BLOCK)
        if first.any() and not _checksums_ok(first).all():
            raise self.error(
                ShardFormatError,
                "not a tar archive: the first 512 bytes are not a valid tar header "
                "(checksum mismatch)",
                0,
            )

    # -- step 1: the walk ---------------------------------------------------

    def walk_fast(self) -> tuple[npt.NDArray[np.int64], int]:
        """Header offsets and the end-of-archive offset, choosing walkers adaptively."""
        chunks: list[npt.NDArray[np.int64]] = []
        probe, pos = self.walk_sequential(0, self.size, max_headers=_PROBE_HEADERS)
        chunks.append(probe)
        while pos is not None and pos < self.size and not self.is_zero_block(pos):
            # pos is a header offset still to be walked.
            dense = len(probe) and (pos / max(1, sum(len(c) for c in chunks))) < _DENSE_MEMBER_BYTES
            if dense:
                window, nxt = self.walk_window(pos)
                if window is not None:
                    chunks.append(window)
                    pos = nxt
                    continue
            seq, pos = self.walk_sequential(pos, self.size, max_headers=_PROBE_HEADERS * 16)
            chunks.append(seq)
        offsets = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
        assert pos is not None
        return offsets, pos

    def is_zero_block(self, pos: int) -> bool:
        end = min(pos + BLOCK, self.size)
        return not self.data[pos:end].any()

    def walk_sequential(
        self,
        pos: int,
        limit: int,
        *,
        max_headers: int | None = None,
    ) -> tuple[npt.NDArray[np.int64], int]:
        """Walk headers from ``pos``; stop at a zero block, ``limit`` or ``max_headers``.

        Returns the header offsets walked and the offset where the walk stopped. Sizes
        given by PAX headers are honoured, so this walk is the reference.
        """
        raw, size = self.raw, self.size
        found: list[int] = []
        pending_size: int | None = None
        global_size: int | None = None
        try:
            while pos < limit:
                if max_headers is not None and len(found) >= max_headers:
                    break
                if pos + BLOCK > size:
                    raise self.error(
                        TruncatedShardError,
                        f"shard ends inside a header: {size - pos} of 512 header bytes present",
                        pos,
                    )
                # Plain bytes, not numpy: a header here is a few small slices.
                header = bytes(raw[pos : pos + BLOCK])
                if header == _ZERO_BLOCK:
                    break
                typeflag = header[156]
                size_field = header[124:136]
                member_size = _cached_octal(size_field)
                if member_size is None:
                    member_size = self.parse_size(size_field, pos)
                if typeflag not in _EXTENSION_TYPES:
                    override = pending_size if pending_size is not None else global_size
                    if override is not None:
                        member_size = override
                    pending_size = None
                if typeflag in (_PAX_LOCAL, _PAX_GLOBAL):
                    records = self.read_data(pos, member_size)
                    value = _parse_pax(records, self, pos).get("size")
                    if value is not None:
                        parsed = self.pax_size(value, pos)
                        if typeflag == _PAX_LOCAL:
                            pending_size = parsed
                        else:
                            global_size = parsed
                found.append(pos)
                if typeflag in _NO_DATA_TYPES:
                    member_size = 0
                pos += BLOCK + -(-member_size // BLOCK) * BLOCK
        except ShardFormatError:
            # A corrupt size field sends the walk into member data, where it fails
            # far from the cause: the header with the bad checksum is the better report.
            self.check_checksums_at([*found, pos] if pos + BLOCK <= size else found)
            raise
        return np.asarray(found, dtype=np.int64), pos

    def walk_window(self, start: int) -> tuple[npt.NDArray[np.int64] | None, int]:
        """Vectorised walk of one window starting at header ``start``.

        Returns ``(None, start)`` when the candidates do not form one chain.
        """
        first_block = start // BLOCK
        nblocks = min(_WINDOW_BLOCKS, self.size // BLOCK - first_block)
        blocks = self.data[start : start + nblocks * BLOCK].reshape(nblocks, BLOCK)
        # A cheap one-byte filter first, then the full magic on the survivors.
        candidate = np.flatnonzero(blocks[:, _MAGIC_OFFSET] == ord("u"))
        magic = blocks[candidate, _MAGIC_OFFSET + 1 : _MAGIC_OFFSET + 5]
        candidate = candidate[(magic == np.frombuffer(b"star", np.uint8)).all(axis=1)]
        if candidate.size == 0 or candidate[0] != 0:
            return None, start
        rows = blocks[candidate, 124:157]
        sizes, ok = _parse_numeric(rows[:, :12], values=True)
        if not ok.all():
            return None, start
        no_data = np.isin(rows[:, 32], np.frombuffer(_NO_DATA_TYPES, np.uint8))
        sizes = np.where(no_data, 0, sizes)
        successor = candidate + 1 + (sizes + BLOCK - 1) // BLOCK
        if not np.array_equal(successor[:-1], candidate[1:]):
            return None, start
        next_pos = start + int(successor[-1]) * BLOCK
        # The chain's last successor must leave the window or land on a zero block
        # (the end marker); anything else inside the window is not a valid header.
        if successor[-1] < nblocks and blocks[successor[-1]].any():
            return None, start
        return (start + candidate.astype(np.int64) * BLOCK), next_pos

    def parse_size(self, raw: bytes, pos: int) -> int:
        if raw[0] & 0x80:
            return _base256(raw, self, pos + 124, "size")
        value = _parse_octal(raw)
        if value is None:
            raise self.error(
                ShardFormatError,
                f"corrupt tar header: the size field {raw!r} is neither octal nor base-256",
                pos + 124,  # the field's offset, as for every other numeric field
            )
        return value

    def pax_size(self, value: str, pos: int) -> int:
        if not (value.isascii() and value.isdigit()):
            raise self.error(ShardFormatError, f"PAX header has an invalid size {value!r}", pos)
        return _check_size(int(value), self, pos)

    def read_data(self, header_pos: int, size: int) -> bytes:
        start = header_pos + BLOCK
        if start + size > self.size:
            raise self.error(
                TruncatedShardError,
                f"shard ends inside an extension header's data: needs {size} bytes from offset "
                f"{start}, file has {self.size}",
                header_pos,
            )
        return self.data[start : start + size].tobytes()

    # -- steps 2 and 3: decode and resolve -----------------------------------

    def resolve(self, offsets: npt.NDArray[np.int64], end: int) -> TarScan:
        if len(offsets) == 0:
            self.check_end(end)
            empty = np.zeros(0, np.int64)
            return TarScan([], np.zeros(0, np.uint8), empty, empty, empty, end, self.size)
        blocks = self.data[: (self.size // BLOCK) * BLOCK].reshape(-1, BLOCK)
        types_parts, sizes_parts, names = [], [], []
        # Decode in chunks so that gathering header rows never holds more than a few
        # tens of MB, whatever the member count.
        for lo in range(0, len(offsets), _DECODE_CHUNK):
            chunk = offsets[lo : lo + _DECODE_CHUNK]
            types, sizes, raw_names = self.decode_headers(blocks[chunk // BLOCK], chunk)
            types_parts.append(types)
            sizes_parts.append(sizes)
            names.extend(raw_names)
        types = np.concatenate(types_parts)
        sizes = np.concatenate(sizes_parts)
        # Only now that every checksum is known good: a corrupt size field makes the
        # walk overrun, and the bad header is the better report than a truncation.
        self.check_end(end, int(offsets[-1]))

        unsupported = np.isin(types, np.array([_GNU_SPARSE, _GNU_MULTIVOL], np.uint8))
        if unsupported.any():
            i = int(np.flatnonzero(unsupported)[0])
            what = (
                "a GNU sparse member" if types[i] == _GNU_SPARSE else "a multi-volume continuation"
            )
            raise self.error(
                UnsupportedMemberError,
                f"member {names[i]!r} is {what}; indextar cannot give random access to it "
                "(re-create the shard without --sparse / --multi-volume)",
                int(offsets[i]),
            )
        extension = np.isin(types, np.array(sorted(_EXTENSION_TYPES), np.uint8))
        if extension.any():
            return self.apply_extensions(offsets, types, sizes, names, extension, end)
        self.check_chain(offsets, sizes, end)
        return self.plain_scan(_decode_all(names, offsets, self), types, offsets, sizes, end)

    def walk_c(
        self,
    ) -> _Chain | None:
        """The C walker's chain, if it could walk the whole shard (plain headers only)."""
        walker = native.tarwalk()
        if walker is None:
            return None
        try:
            status, end, offsets, sizes, types, names = walker.walk(self.buf, self.fd)
        except OSError as e:
            raise IndextarError(f"cannot read shard {self.shard!r}: {e.strerror}") from e
        if status == 2:
            raise IndextarError(
                f"shard {self.shard!r} changed while it was being indexed: it now ends "
                f"before byte {end + BLOCK}"
            )
        if status != 0 or offsets is None or sizes is None or types is None:
            return None  # something unusual: the numpy scanner takes over
        return (
            np.frombuffer(offsets, np.int64),
            np.frombuffer(sizes, np.int64),
            np.frombuffer(types, np.uint8).copy(),
            end,
            names,
        )

    def resolve_plain(
        self,
        offsets: npt.NDArray[np.int64],
        sizes: npt.NDArray[np.int64],
        types: npt.NDArray[np.uint8],
        end: int,
        decoded: list[str] | None,
    ) -> TarScan:
        """A :class:`TarScan` from a chain the C walker checked (no extension headers)."""
        self.check_end(end, int(offsets[-1]) if len(offsets) else 0)
        if decoded is not None:  # all valid UTF-8: only V7 directories are left to mark
            for i in np.flatnonzero(types == 0).tolist():
                if decoded[i].endswith("/"):
                    types[i] = ord("5")
            return self.plain_scan(decoded, types, offsets, sizes, end)
        blocks = self.data[: (self.size // BLOCK) * BLOCK].reshape(-1, BLOCK)
        names = _names_at(blocks, offsets // BLOCK, types)
        return self.plain_scan(_decode_all(names, offsets, self), types, offsets, sizes, end)

    def plain_scan(
        self,
        names: list[str],
        types: npt.NDArray[np.uint8],
        offsets: npt.NDArray[np.int64],
        sizes: npt.NDArray[np.int64],
        end: int,
    ) -> TarScan:
        """The scan of a shard without extension headers: one header per entry."""
        return TarScan(
            names=names,
            types=types,
            header_offsets=offsets,
            data_offsets=offsets + BLOCK,
            sizes=sizes,
            end_offset=end,
            file_size=self.size,
        )

    def decode_headers(
        self, rows: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], list[bytes]]:
        """Check and decode a batch of header blocks: types, data sizes, raw names."""
        sizes, stored_sums, canonical = _canonical_numbers(rows)
        self.check_checksums(rows, offsets, (stored_sums, canonical))
        for i in np.flatnonzero(~canonical):  # rare: other layouts, base-256, or corrupt
            for name, (start, width) in _FIELDS.items():
                raw = rows[i, start : start + width].tobytes()
                value = _parse_octal(raw)
                if value is None:
                    value = _base256(raw, self, int(offsets[i]) + start, name)
                if name == "size":
                    sizes[i] = value
        types = rows[:, 156].copy()
        sizes = np.where(np.isin(types, np.frombuffer(_NO_DATA_TYPES, np.uint8)), 0, sizes)
        return types, sizes, _decode_names(rows, types)

    def check_checksums(
        self,
        rows: npt.NDArray[np.uint8],
        offsets: npt.NDArray[np.int64],
        parsed: tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]] | None = None,
    ) -> None:
        """Raise for the first header row (at ``offsets``) whose checksum is wrong.

        ``parsed`` passes the stored checksums and canonical mask if already computed.
        """
        good = _checksums_ok(rows, parsed)
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
        if offsets:
            rows = self.data[np.add.outer(np.asarray(offsets, np.int64), np.arange(BLOCK))]
            self.check_checksums(rows, np.asarray(offsets, np.int64))

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
                f"non-zero data after the end-of-archive marker at offset {end} "
                "(a zeroed header, or concatenated archives, which are not supported)",
                where,
            )

    def bad_numeric(self, name: str, raw: bytes, where: int) -> None:
        raise self.error(
            ShardFormatError,
            f"corrupt tar header: the {name} field {raw!r} is neither octal nor base-256",
            where,
        )

    def check_chain(
        self, offsets: npt.NDArray[np.int64], sizes: npt.NDArray[Any], end: int
    ) -> None:
        successor = offsets + BLOCK + (sizes + BLOCK - 1) // BLOCK * BLOCK
        expected = np.append(offsets[1:], end)
        if not np.array_equal(successor, expected):
            i = int(np.flatnonzero(successor != expected)[0])
            raise _ChainMismatch(int(offsets[i]))

    def apply_extensions(
        self,
        offsets: npt.NDArray[np.int64],
        types: npt.NDArray[np.uint8],
        sizes: npt.NDArray[Any],
        raw_names: list[bytes],
        extension: npt.NDArray[np.bool_],
        end: int,
    ) -> TarScan:
        """Fold GNU and PAX extension headers into the entries they describe."""
        keep = np.flatnonzero(~extension)
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
            if t in _EXTENSION_TYPES:
                if first_header is None:
                    first_header = pos
                payload = self.read_data(pos, int(sizes[i]))
                if t == _GNU_LONGNAME:
                    # As GNU tar: the name runs to its NUL, even past the size into the
                    # padding (the chain guarantees the padded blocks are in the file).
                    padded = -(-int(sizes[i]) // BLOCK) * BLOCK
                    payload = self.read_data(pos, padded) + b"\0"
                    pending_name = _decode_name(payload.split(b"\0", 1)[0], pos, self)
                elif t == _PAX_LOCAL:
                    pending.update(_parse_pax(payload, self, pos))
                elif t == _PAX_GLOBAL:
                    global_pax.update(_parse_pax(payload, self, pos))
                continue
            pax = {**global_pax, **pending} if global_pax else pending
            if "GNU.sparse.major" in pax or "GNU.sparse.size" in pax or "GNU.sparse.map" in pax:
                raise self.error(
                    UnsupportedMemberError,
                    f"member {pax.get('path', raw_names[i])!r} is a PAX sparse file; indextar "
                    "cannot give random access to it (re-create the shard without --sparse)",
                    first_header if first_header is not None else pos,
                )
            name: str
            if "path" in pax:
                name = pax["path"]
                if "\0" in name:  # GNU tar would cut it there; no file can be named so
                    raise self.error(
                        ShardFormatError,
                        f"PAX path {name!r} contains a NUL byte",
                        first_header if first_header is not None else pos,
                    )
            elif pending_name is not None:
                name = pending_name
            else:
                name = _decode_name(raw_names[i], pos, self)
            if types[i] == 0 and name.endswith("/"):
                types[i] = ord("5")
            if "size" in pax and types[i] not in np.frombuffer(_NO_DATA_TYPES, np.uint8):
                sizes[i] = self.pax_size(pax["size"], pos)
            if first_header is not None:
                header_offsets[i] = first_header
            names.append(name)
            pending, pending_name, first_header = {}, None, None
        if first_header is not None:
            raise self.error(
                ShardFormatError,
                "an extension header (GNU long name or PAX) is not followed by a member",
                first_header,
            )
        self.check_chain(offsets, sizes, end)
        return TarScan(
            names=names,
            types=types[keep],
            header_offsets=header_offsets[keep],
            data_offsets=offsets[keep] + BLOCK,
            sizes=sizes[keep],
            end_offset=end,
            file_size=self.size,
            extension_headers=int(extension.sum()),
        )


class _ChainMismatch(Exception):
    """The walk's chain disagrees with the decoded sizes; walk again sequentially."""

    def __init__(self, offset: int):
        super().__init__(offset)
        self.offset = offset


def _decompress_command(tool: str, suffixes: tuple[str, ...], shard: str) -> str:
    """A shell command that turns the compressed ``shard`` into a plain tar.

    ``gunzip`` and friends refuse names without their suffix, and compressed shards
    are often named ``.tar``: ``tool -dc`` works whatever the name.
    """
    quote = shlex.quote
    for suffix in suffixes:
        if shard.endswith(suffix) and len(shard) > len(suffix):
            plain = shard[: -len(suffix)] + (".tar" if suffix == ".tgz" else "")
            return f"{tool} -dc {quote(shard)} > {quote(plain)}"
    tmp = shard + ".tmp"
    return f"{tool} -dc {quote(shard)} > {quote(tmp)} && mv {quote(tmp)} {quote(shard)}"


def _base256(raw: bytes, scanner: _Scanner, where: int, name: str) -> int:
    if raw[0] not in (0x80, 0xFF):
        scanner.bad_numeric(name, raw, where)
    value = int.from_bytes(raw[1:], "big")
    if raw[0] == 0xFF:
        value -= 1 << (8 * (len(raw) - 1))
    if value < 0 and name == "size":
        raise scanner.error(ShardFormatError, f"corrupt tar header: negative size {value}", where)
    return _check_size(value, scanner, where) if name == "size" else value


def _check_size(value: int, scanner: _Scanner, where: int) -> int:
    if value > _MAX_MEMBER_SIZE:
        raise scanner.error(
            ShardFormatError,
            f"corrupt tar header: a member size of {value} bytes is more than any shard "
            f"holds (at most {_MAX_MEMBER_SIZE})",
            where,
        )
    return value


def _decode_name(raw: bytes, where: int, scanner: _Scanner) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise scanner.error(
            ShardFormatError,
            f"member name {raw!r} is not valid UTF-8 ({e.reason} at byte {e.start})",
            where,
        ) from None


def _decode_all(
    raw_names: list[bytes], offsets: npt.NDArray[np.int64], scanner: _Scanner
) -> list[str]:
    try:
        return [raw.decode("utf-8") for raw in raw_names]
    except UnicodeDecodeError:
        return [_decode_name(raw, int(offsets[i]), scanner) for i, raw in enumerate(raw_names)]


def _parse_pax(payload: bytes, scanner: _Scanner, where: int) -> dict[str, str]:
    """Parse PAX records: ``"%d %s=%s\\n" % (length, key, value)``."""
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
            raise scanner.error(
                ShardFormatError,
                f"malformed PAX record {payload[pos : pos + 40]!r} in extended header",
                where,
            )
        key, _, value = record[space - pos + 1 : -1].partition(b"=")
        try:
            records[key.decode("utf-8")] = value.decode("utf-8")
        except UnicodeDecodeError:
            raise scanner.error(
                ShardFormatError, f"PAX record {key!r} is not valid UTF-8", where
            ) from None
        if key == b"size":  # every size record must be valid, not only the last one
            scanner.pax_size(records["size"], where)
        pos += length
    return records
