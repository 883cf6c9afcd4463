"""A byte source read front to back, streamed or by ranged reads of what is asked for.

:class:`ForwardReader` is what a scan of a remote shard reads from (``read`` the next
bytes, ``skip`` some). It fetches in one of two ways:

``"stream"``
    every byte, in sequential prefetched chunks (:class:`~indextar.source.stream.RemoteStream`):
    right where members are small, and headers come every few KiB;
``"ranged"``
    only the bytes asked for, one ranged read each (at least ``min_read`` bytes): right
    where members are large (video), and a round trip per header costs less than
    streaming the data between headers.

``"auto"`` reads the first ``probe_bytes`` in one request, then decides once, when a
read or skip first goes past them: ranged if the stretches skipped so far (each one
a member's data) average ``ranged_member_bytes`` or more, streamed otherwise.
"""

from __future__ import annotations

import logging
from typing import Literal

from .base import ByteSource
from .stream import RemoteStream

__all__ = ["ForwardReader", "ScanMode", "RANGED_MEMBER_BYTES"]

log = logging.getLogger(__name__)

ScanMode = Literal["auto", "stream", "ranged"]

#: Members averaging this many bytes or more are skipped with ranged reads: at about
#: 10 ms a request and 100 MB/s a stream, streaming past 1 MiB costs as much as a
#: request; above, jumping wins, and below, streaming does.
RANGED_MEMBER_BYTES = 1 << 20


class ForwardReader:
    """``source`` read front to back: ``read(n)`` the next bytes, ``skip(n)`` some.

    ``bytes_fetched`` counts the bytes fetched from the source; ``mode`` is the one
    chosen (``"auto"`` until then).
    """

    def __init__(
        self,
        source: ByteSource,
        *,
        mode: ScanMode = "auto",
        probe_bytes: int = 64 << 10,
        min_read: int = 1024,
        ranged_member_bytes: int = RANGED_MEMBER_BYTES,
    ):
        if mode not in ("auto", "stream", "ranged"):
            raise ValueError(f"mode must be 'auto', 'stream' or 'ranged', not {mode!r}")
        self.source = source
        self.size = source.size
        self.mode: ScanMode = mode
        self.min_read = min_read
        self.ranged_member_bytes = ranged_member_bytes
        self.position = 0
        self.fetched = 0
        self._buffer = b""  # bytes [_buffer_start, _buffer_start + len(_buffer))
        self._buffer_start = 0
        self._stream: RemoteStream | None = None
        self._skips = 0
        self._skipped = 0
        if mode == "auto":
            self._fetch(0, min(probe_bytes, self.size))
            if len(self._buffer) == self.size:
                self.mode = "stream"  # the probe read it all, in one request

    # -- the reader's two calls -----------------------------------------------------

    def read(self, length: int) -> bytes:
        length = max(0, min(length, self.size - self.position))
        parts = []
        while length > 0:
            part = self._from_buffer(length)
            if not part:
                self._refill(length)
                part = self._from_buffer(length)
                if not part:
                    break
            parts.append(part)
            length -= len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def skip(self, length: int) -> None:
        length = max(0, min(length, self.size - self.position))
        self._skips += 1
        self._skipped += length
        buffered = self._buffer_start + len(self._buffer) - self.position
        if length <= buffered:
            self.position += length
            return
        self.position += max(0, buffered)
        length -= max(0, buffered)
        if self.mode == "auto":
            self._decide()
        if self.mode == "ranged" or self._stream is None:
            self.position += length  # a jump: nothing is fetched
            self._buffer, self._buffer_start = b"", self.position
            return
        self.position += self._stream.skip(length)
        self._buffer, self._buffer_start = b"", self.position

    def close(self) -> None:
        if self._stream is not None:
            self.fetched += self._stream.fetched
            self._stream.close()
            self._stream = None

    def __enter__(self) -> ForwardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def bytes_fetched(self) -> int:
        """Bytes fetched so far, the stream's chunks included."""
        return self.fetched + (self._stream.fetched if self._stream is not None else 0)

    # -- fetching ------------------------------------------------------------------------

    def _from_buffer(self, length: int) -> bytes:
        at = self.position - self._buffer_start
        if at < 0 or at >= len(self._buffer):
            return b""
        part = self._buffer[at : at + length]
        self.position += len(part)
        return part

    def _refill(self, length: int) -> None:
        if self.mode == "auto":
            self._decide()
        if self.mode == "ranged":
            self._fetch(self.position, min(max(length, self.min_read), self.size - self.position))
            return
        if self._stream is None:
            self._start_stream()
        assert self._stream is not None
        data = self._stream.read(max(length, 1 << 16)) or b""
        self._buffer, self._buffer_start = data, self.position

    def _fetch(self, offset: int, length: int) -> None:
        self._buffer = self.source.read(offset, length) if length > 0 else b""
        self._buffer_start = offset
        self.fetched += len(self._buffer)

    def _decide(self) -> None:
        average = self._skipped / self._skips if self._skips else 0
        self.mode = "ranged" if average >= self.ranged_member_bytes else "stream"
        log.debug(
            "%r: members average %.0f bytes over the first %d: %s scan",
            self.source,
            average,
            self._skips,
            "a ranged" if self.mode == "ranged" else "a streamed",
        )

    def _start_stream(self) -> None:
        self._stream = RemoteStream(self.source, start=self.position)
