"""Scan a tar as its bytes go past, front to back: :func:`scan_tar`'s result, no copy.

A remote shard is indexed from one sequential read (or from ranged reads of its
headers alone), without a temporary file. :func:`scan_stream` runs the scanner's own
reference path over the stream: the sequential walk
(:func:`~indextar.tar.walk.walk_sequential`) and the scan's decode and resolve steps
(:class:`~indextar.tar.scan.Scanner`), which read the shard's bytes only through
:class:`StreamedBytes`. That view hands them the blocks they ask for, reading forward
from a :class:`BlockReader` and skipping what nobody asks for, so the members, and
the errors with their class and offset, are :func:`scan_tar`'s by construction.

What is kept: every block a step read (the headers, extension headers' data, the
end marker), the first and last ``edges`` bytes (the index's content fingerprint),
and whether skipped stretches between archive parts were zeros. Member data is
skipped. Memory is the reader's window plus 512 bytes per header.

The only reads not kept exactly are long stretches read to find their first
non-zero byte (the bytes after the end marker): the view holds them as zeros up to
that byte, which is all the scanner asks of them (``any``, the first non-zero).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO, Protocol

import numpy as np
import numpy.typing as npt

from ..errors import TruncatedShardError
from .blocks import BLOCK
from .ext import GNU_LONGNAME
from .fields import parse_number
from .scan import Scanner, TarScan

__all__ = ["BlockReader", "FileReader", "StreamedBytes", "scan_stream"]

# Reads longer than this that run past the reader are searched for their first
# non-zero byte instead of being held (the bytes after an end marker).
_EXACT_LIMIT = 16 << 20
_SEARCH_CHUNK = 1 << 20


class BlockReader(Protocol):
    """Bytes front to back: what :class:`StreamedBytes` reads a shard from."""

    def read(self, length: int) -> bytes:
        """The next ``length`` bytes; fewer only where the object ends."""
        ...

    def skip(self, length: int) -> None:
        """Pass over the next ``length`` bytes (a stream reads them; ranged reads jump)."""
        ...


class FileReader:
    """A :class:`BlockReader` over a file object read front to back (no seeks)."""

    def __init__(self, stream: BinaryIO, *, skip_buffer: int = 1 << 20):
        self.stream = stream
        self._scratch = bytearray(skip_buffer)

    def read(self, length: int) -> bytes:
        parts: list[bytes] = []
        wanted = length
        while wanted > 0:
            part = self.stream.read(wanted)
            if not part:
                break
            parts.append(part)
            wanted -= len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def skip(self, length: int) -> None:
        view = memoryview(self._scratch)
        while length > 0:
            n = self.stream.readinto(view[: min(length, len(view))])  # type: ignore[attr-defined]
            if not n:
                return  # the view reports the short object
            length -= n


class StreamedBytes:
    """A shard's bytes read forward from ``reader``, keeping the blocks that were asked for.

    ``size`` is the object's size. Bytes behind the reader must have been kept;
    asking for other bytes behind it is a bug in the caller (``LookupError``).
    ``remote``: ``shard`` is a URL, which a compressed shard's hint then speaks of.
    """

    def __init__(
        self,
        reader: BlockReader,
        size: int,
        *,
        shard: str | None,
        edges: int = 0,
        remote: bool = False,
    ):
        self.reader = reader
        self.size = size
        self.shard = shard
        self.remote = remote
        self.position = 0  # how far the reader has gone
        self._blocks: dict[int, bytes] = {}  # block number -> its bytes (the last may be short)
        self._zeros: list[tuple[int, int]] = []  # stretches passed and known to be zero
        # Ranges kept whatever reads them: the fingerprint's edges, GNU long names' data.
        self._keep: list[tuple[int, int]] = []
        if edges:
            self._keep += [(0, min(edges, size)), (max(0, size - edges), size)]
        self.edges = edges

    # -- moving the reader ---------------------------------------------------

    def _fill(self, upto: int, *, keep_all: bool) -> None:
        """Move the reader to ``upto`` (block-aligned or the end), keeping what is wanted."""
        upto = min(upto, self.size)
        # Ranges passed go: a shard of long names adds one each, and would cost O(n^2).
        self._keep = [(a, b) for a, b in self._keep if b > self.position]
        while self.position < upto:
            start = self.position
            kept = [(a, b) for a, b in self._keep if b > start and a < upto]
            if keep_all:
                self._take(start, upto)
            elif not kept:
                self.reader.skip(upto - start)
                self.position = upto
            else:
                first = max(start, min(a for a, _ in kept) // BLOCK * BLOCK)
                if first > start:
                    self.reader.skip(first - start)
                    self.position = first
                ends = [b for a, b in kept if a < first + BLOCK]
                last = min(upto, -(-max(ends) // BLOCK) * BLOCK)
                self._take(first, max(last, first + BLOCK))

    def _take(self, start: int, end: int) -> None:
        end = min(end, self.size)
        data = self.reader.read(end - start)
        if len(data) != end - start:
            raise TruncatedShardError(
                f"the stream ended at byte {start + len(data)}, but the object has "
                f"{self.size} bytes (it changed or the connection was cut)",
                shard=self.shard,
                offset=start + len(data),
            )
        for at in range(0, len(data), BLOCK):
            self._blocks[(start + at) // BLOCK] = data[at : at + BLOCK]
        self.position = end

    def keep(self, start: int, end: int) -> None:
        """Keep ``[start, end)`` when the reader passes it."""
        if end > start:
            self._keep.append((start, min(end, self.size)))

    # -- reads ----------------------------------------------------------------

    def read(self, start: int, end: int) -> bytes:
        """The bytes ``[start, end)`` (``end`` at most the size), read if still ahead."""
        end = min(end, self.size)
        if end <= start:
            return b""
        if end > self.position:
            first = max(self.position, start // BLOCK * BLOCK)
            if first > self.position:
                self._fill(first, keep_all=False)
            self._fill(-(-end // BLOCK) * BLOCK, keep_all=True)
        return b"".join(self._pieces(start, end))

    def _pieces(self, start: int, end: int) -> Iterator[bytes]:
        block = start // BLOCK
        while block * BLOCK < end:
            lo, hi = max(start, block * BLOCK), min(end, block * BLOCK + BLOCK)
            data = self._blocks.get(block)
            if data is not None:
                yield data[lo - block * BLOCK : hi - block * BLOCK]
            elif any(a <= lo and hi <= b for a, b in self._zeros):
                yield bytes(hi - lo)
            else:
                raise LookupError(f"bytes {lo}-{hi} of {self.shard!r} were passed, not kept")
            block += 1

    def first_nonzero(self, start: int, end: int) -> int | None:
        """The offset of the first non-zero byte in ``[start, end)``, or None; the zero
        stretch read ahead is remembered, not kept, and the block found is kept."""
        end = min(end, self.size)
        pos = start
        while pos < end and pos < self.position:  # the part already passed
            stop = min(end, self.position, (pos // BLOCK + 1) * BLOCK)
            piece = self.read(pos, stop)
            if piece.strip(b"\0"):
                return pos + len(piece) - len(piece.lstrip(b"\0"))
            pos = stop
        if pos >= end:
            return None
        self._fill(pos // BLOCK * BLOCK, keep_all=False)
        pos = self.position
        while pos < end:
            stop = min(end, pos + _SEARCH_CHUNK)
            data = self.reader.read(stop - pos)
            if len(data) != stop - pos:
                self._take(pos + len(data), stop)  # raises: the stream is short
            stripped = data.lstrip(b"\0")
            if stripped:
                found = pos + len(data) - len(stripped)
                zero_end = found // BLOCK * BLOCK
                if zero_end > pos:
                    self._zeros.append((pos, zero_end))
                for at in range(zero_end - pos, len(data), BLOCK):
                    self._blocks[(pos + at) // BLOCK] = data[at : at + BLOCK]
                self.position = stop
                return found
            self._zeros.append((pos, stop))
            pos = self.position = stop
        return None

    def finish(self) -> None:
        """Read on to the end of the object (its last ``edges`` bytes are kept)."""
        self._fill(self.size, keep_all=False)

    def head(self) -> bytes:
        """The first ``edges`` bytes."""
        return self.read(0, self.edges)

    def tail(self) -> bytes:
        """The last ``edges`` bytes (after :meth:`finish`)."""
        return self.read(max(0, self.size - self.edges), self.size)


class _Raw:
    """``raw[...]`` as the walk reads it: bytes by slice, an int by index."""

    def __init__(self, view: StreamedBytes):
        self.view = view

    def __getitem__(self, item: int | slice) -> Any:
        if isinstance(item, slice):
            start, stop = item.start or 0, self.view.size if item.stop is None else item.stop
            data = self.view.read(start, stop)
            if stop - start == BLOCK and start % BLOCK == 0 and len(data) == BLOCK:
                self._keep_long_name(start, data)
            return data
        return self.view.read(item, item + 1)[0]

    def _keep_long_name(self, start: int, header: bytes) -> None:
        # The walk steps over a GNU long name's data; the fold reads it later.
        if header[156] == GNU_LONGNAME:
            size = parse_number(header[124:136])
            if size is not None and size > 0:
                self.view.keep(start + BLOCK, start + BLOCK + -(-size // BLOCK) * BLOCK)


class _Data:
    """``data[a:b]`` as the scan reads it: a numpy array of the bytes."""

    def __init__(self, view: StreamedBytes):
        self.view = view

    def __getitem__(self, item: slice) -> npt.NDArray[np.uint8]:
        start = item.start or 0
        stop = self.view.size if item.stop is None else min(item.stop, self.view.size)
        if stop - start <= _EXACT_LIMIT or stop <= self.view.position:
            return np.frombuffer(self.view.read(start, stop), np.uint8)
        # The rest of a shard after its end marker: only its first non-zero byte matters.
        found = self.view.first_nonzero(start, stop)
        if found is None:
            return np.zeros(0, np.uint8)
        held = np.zeros(found - start + 1, np.uint8)
        held[-1] = self.view.read(found, found + 1)[0]
        return held


class _Blocks:
    """``blocks[...]``: header rows by block number (an int or an array of them)."""

    def __init__(self, view: StreamedBytes):
        self.view = view

    def __len__(self) -> int:
        return self.view.size // BLOCK

    def __getitem__(self, item: Any) -> npt.NDArray[np.uint8]:
        read = self.view.read
        if isinstance(item, (int, np.integer)):
            return np.frombuffer(read(int(item) * BLOCK, int(item) * BLOCK + BLOCK), np.uint8)
        numbers = np.asarray(item, np.int64).tolist()
        rows = b"".join([read(n * BLOCK, n * BLOCK + BLOCK) for n in numbers])
        return np.frombuffer(rows, np.uint8).reshape(-1, BLOCK)


class _StreamScanner(Scanner):
    """:class:`~indextar.tar.scan.Scanner` over a :class:`StreamedBytes`."""

    def __init__(self, view: StreamedBytes):  # not ShardBytes.__init__: there is no buffer
        self.view = view
        self.buf = None
        self.fd = -1
        self.shard = view.shard
        self.remote = view.remote
        self.size = view.size
        self.raw = _Raw(view)  # type: ignore[assignment]
        self.data = _Data(view)  # type: ignore[assignment]
        self.blocks = _Blocks(view)  # type: ignore[assignment]

    def next_part(self, end: int) -> int | None:
        if end % BLOCK or end >= (self.size // BLOCK) * BLOCK:
            return None
        found = self.view.first_nonzero(end, (self.size // BLOCK) * BLOCK)
        return None if found is None else found // BLOCK * BLOCK

    def scan(self) -> TarScan:
        self.check_start()
        return self.scan_sequentially()


def scan_stream(view: StreamedBytes, *, ignore_zeros: bool = False) -> TarScan:
    """Scan the shard ``view`` reads: :func:`~indextar.tar.scan.scan_tar`'s result or error.

    Afterwards ``view`` still holds the headers (:meth:`StreamedBytes.read` them, as
    the index's span check does); call :meth:`StreamedBytes.finish` for its tail.

    Raises
    ------
    ShardFormatError
        As :func:`~indextar.tar.scan.scan_tar`, with the same class and offset;
        :class:`TruncatedShardError` also if the stream ends before ``view.size``.
    """
    scanner = _StreamScanner(view)
    scanner.ignore_zeros = ignore_zeros
    return scanner.scan()
