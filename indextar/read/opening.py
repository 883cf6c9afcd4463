"""Opening a shard to read it front to back: a local path, an fsspec URL or ``pipe:CMD``.

:func:`open_stream` gives the shard's uncompressed tar bytes as a file object, for
:func:`~indextar.tar.stream.iter_members`; the tar room reads file objects and leaves
URLs, pipes, gzip and zstd to this module. ``http(s)://`` and ``s3://`` shards are one
streaming GET each (:class:`~indextar.source.objectstream.ObjectStream`), which
:func:`start_stream` may send before the shard is opened; other fsspec protocols are
read in prefetched ranged chunks.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

from ..errors import IndextarError
from ..source.codecs import decompressing, open_decompressed
from ..source.location import ShardLocation, check_pipe_allowed
from ..source.objectstream import ObjectStream, streams_protocol
from ..source.remote import RangeSource
from ..source.stream import RemoteStream

__all__ = ["open_stream", "start_stream"]

_BUFFER = 1 << 20


def start_stream(
    url: str, *, storage_options: Mapping[str, Any] | None = None
) -> ObjectStream | None:
    """The streaming GET of ``url``, sent now, for :func:`open_stream`'s ``started=``;
    ``None`` where ``url`` is not read by one (local paths, pipes, other protocols)."""
    if not ShardLocation.of(url).remote or not streams_protocol(url):
        return None
    return ObjectStream(url, storage_options=storage_options).start()


@contextlib.contextmanager
def open_stream(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    allow_pipe: bool = False,
    started: ObjectStream | None = None,
) -> Iterator[BinaryIO]:
    """A shard's uncompressed tar bytes, read front to back.

    ``url`` is a local path, an fsspec URL or (if allowed) ``pipe:CMD``. gzip and zstd
    are recognised by their magic bytes and decompressed, with errors that name the
    shard and the compressed offset; other compressions raise
    :class:`~indextar.errors.CompressedShardError`. ``started`` is ``url``'s stream
    from :func:`start_stream`, if one was sent ahead (it is closed here).
    """
    location = None if url.startswith("pipe:") else ShardLocation.of(url)
    if location is not None and not location.remote:
        with open_decompressed(location.name, shard=url, reading="streaming") as stream:
            yield stream
        return
    with contextlib.ExitStack() as stack:
        raw: Any  # a buffered binary reader: peek() works on both branches
        if url.startswith("pipe:"):
            check_pipe_allowed(url, allow_pipe)
            process = subprocess.Popen(url[5:], shell=True, stdout=subprocess.PIPE)  # noqa: S602 - opted in
            stack.callback(_check_pipe, process, url)
            assert process.stdout is not None
            raw = process.stdout
        else:
            remote: io.RawIOBase | None = started or start_stream(
                url, storage_options=storage_options
            )
            if remote is None:
                remote = RemoteStream(RangeSource(url, storage_options=storage_options))
            stack.callback(remote.close)
            raw = io.BufferedReader(remote, _BUFFER)
        from_url = location is not None and location.remote  # not a pipe
        yield stack.enter_context(
            decompressing(raw, shard=url, reading="streaming", remote=from_url)
        )


def _check_pipe(process: subprocess.Popen[bytes], url: str) -> None:
    assert process.stdout is not None
    process.stdout.close()
    status = process.wait()
    if status not in (0, -13):  # -13: SIGPIPE after we stopped reading early
        raise IndextarError(f"pipe shard {url[:60]!r} exited with status {status}")
