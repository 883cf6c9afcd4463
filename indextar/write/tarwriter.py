"""Write one deterministic tar shard, and index it on close without reading it again.

:class:`TarWriter` appends encoded samples (:mod:`indextar.write.sample`), or entries
copied from another tar as they are (:meth:`TarWriter.append_entries`), to a hidden
temporary file next to the shard, keeps every member's offsets as it goes, and on
close renames the file into place and writes ``<shard>.idx.sqlite`` from those
offsets. Its ``with`` behaviour, :class:`~indextar.write.closing.ClosingWriter`, it
shares with :class:`~indextar.write.shardwriter.ShardWriter`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from ..atomic import create_temp
from ..errors import WriterError
from ..index.arrays import CompressedLayout
from ..index.attribute_json import AttributeBuilder, OnError, attributes_member
from ..index.checksums import ChecksumsArg, checksum_algorithm, hash_parts
from ..index.meta import IndexMeta, file_fingerprint
from ..index.naming import Grouping, group_members, split_name
from ..index.shard import PathLike, ShardIndex, index_path
from ..index.spans import headers_name_their_keys
from ..index.tables import index_lock, sample_spans, write_index
from ..tar.header import END_OF_ARCHIVE
from ..tar.scan import TarScan
from ..tar.stream import StreamEntry
from .closing import ClosingWriter, compressor_for
from .sample import Buffer, TarSample, encode_sample

__all__ = ["TarWriter"]

log = logging.getLogger(__name__)

_REGULAR = ord("0")
_BUFFER_BYTES = 1 << 20


class TarWriter(ClosingWriter):
    """Write samples to one deterministic tar shard, and index it on close.

    Parameters
    ----------
    path_or_fileobj
        The shard's path, or a binary file object to write to (then ``index`` must be
        false: there is no path to index, and no temporary file or rename).
    encoder
        Encode values by extension (:mod:`indextar.write.encode`); ``False`` takes bytes only.
    index
        Write ``<shard>.idx.sqlite`` next to the shard on close.
    compress
        ``"gzip"`` or ``"zstd"``: write each sample's members, and the end-of-archive
        blocks, as a gzip member or zstd frame of its own. The file is an ordinary
        ``.tar.gz`` / ``.tar.zst`` that GNU tar and webdataset read; the index records
        each frame's compressed span, so a sample is one read of exactly its bytes.
    attributes_from, on_error
        Store each sample's attributes in the index, as
        ``build_index(..., attributes_from="json")`` does, from the bytes being written
        (no read back): the top-level fields of its member of that extension. A sample
        whose member is missing or not a JSON object raises
        :class:`~indextar.SampleAttributeError` before it is written (``"fail"``), or is
        recorded in the index's ``attribute_errors`` (``"skip"``).
    checksums
        Record each sample's checksum in the index, as ``build_index(...,
        checksums=...)`` does, from the bytes being written (its uncompressed span, as
        reads check it): ``True`` for ``"crc32"``, or ``"xxh3_64"``. For samples given to
        :meth:`write` or :meth:`append`, not copied entries.
    meta
        The deprecated name of ``attributes_from`` (a :class:`DeprecationWarning`).

    Examples
    --------
    >>> with TarWriter("out.tar") as sink:  # doctest: +SKIP
    ...     sink.write({"__key__": "a", "txt": "hello", "cls": 3})
    """

    def __init__(
        self,
        path_or_fileobj: PathLike | IO[bytes],
        *,
        encoder: bool = True,
        index: bool = True,
        compress: str | None = None,
        attributes_from: str | None = None,
        on_error: OnError = "fail",
        checksums: ChecksumsArg = False,
        meta: str | None = None,
    ):
        member = attributes_member(attributes_from, meta, call="TarWriter")
        self.encoder = encoder
        self.compress = compress
        self.attributes_from = member
        self.checksum = checksum_algorithm(checksums)
        # Of each appended sample, in order: its checksum, and where its bytes start and end.
        self._checksums: list[tuple[int, int, int]] = []
        self._compressor = compressor_for(compress)
        self._frames: list[tuple[int, int, int, int]] = []  # compressed and uncompressed spans
        self._compressed_pos = 0
        self.index: ShardIndex | None = None
        self._path: Path | None = None
        self._tmp: Path | None = None
        if isinstance(path_or_fileobj, (str, os.PathLike)):
            self._path = Path(path_or_fileobj)
            self.name = str(self._path)
            try:  # hidden, locked while this writer lives (see atomic.py)
                fd, tmp = create_temp(self._path)
            except OSError as e:
                raise WriterError(
                    f"cannot create a file in {str(self._path.parent)!r} ({e.strerror})",
                    shard=self.name,
                ) from e
            self._tmp = tmp
            self._file: IO[bytes] = os.fdopen(fd, "wb", buffering=_BUFFER_BYTES)
        else:
            if index:
                raise WriterError(
                    "index=True needs a path to write the index next to; pass a path, or "
                    "index=False to write to a file object"
                )
            self.name = str(getattr(path_or_fileobj, "name", "<stream>"))
            self._file = path_or_fileobj
        self._index = index
        self._attributes = (
            None
            if member is None
            else AttributeBuilder(shard=self.name, ext=member, on_error=on_error)
        )
        self._state = "open"
        self._pos = 0
        self._keys: set[str] = set()
        self._names: list[str] = []
        self._header_offsets: list[int] = []
        self._data_offsets: list[int] = []
        self._sizes: list[int] = []
        # Of entries copied by append_entries: the type of each that is no regular file
        # (by row), and each call's first header blocks (by offset), which the index's
        # check that sample spans name their keys reads.
        self._types: dict[int, int] = {}
        self._copied_headers: dict[int, bytes] = {}

    # -- writing -----------------------------------------------------------------

    @property
    def count(self) -> int:
        """Samples written so far."""
        return len(self._keys)

    @property
    def size(self) -> int:
        """Bytes written so far, not counting the end-of-archive blocks."""
        return self._pos

    @property
    def path(self) -> Path | None:
        """The shard's final path (``None`` when writing to a file object)."""
        return self._path

    def write(self, sample: Mapping[str, Any]) -> int:
        """Encode and append one sample; return the bytes it added to the shard.

        A sample that fails to encode raises before anything is written, so the
        shard stays usable.
        """
        self._check_open()
        return self.append(encode_sample(sample, encoder=self.encoder, shard=self.name))

    def append(self, sample: TarSample, *, attributes: dict[str, object] | None = None) -> int:
        """Append an already encoded sample; return the bytes it added.

        With ``attributes_from=``, ``attributes`` are the fields of the sample's member
        of that extension, already parsed (the caller wrote that member from them), so
        they are recorded without parsing the member back.
        """
        self._check_open()
        if sample.key in self._keys:
            raise WriterError(
                "duplicate key: a sample with this key is already in this shard",
                shard=self.name,
                key=sample.key,
            )
        if self._attributes is not None:  # refuses a bad sample before writing it
            if attributes is not None:
                self._attributes.add_fields(attributes, sample.key)
            else:
                self._attributes.add(_member_bytes(sample, self._attributes.ext), sample.key)
        if self.checksum:
            checksum = hash_parts(sample.parts, self.checksum)
        self._write_parts(sample.parts)
        base = self._pos
        if self.checksum:
            self._checksums.append((checksum, base, base + sample.nbytes))
        self._keys.add(sample.key)
        self._names += sample.names
        self._header_offsets += [base + offset for offset in sample.header_offsets]
        self._data_offsets += [base + offset for offset in sample.data_offsets]
        self._sizes += sample.sizes
        self._pos += sample.nbytes
        return sample.nbytes

    def append_entries(self, entries: Sequence[StreamEntry]) -> int:
        """Append entries copied from another tar as they are (their header blocks keep
        names, modes, owners, times and extension headers), as one gzip member or zstd
        frame when compressing; return the bytes they added.

        The index groups them into samples as ``build_index`` would, and records the
        entries in no sample (directories, links, files without an extension) as
        skipped. Keys are not checked against earlier ones: a tar may hold a key in two
        places, as its index then does; nor counted in :attr:`count`.
        """
        self._check_open()
        if self._attributes is not None:
            raise WriterError(
                "attributes_from= reads the samples given to write() or append(), "
                "not copied entries",
                shard=self.name,
            )
        if self.checksum:
            raise WriterError(
                "checksums= hashes the samples given to write() or append(), not copied "
                "entries (index the shard with build_index(..., checksums=True) instead)",
                shard=self.name,
            )
        if not entries:
            return 0
        self._write_parts([entry.blocks for entry in entries])
        base = self._pos
        self._copied_headers[base] = entries[0].blocks[: entries[0].data_start]
        for entry in entries:
            if entry.typeflag != _REGULAR:
                self._types[len(self._names)] = entry.typeflag
            self._names.append(entry.name)
            self._header_offsets.append(self._pos)
            self._data_offsets.append(self._pos + entry.data_start)
            self._sizes.append(entry.size)
            self._pos += len(entry.blocks)
        return self._pos - base

    def _write_parts(self, parts: Sequence[Buffer]) -> None:
        """Write the next bytes of the tar, as one frame when compressing; a failure
        abandons the shard (``close`` then refuses it)."""
        try:
            if self._compressor is None:
                write = self._file.write
                for part in parts:
                    write(part)
            else:
                self._write_frame(b"".join(parts))
        except BaseException:
            self._state = "failed"
            raise

    def _write_frame(self, data: bytes) -> None:
        """Compress ``data`` (the next bytes of the tar, from ``_pos`` on) as one frame and
        write it."""
        assert self._compressor is not None
        frame = self._compressor(data)
        self._file.write(frame)
        self._frames.append((self._compressed_pos, len(frame), self._pos, len(data)))
        self._compressed_pos += len(frame)

    def _check_open(self) -> None:
        if self._state != "open":
            raise WriterError(
                "cannot write: the writer is closed"
                if self._state == "closed"
                else "cannot write: an earlier write failed and the shard was abandoned",
                shard=self.name,
            )

    # -- finishing ---------------------------------------------------------------

    def close(self) -> ShardIndex | None:
        """Finish the shard: end marker, rename into place, index. Returns the index.

        Calling it again does nothing. After a failed write the temporary file is
        removed and :class:`WriterError` is raised.
        """
        if self._state == "closed":
            return self.index
        if self._state == "failed":
            self.abort()
            raise WriterError("an earlier write failed; the shard was not written", shard=self.name)
        with contextlib.ExitStack() as held:
            try:
                # grouped first: copied entries that do not form samples leave no shard
                grouped = self._scan_and_group() if self._index else None
                if self._compressor is None:
                    self._file.write(END_OF_ARCHIVE)
                else:
                    self._write_frame(END_OF_ARCHIVE)
                self._file.flush()
                if self._tmp is None:
                    self._state = "closed"
                    return None
                os.fsync(self._file.fileno())
                self._file.close()
                assert self._path is not None
                if grouped is not None:  # the new pair replaces the old; a crash in between
                    old_index = index_path(self._path)  # leaves no index, which reads build
                    held.enter_context(index_lock(old_index))
                    old_index.unlink(missing_ok=True)
                os.replace(self._tmp, self._path)
                self._tmp = None
            except BaseException:
                self.abort()
                raise
            self._state = "closed"
            if grouped is not None:
                self.index = self._write_index(self._path, *grouped)
        log.debug("wrote %s: %d samples, %d bytes", self._path, self.count, self._pos)
        return self.index

    def abort(self) -> None:
        """Abandon the shard: close and delete the temporary file. Nothing is renamed."""
        self._state = "closed"
        if self._tmp is not None:
            try:
                self._file.close()
            finally:
                self._tmp.unlink(missing_ok=True)
                self._tmp = None

    def _scan_and_group(self) -> tuple[TarScan, Grouping]:
        """The shard's entries as a scan of it would find them, grouped into samples."""
        types = np.full(len(self._names), _REGULAR, dtype=np.uint8)
        types[list(self._types)] = list(self._types.values())
        scan = TarScan(
            names=self._names,
            types=types,
            header_offsets=np.asarray(self._header_offsets, dtype=np.int64),
            data_offsets=np.asarray(self._data_offsets, dtype=np.int64),
            sizes=np.asarray(self._sizes, dtype=np.int64),
            end_offset=self._pos,
            file_size=self._pos + len(END_OF_ARCHIVE),
        )
        return scan, group_members(scan, shard=self.name)

    def _span_names(self, scan: TarScan, grouping: Grouping) -> bool:
        """``IndexMeta.span_names``: whether every sample's span starts with headers that
        name its key. The writer's own headers do; copied ones are checked as an index
        build checks them (a sample that starts inside a copy: not checkable, so no)."""
        if not self._copied_headers:
            return True
        copied = self._copied_headers
        try:
            return headers_name_their_keys(
                lambda start, end: copied[start][: end - start], scan, grouping, shard=self.name
            )
        except KeyError:
            return False

    def _write_index(self, path: Path, scan: TarScan, grouping: Grouping) -> ShardIndex:
        st = path.stat()
        content_fingerprint = file_fingerprint(path, st.st_size)
        meta = IndexMeta.describe(
            scan,
            grouping,
            shard_name=path.name,
            shard_size=st.st_size,
            shard_mtime_ns=st.st_mtime_ns,
            fingerprint=content_fingerprint,
            compression=self.compress or "",
            uncompressed_size=self._pos + len(END_OF_ARCHIVE) if self.compress else 0,
            span_names=self._span_names(scan, grouping),
            checksum=self.checksum,
        )
        layout = None
        if self.compress is not None:
            frames = np.array(self._frames, np.int64).reshape(-1, 4)
            layout = CompressedLayout(self.compress, frames=frames)
        target = index_path(path)
        attributes = None if self._attributes is None else self._attributes.table()
        sums = self._sample_checksums(scan, grouping)
        write_index(
            target, meta, scan, grouping, attributes=attributes, layout=layout, checksums=sums
        )
        return ShardIndex(shard=str(path), path=target, meta=meta)

    def _sample_checksums(self, scan: TarScan, grouping: Grouping) -> npt.NDArray[np.uint64] | None:
        """The appended samples' checksums, once their spans are the index's samples'."""
        if not self.checksum:
            return None
        starts, ends = sample_spans(scan, grouping)
        written = np.array([span for _, *span in self._checksums], np.int64).reshape(-1, 2)
        if not (np.array_equal(starts, written[:, 0]) and np.array_equal(ends, written[:, 1])):
            raise WriterError(  # each appended sample is one sample: not expected
                "the index's samples are not the samples written; cannot record checksums",
                shard=self.name,
            )
        return np.array([checksum for checksum, _, _ in self._checksums], np.uint64)


def _member_bytes(sample: TarSample, ext: str) -> bytes | None:
    """The data of ``sample``'s member with extension ``ext`` (``None`` if it has none),
    sliced from its parts without joining them."""
    for name, data_offset, size in zip(sample.names, sample.data_offsets, sample.sizes):
        split = split_name(name)
        if split is None or split[1] != ext:
            continue
        at = 0
        for part in sample.parts:
            view = memoryview(part).cast("B")
            if at <= data_offset and data_offset + size <= at + view.nbytes:
                return bytes(view[data_offset - at : data_offset - at + size])
            at += view.nbytes
        joined = b"".join(sample.parts)  # the data spans parts: rare
        return joined[data_offset : data_offset + size]
    return None
