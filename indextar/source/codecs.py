"""The compression libraries, imported lazily; whole-frame and stream decompression.

``import indextar`` imports none of them: a gzip frame needs only :mod:`zlib`; zstd needs
``zstandard`` and a single-stream ``.tar.gz`` read through seek points ``indexed_gzip``,
each imported on first use with an ImportError that says what to install (the extras
``indextar[zstd]`` and ``indextar[gzip]``).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from ..errors import (
    CompressedShardError,
    IndextarError,
    ShardFormatError,
    ShardNotFoundError,
    TruncatedShardError,
)
from ..tar.compress import CODECS, ZstdFrameWalk, compressed_message, sniff_compression

__all__ = [
    "CODECS",
    "decompress_frame",
    "decompressed_stream",
    "decompressing",
    "frame_compressor",
    "indexed_gzip",
    "open_decompressed",
    "zstandard",
    "zstd_context",
]


def zstandard() -> ModuleType:
    """The ``zstandard`` module, or an ImportError naming the extra that installs it."""
    try:
        import zstandard as module
    except ImportError as e:
        raise ImportError(
            "zstd shards need the zstandard package: pip install 'indextar[zstd]'"
        ) from e
    return module


def indexed_gzip() -> ModuleType:
    """The ``indexed_gzip`` module, or an ImportError naming the extra that installs it."""
    try:
        import indexed_gzip as module
    except ImportError as e:
        raise ImportError(
            "random access into a .tar.gz shard needs the indexed_gzip package: "
            "pip install 'indextar[gzip]'"
        ) from e
    return module  # type: ignore[no-any-return]


def decompress_frame(codec: str, data: bytes | memoryview, *, shard: str, offset: int) -> bytes:
    """One whole gzip member or zstd frame (``data``, at compressed byte ``offset`` of
    ``shard``), decompressed and checked: a frame that is cut short or corrupt raises."""
    try:
        if codec == "gzip":
            decompressor = zlib.decompressobj(wbits=31)
            out = decompressor.decompress(data)
            complete, rest = decompressor.eof, decompressor.unused_data
        else:
            zstd_decompressor = zstd_context().decompressobj()
            out = zstd_decompressor.decompress(data)
            complete, rest = zstd_decompressor.eof, zstd_decompressor.unused_data
    except Exception as e:  # zlib.error, zstandard.ZstdError: the data is corrupt
        if isinstance(e, ImportError):
            raise
        raise ShardFormatError(
            f"corrupt {codec} data in the frame at compressed byte offset {offset} ({e})",
            shard=shard,
            offset=offset,
        ) from e
    if not complete:
        raise TruncatedShardError(
            f"the {codec} frame at compressed byte offset {offset} is cut short "
            f"({len(data)} bytes read)",
            shard=shard,
            offset=offset,
        )
    if rest:
        raise ShardFormatError(
            f"the {codec} frame at compressed byte offset {offset} ends "
            f"{len(rest)} bytes before the span the index records",
            shard=shard,
            offset=offset,
        )
    return out


_local = threading.local()


def zstd_context() -> Any:
    """This thread's ``ZstdDecompressor`` (one is not safe to share between threads, and
    making one per frame costs more than decompressing a small frame). Its one-call
    ``decompress`` takes a frame that records its content size and checks its checksum,
    if any; it raises ``zstandard.ZstdError`` on anything else."""
    try:
        return _local.zstd
    except AttributeError:
        context = _local.zstd = zstandard().ZstdDecompressor()
        return context


def frame_compressor(codec: str, level: int | None = None) -> Callable[[bytes], bytes]:
    """A function that compresses bytes into one gzip member or one zstd frame (with its
    content size and checksum), so that every call's output decompresses on its own and
    the outputs' concatenation is one valid ``.gz`` or ``.zst`` file."""
    if codec == "gzip":
        gzip_level = 6 if level is None else level

        def gzip_frame(data: bytes) -> bytes:
            compressor = zlib.compressobj(gzip_level, zlib.DEFLATED, 31)
            return compressor.compress(data) + compressor.flush()

        return gzip_frame
    if codec == "zstd":
        compressor = zstandard().ZstdCompressor(
            level=3 if level is None else level, write_content_size=True, write_checksum=True
        )
        return compressor.compress  # type: ignore[no-any-return]
    raise ValueError(f"compress must be one of {', '.join(CODECS)} or None, got {codec!r}")


class _Walked(io.RawIOBase):
    """``raw``'s bytes, each also fed to a :class:`~indextar.tar.compress.ZstdFrameWalk`."""

    def __init__(self, raw: Any, walk: ZstdFrameWalk):
        super().__init__()
        self._raw, self._walk = raw, walk

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        got = int(self._raw.readinto(buffer))
        self._walk.feed(memoryview(buffer)[:got])
        return got

    def close(self) -> None:
        self._raw.close()
        super().close()


class _CheckedReader(io.RawIOBase):
    """A decompressing reader whose errors name the shard and the compressed offset.

    zstd's reader stops where its input stops, even inside a frame: with ``walk`` (the
    frames of what it read), the end of the output is checked to be a frame's end.
    """

    def __init__(
        self, inner: Any, raw: Any, codec: str, shard: str, walk: ZstdFrameWalk | None = None
    ):
        super().__init__()
        self._inner, self._raw, self._codec, self._shard = inner, raw, codec, shard
        self._walk = walk

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            got = int(self._inner.readinto(buffer))
        except EOFError as e:
            offset = self._offset()
            raise TruncatedShardError(
                f"the {self._codec} stream is cut short (at compressed byte offset {offset})",
                shard=self._shard,
                offset=offset,
            ) from e
        except Exception as e:  # zlib.error, gzip.BadGzipFile (OSError), zstandard.ZstdError
            if isinstance(e, (ImportError, IndextarError)):  # the reads' own: stale, remote
                raise
            offset = self._offset()
            raise ShardFormatError(
                f"corrupt {self._codec} data (read up to compressed byte offset {offset}: {e})",
                shard=self._shard,
                offset=offset,
            ) from e
        if got == 0 and len(buffer) and self._walk is not None and not self._walk.between_frames:
            start, end = self._walk.frame_start, self._walk.offset
            raise TruncatedShardError(
                f"the {self._codec} stream is cut short: it ends at compressed byte offset "
                f"{end}, inside the frame that starts at compressed byte offset {start}",
                shard=self._shard,
                offset=start,
            )
        return got

    def _offset(self) -> int | None:
        """The compressed offset read up to, if the raw stream can tell (a pipe cannot)."""
        try:
            return int(self._raw.tell())
        except OSError:
            return None

    def close(self) -> None:
        self._inner.close()
        super().close()


def decompressed_stream(raw: Any, codec: str, *, shard: str) -> io.BufferedReader:
    """The uncompressed bytes of the gzip or zstd stream ``raw`` (one frame or many),
    read front to back; a cut or corrupt stream raises
    :class:`~indextar.errors.TruncatedShardError` or
    :class:`~indextar.errors.ShardFormatError` naming ``shard`` and the compressed offset
    reached. zstd's skippable frames are skipped."""
    walk = None
    if codec == "gzip":
        inner: Any = gzip.GzipFile(fileobj=raw, mode="rb")
    else:
        walk = ZstdFrameWalk()
        inner = (
            zstandard()
            .ZstdDecompressor()
            .stream_reader(_Walked(raw, walk), read_across_frames=True)
        )
    return io.BufferedReader(_CheckedReader(inner, raw, codec, shard, walk), 1 << 20)


@contextlib.contextmanager
def decompressing(raw: Any, *, shard: str, reading: str, remote: bool = False) -> Iterator[Any]:
    """The tar bytes of ``raw``, a buffered binary stream (``peek`` works), front to back:
    ``raw`` itself for a plain tar, :func:`decompressed_stream` of it for gzip and zstd.
    Another compression raises :class:`~indextar.errors.CompressedShardError` naming
    ``shard``, with a command that decompresses it; ``reading`` says what needs the
    plain tar (``"streaming"``); for a ``remote`` shard the command is download, run,
    upload."""
    head = raw.peek(8)[:8]
    codec = sniff_compression(head)
    if codec is None:
        yield raw
    elif codec in CODECS:
        with decompressed_stream(raw, codec, shard=shard) as stream:
            yield stream
    else:
        message = compressed_message(head, shard, reading=reading, remote=remote)
        raise CompressedShardError(message or codec, shard=shard)


@contextlib.contextmanager
def open_decompressed(
    path: str | os.PathLike[str], *, shard: str | None = None, reading: str
) -> Iterator[Any]:
    """:func:`decompressing` of the local file ``path`` (named ``shard`` in errors, by
    default its path); a missing file raises :class:`~indextar.errors.ShardNotFoundError`."""
    name = os.fspath(path) if shard is None else shard
    try:
        raw = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise ShardNotFoundError(f"shard {name!r} does not exist") from None
    with raw, decompressing(raw, shard=name, reading=reading) as stream:
        yield stream
