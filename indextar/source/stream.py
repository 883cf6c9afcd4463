"""A remote object read front to back in prefetched ranged chunks."""

from __future__ import annotations

import concurrent.futures
import io
from typing import Any

from .base import ByteSource

__all__ = ["RemoteStream"]


class RemoteStream(io.RawIOBase):
    """A remote object read front to back in ranged chunks, the next ones prefetched.

    Each chunk is one retried ranged read, so a connection cut mid-object costs one
    chunk, not the whole stream. Wrap it in :class:`io.BufferedReader` for small reads.
    It starts at byte ``start``; ``fetched`` counts the bytes read from the source.
    """

    def __init__(
        self,
        source: ByteSource,
        *,
        chunk_size: int = 8 << 20,
        prefetch: int = 2,
        start: int = 0,
    ):
        super().__init__()
        self.source = source
        self.chunk_size = chunk_size
        self.prefetch = prefetch
        self._buffer = memoryview(b"")
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._ahead: list[concurrent.futures.Future[bytes]] = []
        self._next = self._start = start
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def _schedule(self) -> None:
        size = self.source.size
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.prefetch, thread_name_prefix="indextar-stream"
            )
        while len(self._ahead) < self.prefetch and self._next < size:
            length = min(self.chunk_size, size - self._next)
            self._ahead.append(self._pool.submit(self.source.read, self._next, length))
            self._next += length

    def _next_chunk(self) -> bool:
        """Make the next prefetched chunk the buffer; False at the end of the object."""
        self._schedule()
        if not self._ahead:
            return False
        self._buffer = memoryview(self._ahead.pop(0).result())
        self.fetched += len(self._buffer)
        self._schedule()
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._buffer and not self._next_chunk():
            return 0
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

    def tell(self) -> int:
        """The object's offset read up to (what decompression errors report)."""
        return self._start + self.fetched - len(self._buffer)

    def skip(self, length: int) -> int:
        """Pass over the next ``length`` bytes without copying them; how many there were."""
        skipped = 0
        while skipped < length:
            if not self._buffer and not self._next_chunk():
                break
            n = min(length - skipped, len(self._buffer))
            self._buffer = self._buffer[n:]
            skipped += n
        return skipped

    def close(self) -> None:
        if self._pool is not None:
            for future in self._ahead:
                future.cancel()
            self._pool.shutdown(wait=True)
            self._pool = None
        self._ahead.clear()
        super().close()
