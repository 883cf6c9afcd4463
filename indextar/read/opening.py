"""Opening a shard to read it front to back: a local path, an fsspec URL or ``pipe:CMD``.

:func:`open_stream` gives the shard's uncompressed tar bytes as a file object, for
:func:`~indextar.tar.stream.iter_members`; the tar room reads file objects and leaves
URLs, pipes, gzip and zstd to this module.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

from ..errors import CompressedShardError, IndextarError, ShardNotFoundError
from ..patterns import is_url
from ..source.codecs import decompressed_stream
from ..source.remote import RangeSource, check_pipe_allowed
from ..source.stream import RemoteStream
from ..tar.compress import sniff_compression

__all__ = ["open_stream"]

_BUFFER = 1 << 20


@contextlib.contextmanager
def open_stream(
    url: str, *, storage_options: Mapping[str, Any] | None = None, allow_pipe: bool = False
) -> Iterator[BinaryIO]:
    """A shard's uncompressed tar bytes, read front to back.

    ``url`` is a local path, an fsspec URL or (if allowed) ``pipe:CMD``. gzip and zstd
    are recognised by their magic bytes and decompressed; other compressions raise
    :class:`~indextar.errors.CompressedShardError`.
    """
    with contextlib.ExitStack() as stack:
        raw: Any  # a buffered binary reader: peek() works on every branch
        if url.startswith("pipe:"):
            check_pipe_allowed(url, allow_pipe)
            process = subprocess.Popen(url[5:], shell=True, stdout=subprocess.PIPE)  # noqa: S602 - opted in
            stack.callback(_check_pipe, process, url)
            assert process.stdout is not None
            raw = process.stdout
        elif is_url(url):
            remote = RemoteStream(RangeSource(url, storage_options=storage_options))
            stack.callback(remote.close)
            raw = io.BufferedReader(remote, _BUFFER)
        else:
            path = url.removeprefix("file://")
            try:
                raw = stack.enter_context(open(path, "rb", buffering=_BUFFER))
            except FileNotFoundError:
                raise ShardNotFoundError(f"shard {url!r} does not exist") from None
        compression = sniff_compression(raw.peek(8)[:8])
        if compression == "gzip":
            raw = io.BufferedReader(gzip.GzipFile(fileobj=raw, mode="rb"), _BUFFER)
        elif compression == "zstd":  # one frame or many, skippable frames skipped
            raw = stack.enter_context(decompressed_stream(raw, "zstd", shard=url))
        elif compression is not None:
            raise CompressedShardError(
                f"is {compression}-compressed; streaming reads plain, gzip- or "
                "zstd-compressed tars",
                shard=url,
            )
        yield raw


def _check_pipe(process: subprocess.Popen[bytes], url: str) -> None:
    assert process.stdout is not None
    process.stdout.close()
    status = process.wait()
    if status not in (0, -13):  # -13: SIGPIPE after we stopped reading early
        raise IndextarError(f"pipe shard {url[:60]!r} exited with status {status}")
