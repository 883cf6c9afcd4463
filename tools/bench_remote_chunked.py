"""The streaming alternative tools/bench_remote.py measures against one GET per shard:
pipelined ranged GETs of fixed chunks, ``depth`` in flight across shard boundaries
(the next shard's first chunks go out while the current one's last are read), through
indextar's own ranged client (``RangeSource``: the direct S3 client, retries, If-Match
on the ETag taken before the row, as an index would give it). Each shard's chunks are
parsed with ``iter_members`` as ``StreamingTarDataset`` parses its stream."""

from __future__ import annotations

import collections
import concurrent.futures
import io
from collections.abc import Callable, Iterator
from typing import Any

Reader = Callable[[Any, Callable[[], None]], int]


class _Chunks(io.RawIOBase):
    """One shard's bytes from an iterator of its chunks, in order."""

    def __init__(self, chunks: Iterator[bytes]):
        super().__init__()
        self._chunks = chunks
        self._buffer = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._buffer:
            chunk = next(self._chunks, b"")
            if not chunk:
                return 0
            self._buffer = memoryview(chunk)
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def chunked_streaming(chunk: int, depth: int) -> Reader:
    def read(store: Any, mark: Callable[[], None]) -> int:
        from indextar.index.naming import split_name
        from indextar.source.remote import RangeSource
        from indextar.tar.stream import iter_members

        sources = [
            RangeSource(url, expected=stat, storage_options=store.storage_options)
            for url, stat in zip(store.urls, store.stats)
        ]
        plan = iter(
            (n, offset, min(chunk, stat.size - offset))
            for n, stat in enumerate(store.stats)
            for offset in range(0, stat.size, chunk)
        )
        flight: collections.deque[tuple[int, concurrent.futures.Future[bytes]]] = (
            collections.deque()
        )
        pool = concurrent.futures.ThreadPoolExecutor(depth)

        def top_up() -> None:
            while len(flight) < depth and (step := next(plan, None)) is not None:
                n, offset, length = step
                flight.append((n, pool.submit(sources[n].read, offset, length)))

        def shard_chunks(n: int) -> Iterator[bytes]:
            while True:
                top_up()
                if not flight or flight[0][0] != n:
                    return
                yield flight.popleft()[1].result()

        done = 0
        try:
            for n, url in enumerate(store.urls):
                stream = io.BufferedReader(_Chunks(shard_chunks(n)), 1 << 20)
                key = None
                for member in iter_members(stream, shard=url):
                    split = split_name(member.name)
                    if split is not None and split[0] != key:
                        key = split[0]
                        mark()
                        done += 1
        finally:
            pool.shutdown(cancel_futures=True)
        return done

    return read


def stats_of(urls: list[str], storage_options: dict[str, Any] | None) -> list[Any]:
    """Each object's size and ETag (what an index records), taken before the rows."""
    from indextar.source.remote import RangeSource

    return [RangeSource(url, storage_options=storage_options).stat() for url in urls]
