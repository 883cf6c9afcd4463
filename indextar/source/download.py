"""A remote object written into a local file: its bytes, several ranges in flight, or
its decompressed stream; what the shard cache downloads with, and the write that
finishes on a full disk with an error rather than a short file."""

from __future__ import annotations

import io
import os

from ..errors import ShardFormatError
from .codecs import decompressed_stream
from .remote import RangeSource
from .stream import RemoteStream

__all__ = ["CHUNK", "CHUNKS_IN_FLIGHT", "download", "download_decompressed", "pwrite_all"]

CHUNK = 8 << 20
"""Bytes a ranged request of a download asks for."""
CHUNKS_IN_FLIGHT = 8
"""Ranged requests of a download in flight at once."""


def download(fd: int, source: RangeSource, size: int) -> None:
    """Write the object's ``size`` bytes into the file ``fd``, several ranges in flight."""
    ranges = [(offset, min(CHUNK, size - offset)) for offset in range(0, size, CHUNK)]
    for start in range(0, len(ranges), CHUNKS_IN_FLIGHT):
        batch = ranges[start : start + CHUNKS_IN_FLIGHT]
        datas = source.read_many([o for o, _ in batch], [n for _, n in batch])
        for (offset, _), data in zip(batch, datas):
            pwrite_all(fd, data, offset)


def download_decompressed(fd: int, source: RangeSource, codec: str, plain_size: int) -> None:
    """Write the decompressed bytes of the ``codec`` object into the file ``fd``: exactly
    ``plain_size`` of them, or an error naming the object."""
    written = 0
    with RemoteStream(source) as remote, decompressed_stream(
        io.BufferedReader(remote, CHUNK), codec, shard=source.url
    ) as stream:  # fmt: skip
        while chunk := stream.read(CHUNK):
            if written + len(chunk) > plain_size:
                break
            pwrite_all(fd, chunk, written)
            written += len(chunk)
    if written != plain_size or chunk:
        got = f"more than {plain_size}" if chunk else str(written)
        raise ShardFormatError(
            f"the {codec} stream decompresses to {got} bytes; its index recorded {plain_size}",
            shard=source.url,
        )


def pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    """Write all of ``data`` at ``offset``: on a full disk ``pwrite`` may write only part of
    it without an error (the file is pre-sized, so the rest would read as zeros); the
    retry of the rest then raises ``ENOSPC``."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
