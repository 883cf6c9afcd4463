"""Rewrite a shard with another compression, streaming, and index it in the same pass.

:func:`recompress` reads any shard front to back (a plain tar, a ``.tar.gz`` or a
``.tar.zst`` of one frame or many) and writes a plain tar or a per-sample ``.tar.gz`` /
``.tar.zst`` (:class:`~indextar.write.tarwriter.TarWriter` with ``compress=``), whose
index the writer records as it goes. Every entry is kept, in order, its header blocks
copied as they are, so ``tar tvf`` lists the same names, modes, owners and times: a
sample's members are one frame, and each run of entries in no sample (directories,
links, ``README``, ``__meta__``) one more. Nothing is held in memory but one sample
(or up to 1 MiB of such entries).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

from ..errors import SampleFormatError, WriterError
from ..index.naming import skip_reason, split_name
from ..index.shard import PathLike, ShardIndex
from ..source.codecs import open_decompressed
from ..tar.scan import entry_kind
from ..tar.stream import StreamEntry, iter_entries
from .tarwriter import TarWriter

__all__ = ["recompress"]

log = logging.getLogger(__name__)

_OTHER_RUN = 1 << 20  # bytes of entries in no sample that go into one frame


def recompress(
    source: PathLike,
    target: PathLike,
    *,
    compress: str | None = None,
    index: bool = True,
) -> ShardIndex | None:
    """Copy every entry of the shard ``source`` into ``target``, compressed per sample.

    Parameters
    ----------
    source
        A local shard: plain, gzip- or zstd-compressed (one frame or many).
    target
        The new shard. It appears only once complete (written to a temporary file and
        renamed), with its index next to it. Its entries are the source's, header
        blocks and all; each sample is one gzip member or zstd frame.
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
    others: dict[str, int] = {}
    with open_decompressed(source, reading="recompress") as stream, TarWriter(
        target, encoder=False, index=index, compress=compress
    ) as writer:  # fmt: skip
        for run in _runs(iter_entries(stream, shard=name), name, others):
            writer.append_entries(run)
    if others:
        log.info("recompress %s: kept entries in no sample: %s", name, others)
    return writer.index


def _runs(
    entries: Iterator[StreamEntry], shard: str, others: dict[str, int]
) -> Iterator[list[StreamEntry]]:
    """The entries in runs, each written as one frame: a sample's members (consecutive
    files with one key), or consecutive entries in no sample (counted in ``others`` by
    why), up to about 1 MiB of them."""
    key: str | None = None  # the run's sample, or None for entries in no sample
    run: list[StreamEntry] = []
    exts: set[str] = set()
    other_bytes = 0
    for entry in entries:
        kind = entry_kind(entry.typeflag)  # as the index names it
        reason = kind if kind != "file" else skip_reason(entry.name)
        split = split_name(entry.name) if reason is None else None
        if split is None:
            reason = reason or "no-extension"
            others[reason] = others.get(reason, 0) + 1
            if run and (key is not None or other_bytes > _OTHER_RUN):
                yield run
                run, other_bytes = [], 0
            key = None
            other_bytes += len(entry.blocks)
            run.append(entry)
            continue
        if split[0] != key:
            if run:
                yield run
            key, run, exts, other_bytes = split[0], [], set(), 0
        if split[1] in exts:
            raise SampleFormatError(
                f"sample {key!r} has two {split[1]!r} members", shard=shard, offset=entry.offset
            )
        exts.add(split[1])
        run.append(entry)
    if run:
        yield run
