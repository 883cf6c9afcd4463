"""Scan an uncompressed tar held in memory (bytes or an mmap) into its members.

No SQLite and no torch here: this module only turns bytes into arrays.

How the scan works
------------------
A tar is a chain of 512-byte header blocks, each followed by its member's data
rounded up to whole blocks. Finding the chain is inherently sequential, so the
scan proceeds in three steps:

1. **Walk.** Find the offset of every header block (:mod:`indextar.tar.walk`). The
   *sequential* walker reads one header at a time and jumps over the data, which is
   what large members want; the *vectorised* walker checks every block of a window
   at once, which pays off on dense shards. The scan starts sequentially and
   switches to the vectorised walker once the members it has seen are small on
   average. Where the C walker (:mod:`indextar.tar.extensions`) is built it goes first: it
   folds the PAX headers that change nothing recorded (a lone ``mtime``, as tarfile
   and webdataset write for every member), and hands back any shard with other
   extension headers or anything unusual.
2. **Decode.** All header blocks are gathered into one ``(n, 512)`` array and
   checked at once: checksums (unsigned or signed, as strict readers accept),
   numeric fields (octal or base-256), names (ending at their first NUL), the
   ustar ``prefix`` field and type flags.
3. **Resolve.** GNU long-name (``L``/``K``) and PAX (``x``/``g``) extension
   headers are applied to the member they precede (:mod:`indextar.tar.ext`). The
   final sizes are checked against the chain found in step 1; a mismatch (possible
   only when an extension header changes a size) means the walk is redone
   sequentially with full knowledge of the extension headers.

The checks that point into the shard's bytes are in :mod:`indextar.tar.blocks`.
The result is a :class:`TarScan`: parallel numpy arrays plus the member names.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import CompressedShardError, IndextarError, ShardFormatError, TruncatedShardError
from .blocks import BLOCK as BLOCK
from .blocks import NO_DATA_TYPES, REGULAR_TYPES, ShardBytes, header_number
from .compress import compressed_message, sniff_compression
from .ext import EXTENSION_TYPES, fold_extensions
from .extensions import tarwalk
from .fields import FIELDS, canonical_numbers, checksums_ok, decode_names, names_at
from .sparse import GNU_MULTIVOL, GNU_SPARSE, unsupported_member_error
from .walk import walk_adaptive, walk_parts, walk_sequential
from .walk import walk_window as _walk_window

__all__ = [
    "TarScan",
    "Scanner",
    "scan_tar",
    "MEMBER_KINDS",
    "entry_kind",
    "sniff_compression",
]

log = logging.getLogger(__name__)

#: What each skipped type flag is reported as.
MEMBER_KINDS: dict[int, str] = {
    ord("1"): "hardlink",
    ord("2"): "symlink",
    ord("3"): "chardev",
    ord("4"): "blockdev",
    ord("5"): "directory",
    ord("6"): "fifo",
    ord("V"): "volume-header",
}


def entry_kind(typeflag: int) -> str:
    """What an entry of type flag ``typeflag`` is: ``"file"``, ``"directory"``, ..."""
    if typeflag in REGULAR_TYPES:
        return "file"
    return MEMBER_KINDS.get(typeflag, f"type-{chr(typeflag)!r}")


# The adaptive walk (walk.walk_adaptive) switches to the vectorised walker once members
# average under this many bytes: it reads every block, which only pays off when headers
# are dense.
_DENSE_MEMBER_BYTES = 16 * 1024
_PROBE_HEADERS = 64
_WINDOW_BLOCKS = 1 << 16  # 32 MiB per vectorised window
_DECODE_CHUNK = 1 << 15  # header rows decoded at once (16 MiB)


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
        return np.isin(self.types, np.array(sorted(REGULAR_TYPES), dtype=np.uint8))

    def kind(self, i: int) -> str:
        """What entry ``i`` is: ``"file"``, ``"directory"``, ``"symlink"``, ..."""
        return entry_kind(int(self.types[i]))


def scan_tar(
    buf: Any, *, shard: str | None = None, fd: int | None = None, ignore_zeros: bool = False
) -> TarScan:
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
    ignore_zeros
        As GNU tar's ``--ignore-zeros``: read on past zero blocks, so that every member
        of concatenated archives (``cat a.tar b.tar``) is found. Otherwise anything but
        zeros after the first end-of-archive marker is an error.

    Raises
    ------
    ShardFormatError
        On any malformed header, with the byte offset (subclasses
        :class:`TruncatedShardError`, :class:`CompressedShardError`,
        :class:`UnsupportedMemberError` say more).
    """
    scanner = Scanner(buf, shard, -1 if fd is None else fd)
    scanner.ignore_zeros = ignore_zeros
    return scanner.scan()


@dataclass(frozen=True, slots=True)
class _Chain:
    """The C walker's chain: per member its own header's offset, its start (at its first
    PAX header, if any), size and type; the end marker's offset; the names decoded (or
    ``None`` if one is not UTF-8); how many PAX headers it folded."""

    offsets: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    sizes: npt.NDArray[np.int64]
    types: npt.NDArray[np.uint8]
    end: int
    names: list[str] | None
    extension_headers: int


class Scanner(ShardBytes):
    """One scan of one shard: :func:`scan_tar`'s working state, and the steps that
    :mod:`indextar.tar.streamscan` runs over a shard as it streams past."""

    ignore_zeros = False
    remote = False  # the shard is a URL (its compressed-shard hint says so)

    # -- entry point --------------------------------------------------------

    def scan(self) -> TarScan:
        self.check_start()
        chain = self.walk_c()
        if chain is not None and not (self.ignore_zeros and self.next_part(chain.end) is not None):
            return self.resolve_c(chain)
        try:
            offsets, end = walk_parts(self, self.walk_fast, ignore_zeros=self.ignore_zeros)
            return self.resolve(offsets, end)
        except (_ChainMismatch, ShardFormatError):
            # The fast walk can be misled where extension headers change sizes, or stop
            # at a point where a sequential walk reports the problem better. The
            # sequential walk is the reference: its result, or its error, stands.
            log.debug("%s: walking sequentially", self.shard)
        return self.scan_sequentially()

    def scan_sequentially(self) -> TarScan:
        """The reference scan: the sequential walk, then :meth:`resolve`; its chain stands."""
        walk = functools.partial(walk_sequential, self, limit=self.size)
        offsets, end = walk_parts(self, walk, ignore_zeros=self.ignore_zeros)
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
        compressed = compressed_message(self.data[:8].tobytes(), self.shard, remote=self.remote)
        if compressed is not None:
            raise self.error(CompressedShardError, compressed, 0)
        if self.size < BLOCK:
            raise self.error(
                TruncatedShardError,
                f"file has {self.size} bytes, less than one 512-byte tar header",
                0,
            )
        first = self.data[:BLOCK].reshape(1, BLOCK)
        if first.any() and not checksums_ok(first).all():
            raise self.error(
                ShardFormatError,
                "not a tar archive: the first 512 bytes are not a valid tar header "
                "(checksum mismatch)",
                0,
            )

    # -- step 1: the walk ---------------------------------------------------

    def walk_fast(self, start: int) -> tuple[npt.NDArray[np.int64], int]:
        """Header offsets from ``start`` and the end-of-archive offset, the walkers chosen
        as the members turn out (:func:`~indextar.tar.walk.walk_adaptive`)."""
        return walk_adaptive(
            self,
            start,
            window=self.walk_window,
            probe_headers=_PROBE_HEADERS,
            dense_member_bytes=_DENSE_MEMBER_BYTES,
        )

    def walk_window(self, start: int) -> tuple[npt.NDArray[np.int64] | None, int]:
        """Vectorised walk of one window starting at header ``start``.

        Returns ``(None, start)`` when the candidates do not form one chain.
        """
        return _walk_window(self, start, window_blocks=_WINDOW_BLOCKS)

    # -- steps 2 and 3: decode and resolve -----------------------------------

    def resolve(self, offsets: npt.NDArray[np.int64], end: int) -> TarScan:
        if len(offsets) == 0:
            self.check_end(end)
            empty = np.zeros(0, np.int64)
            return TarScan([], np.zeros(0, np.uint8), empty, empty, empty, end, self.size)
        types_parts, sizes_parts, names = [], [], []
        # Decode in chunks so that gathering header rows never holds more than a few
        # tens of MB, whatever the member count.
        for lo in range(0, len(offsets), _DECODE_CHUNK):
            chunk = offsets[lo : lo + _DECODE_CHUNK]
            types, sizes, raw_names = self.decode_headers(self.blocks[chunk // BLOCK], chunk)
            types_parts.append(types)
            sizes_parts.append(sizes)
            names.extend(raw_names)
        types = np.concatenate(types_parts)
        sizes = np.concatenate(sizes_parts)
        # Only now that every checksum is known good: a corrupt size field makes the
        # walk overrun, and the bad header is the better report than a truncation.
        self.check_end(end, int(offsets[-1]))

        unsupported = np.isin(types, np.array([GNU_SPARSE, GNU_MULTIVOL], np.uint8))
        if unsupported.any():
            i = int(np.flatnonzero(unsupported)[0])
            raise unsupported_member_error(self, offsets, types, sizes, names, i)
        extension = np.isin(types, np.array(sorted(EXTENSION_TYPES), np.uint8))
        if extension.any():
            return self.resolve_extensions(offsets, types, sizes, names, extension, end)
        self.check_chain(offsets, sizes, end)
        return self.plain_scan(self.decode_all(names), types, offsets, sizes, end)

    def walk_c(self) -> _Chain | None:
        """The C walker's chain, if it could walk the whole shard (plain headers, and PAX
        headers whose records change nothing recorded)."""
        walker = tarwalk()
        if walker is None:
            return None
        try:
            status, end, offsets, starts, sizes, types, names, extensions = walker.walk(
                self.buf, self.fd
            )
        except OSError as e:
            raise IndextarError(f"cannot read shard {self.shard!r}: {e.strerror}") from e
        if status == 2:
            raise IndextarError(
                f"shard {self.shard!r} changed while it was being indexed: it now ends "
                f"before byte {end + BLOCK}"
            )
        if status != 0 or offsets is None or sizes is None or types is None:
            return None  # something unusual: the numpy scanner takes over
        member_offsets = np.frombuffer(offsets, np.int64)
        return _Chain(
            offsets=member_offsets,
            starts=member_offsets if starts is None else np.frombuffer(starts, np.int64),
            sizes=np.frombuffer(sizes, np.int64),
            types=np.frombuffer(types, np.uint8).copy(),
            end=end,
            names=names,
            extension_headers=extensions,
        )

    def resolve_c(self, chain: _Chain) -> TarScan:
        """A :class:`TarScan` from a chain the C walker checked."""
        offsets, types = chain.offsets, chain.types
        self.check_end(chain.end, int(offsets[-1]) if len(offsets) else 0)
        if chain.names is not None:  # all valid UTF-8: only V7 directories are left to mark
            names = chain.names
            for i in np.flatnonzero(types == 0).tolist():
                if names[i].endswith("/"):
                    types[i] = ord("5")
        else:
            names = self.decode_all(names_at(self.blocks, offsets // BLOCK, types))
        return TarScan(
            names=names,
            types=types,
            header_offsets=chain.starts,
            data_offsets=offsets + BLOCK,
            sizes=chain.sizes,
            end_offset=chain.end,
            file_size=self.size,
            extension_headers=chain.extension_headers,
        )

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
        sizes, stored_sums, canonical = canonical_numbers(rows)
        self.check_checksums(rows, offsets, (stored_sums, canonical))
        for i in np.flatnonzero(~canonical):  # rare: other layouts, base-256, or corrupt
            for name, (start, width) in FIELDS.items():
                raw = rows[i, start : start + width].tobytes()
                value = header_number(raw, name, self.shard, int(offsets[i]) + start)
                if name == "size":
                    sizes[i] = value
        types = rows[:, 156].copy()
        sizes = np.where(np.isin(types, np.frombuffer(NO_DATA_TYPES, np.uint8)), 0, sizes)
        return types, sizes, decode_names(rows, types)

    def check_chain(
        self, offsets: npt.NDArray[np.int64], sizes: npt.NDArray[Any], end: int
    ) -> None:
        successor = offsets + BLOCK + (sizes + BLOCK - 1) // BLOCK * BLOCK
        expected = np.append(offsets[1:], end)
        if not np.array_equal(successor, expected):
            for i in np.flatnonzero(successor != expected).tolist():
                # With ignore_zeros, zero blocks (end markers of the parts) may lie between.
                gap = self.data[successor[i] : expected[i]]
                if not (self.ignore_zeros and successor[i] < expected[i] and not gap.any()):
                    raise _ChainMismatch(int(offsets[i]))

    def resolve_extensions(
        self,
        offsets: npt.NDArray[np.int64],
        types: npt.NDArray[np.uint8],
        sizes: npt.NDArray[Any],
        raw_names: list[bytes],
        extension: npt.NDArray[np.bool_],
        end: int,
    ) -> TarScan:
        """The scan of a shard with extension headers, folded into their entries."""
        folded = fold_extensions(self, offsets, types, sizes, raw_names)
        self.check_chain(offsets, folded.sizes, end)
        keep = np.flatnonzero(~extension)
        return TarScan(
            names=folded.names,
            types=types[keep],
            header_offsets=folded.header_offsets[keep],
            data_offsets=offsets[keep] + BLOCK,
            sizes=folded.sizes[keep],
            end_offset=end,
            file_size=self.size,
            extension_headers=int(extension.sum()),
        )


class _ChainMismatch(Exception):
    """The walk's chain disagrees with the decoded sizes; walk again sequentially."""

    def __init__(self, offset: int):
        super().__init__(offset)
        self.offset = offset
