"""Rewrite a shard with another compression, streaming, and index it in the same pass.

:func:`recompress` reads any shard front to back (a plain tar, a ``.tar.gz`` or a
``.tar.zst`` of one frame or many) and writes a plain tar or a per-sample ``.tar.gz`` /
``.tar.zst`` (:class:`~indextar.write.tarwriter.TarWriter` with ``compress=``), whose
index the writer records as it goes. Only the input's samples are kept: their members
in order, under their own names; entries in no sample (directories, links, ``README``,
``__meta__``) are dropped, and counted in the log. Nothing is held in memory but one
sample.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import CompressedShardError, SampleFormatError, ShardNotFoundError, WriterError
from ..index.naming import skip_reason, split_name
from ..index.shard import PathLike, ShardIndex
from ..source.codecs import CODECS, decompressed_stream
from ..tar.compress import compressed_message, sniff_compression
from ..tar.header import member_header, padded_size, padding
from ..tar.stream import StreamMember, iter_members
from .sample import TarSample
from .tarwriter import TarWriter

__all__ = ["recompress", "open_decompressed"]

log = logging.getLogger(__name__)

_BUFFER = 1 << 20


@contextlib.contextmanager
def open_decompressed(path: PathLike) -> Iterator[BinaryIO]:
    """The uncompressed tar bytes of the local shard ``path``, front to back."""
    with contextlib.ExitStack() as stack:
        try:
            raw: Any = stack.enter_context(open(path, "rb", buffering=_BUFFER))
        except FileNotFoundError:
            raise ShardNotFoundError(f"shard {os.fspath(path)!r} does not exist") from None
        head = raw.peek(8)[:8]
        codec = sniff_compression(head)
        stream: Any = raw
        if codec in CODECS:
            stream = stack.enter_context(decompressed_stream(raw, codec, shard=os.fspath(path)))
        elif codec is not None:
            message = compressed_message(head, os.fspath(path)) or codec
            raise CompressedShardError(message, shard=os.fspath(path))
        yield stream


def recompress(
    source: PathLike,
    target: PathLike,
    *,
    compress: str | None = None,
    index: bool = True,
) -> ShardIndex | None:
    """Copy the samples of the shard ``source`` into ``target``, compressed per sample.

    Parameters
    ----------
    source
        A local shard: plain, gzip- or zstd-compressed (one frame or many).
    target
        The new shard. It appears only once complete (written to a temporary file and
        renamed), with its index next to it.
    compress
        ``"gzip"``, ``"zstd"`` or ``None`` (a plain tar).
    index
        Write the target's index (the writer records it as it writes).

    Raises
    ------
    ShardFormatError
        If the source is not a well-formed tar (or its compressed stream is cut short or
        corrupt); the target is not written.
    """
    name = os.fspath(source)
    if Path(target).resolve() == Path(source).resolve():
        raise WriterError(f"recompress writes a new shard; the target is the source {name!r}")
    dropped: dict[str, int] = {}
    with open_decompressed(source) as stream, TarWriter(
        target, encoder=False, index=index, compress=compress
    ) as writer:  # fmt: skip
        for sample in _samples(iter_members(stream, shard=name), name, dropped):
            writer.append(sample)
    if dropped:
        log.info("recompress %s: dropped entries in no sample: %s", name, dropped)
    return writer.index


def _samples(
    members: Iterator[StreamMember], shard: str, dropped: dict[str, int]
) -> Iterator[TarSample]:
    """Consecutive members with one key, as :class:`TarSample` under their own names."""
    key: str | None = None
    group: list[StreamMember] = []
    exts: set[str] = set()
    for member in members:
        reason = skip_reason(member.name)
        split = split_name(member.name) if reason is None else None
        if split is None:
            reason = reason or "no-extension"
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        if split[0] != key:
            if group:
                yield _tar_sample(key, group)  # type: ignore[arg-type]
            key, group, exts = split[0], [], set()
        if split[1] in exts:
            raise SampleFormatError(
                f"sample {key!r} has two {split[1]!r} members", shard=shard, offset=member.offset
            )
        exts.add(split[1])
        group.append(member)
    if group:
        yield _tar_sample(key, group)  # type: ignore[arg-type]


def _tar_sample(key: str, members: list[StreamMember]) -> TarSample:
    parts: list[bytes | memoryview] = []
    header_offsets, data_offsets, sizes = [], [], []
    pos = 0
    for member in members:
        header = member_header(member.name, len(member.data))
        header_offsets.append(pos)
        data_offsets.append(pos + len(header))
        sizes.append(len(member.data))
        parts += (header, member.data, padding(len(member.data)))
        pos += len(header) + padded_size(len(member.data))
    return TarSample(
        key=key,
        parts=tuple(parts),
        names=tuple(m.name for m in members),
        header_offsets=tuple(header_offsets),
        data_offsets=tuple(data_offsets),
        sizes=tuple(sizes),
        nbytes=pos,
    )
