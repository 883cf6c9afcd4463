"""Write WebDataset shards that are deterministic and indexed as they are written.

:class:`TarWriter` writes one shard, :class:`ShardWriter` a numbered series of them.
Both differ from webdataset's writers of the same names in four ways:

* **Deterministic.** Members are sorted by extension and every header has the same
  mode, owner and mtime (:mod:`indextar.tarheader`), so equal samples give
  byte-identical shards.
* **Indexed as written.** The writer knows every offset, so on close it writes the
  shard's ``<shard>.idx.sqlite`` without reading the shard again. The index has the
  same rows :func:`~indextar.build_index` would write.
* **Sizes are real.** ``maxsize`` counts what lands on disk: headers, padding and the
  end-of-archive blocks. A shard exceeds it only when a single sample is larger than
  ``maxsize``; such a sample gets a shard of its own.
* **Crash-safe.** A shard is written to a hidden temporary file in the target folder
  and renamed into place on close. An exception inside ``with`` deletes it, so a
  shard under its final name is always complete.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Union

import numpy as np

from .encode import encode_value
from .errors import EncodeError, WriterError
from .index import (
    IndexMeta,
    ShardIndex,
    fingerprint,
    index_path,
    write_index,
)
from .manifest import write_manifest
from .naming import group_members, skip_reason, split_name
from .tarheader import END_OF_ARCHIVE, member_header, padded_size, padding
from .tarscan import TarScan

__all__ = [
    "TarWriter",
    "ShardWriter",
    "TarSample",
    "encode_sample",
    "check_key",
    "plan_shards",
]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
Buffer = bytes | bytearray | memoryview

_REGULAR = ord("0")
_BUFFER_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class TarSample:
    """One sample ready to be appended to a tar.

    Attributes
    ----------
    key
        The sample's key.
    parts
        Its bytes, written in order: headers, data and padding of every member.
    names
        Member names, in archive order.
    header_offsets, data_offsets
        Where each member's first header block and its data start, relative to the
        sample's first byte.
    sizes
        Each member's data size.
    nbytes
        Total bytes of ``parts``: what the sample adds to the shard.
    """

    key: str
    parts: tuple[Buffer, ...]
    names: tuple[str, ...]
    header_offsets: tuple[int, ...]
    data_offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    nbytes: int


def check_key(key: object, *, shard: str | None = None) -> str:
    """Return ``key`` if it is a safe sample key; raise :class:`WriterError` if not.

    A key is a relative ``/``-separated path without empty, ``.`` or ``..``
    components whose last component has no dot (readers split member names at the
    first dot of their last component).
    """
    if not isinstance(key, str):
        raise WriterError(f"'__key__' must be a str, got {type(key).__name__} {key!r}", shard=shard)

    def bad(why: str) -> WriterError:
        return WriterError(f"invalid key: {why}", shard=shard, key=key)

    if not key:
        raise bad("it is empty")
    if key.startswith("/"):
        raise bad("it is an absolute path; keys are relative paths inside the shard")
    if "\0" in key or "\n" in key:
        raise bad("it contains a NUL or newline character")
    parts = key.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise bad(
                f"it has a {part or 'empty'!r} path component; extracting the shard could "
                "write outside its folder or collide with other members"
                if part == ".."
                else f"it has a {part or 'empty'!r} path component"
            )
    if "." in parts[-1]:
        raise bad(
            f"its last component {parts[-1]!r} contains a dot; readers split member names at "
            "that dot, so the sample would read back under another key"
        )
    if skip_reason(key + ".x") == "meta":
        raise bad("webdataset readers treat names like '__name__' as metadata and skip them")
    return key


def _member_bytes(value: Any, ext: str, *, encoder: bool, shard: str | None, key: str) -> Buffer:
    if encoder:
        return encode_value(ext, value, shard=shard, key=key)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    raise EncodeError(
        f"encoder=False takes bytes-like values only, got {type(value).__name__}",
        shard=shard,
        key=key,
        ext=ext,
    )


def encode_sample(
    sample: Mapping[str, Any], *, encoder: bool = True, shard: str | None = None
) -> TarSample:
    """Encode a sample dict into a :class:`TarSample`, members sorted by extension.

    Entries whose name starts with ``_`` (``__key__``, ``__url__``, ...) are not
    members; ``__key__`` is required.

    Raises
    ------
    WriterError
        For a missing or unsafe key, a bad or repeated extension, or no members.
    EncodeError
        For a value that cannot be encoded for its extension.
    """
    if "__key__" not in sample:
        raise WriterError(
            f"sample has no '__key__' (entries: {', '.join(map(repr, sample))})", shard=shard
        )
    key = check_key(sample["__key__"], shard=shard)
    exts = sorted(ext for ext in sample if not (isinstance(ext, str) and ext.startswith("_")))
    if not exts:
        raise WriterError("sample has no members besides its '_' entries", shard=shard, key=key)
    parts: list[Buffer] = []
    names: list[str] = []
    header_offsets: list[int] = []
    data_offsets: list[int] = []
    sizes: list[int] = []
    seen: dict[str, str] = {}
    pos = 0
    for ext in exts:
        if not isinstance(ext, str):
            raise WriterError(f"extension {ext!r} is not a str", shard=shard, key=key)
        name = f"{key}.{ext}"
        if not ext or split_name(name) != (key, ext.lower()):
            raise WriterError(
                f"invalid extension {ext!r}: it must be non-empty, without '/', NUL or newline",
                shard=shard,
                key=key,
            )
        if ext.lower() in seen:
            raise WriterError(
                f"extensions {seen[ext.lower()]!r} and {ext!r} are the same to readers "
                "(extensions are lowercased)",
                shard=shard,
                key=key,
            )
        seen[ext.lower()] = ext
        data = _member_bytes(sample[ext], ext, encoder=encoder, shard=shard, key=key)
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        try:
            header = member_header(name, size)
        except UnicodeEncodeError as e:
            raise WriterError(
                f"member name {name!r} is not valid UTF-8 ({e.reason})", shard=shard, key=key
            ) from None
        names.append(name)
        header_offsets.append(pos)
        data_offsets.append(pos + len(header))
        sizes.append(size)
        parts += (header, data, padding(size))
        pos += len(header) + padded_size(size)
    return TarSample(
        key=key,
        parts=tuple(parts),
        names=tuple(names),
        header_offsets=tuple(header_offsets),
        data_offsets=tuple(data_offsets),
        sizes=tuple(sizes),
        nbytes=pos,
    )


def _starts_new_shard(count: int, size: int, nbytes: int, maxcount: int, maxsize: float) -> bool:
    """Whether a sample of ``nbytes`` starts a new shard after ``count`` samples, ``size`` bytes."""
    return count >= maxcount or (count > 0 and size + nbytes + len(END_OF_ARCHIVE) > maxsize)


def plan_shards(nbytes: Sequence[int], *, maxcount: int, maxsize: float) -> list[range]:
    """Split samples of the given on-disk sizes into shards, exactly as :class:`ShardWriter` does.

    Returns the range of sample positions of each shard.
    """
    plan: list[range] = []
    start, count, size = 0, 0, 0
    for i, n in enumerate(nbytes):
        if _starts_new_shard(count, size, n, maxcount, maxsize):
            plan.append(range(start, i))
            start, count, size = i, 0, 0
        count += 1
        size += n
    if count:
        plan.append(range(start, len(nbytes)))
    return plan


class TarWriter:
    """Write samples to one deterministic tar shard, and index it on close.

    Parameters
    ----------
    path_or_fileobj
        The shard's path, or a binary file object to write to (then ``index`` must be
        false: there is no path to index, and no temporary file or rename).
    encoder
        Encode values by extension (:mod:`indextar.encode`); ``False`` takes bytes only.
    index
        Write ``<shard>.idx.sqlite`` next to the shard on close.

    Examples
    --------
    >>> with TarWriter("out.tar") as sink:  # doctest: +SKIP
    ...     sink.write({"__key__": "a", "txt": "hello", "cls": 3})
    """

    def __init__(
        self, path_or_fileobj: PathLike | IO[bytes], *, encoder: bool = True, index: bool = True
    ):
        self.encoder = encoder
        self.index: ShardIndex | None = None
        self._path: Path | None = None
        self._tmp: Path | None = None
        if isinstance(path_or_fileobj, (str, os.PathLike)):
            self._path = Path(path_or_fileobj)
            self.name = str(self._path)
            # Hidden and not ending in the shard's suffix, so no shard pattern matches it;
            # os.open (unlike mkstemp) leaves the permissions to the umask.
            tmp = self._path.with_name(f".{self._path.name}.{secrets.token_hex(6)}.tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
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
        self._state = "open"
        self._pos = 0
        self._keys: set[str] = set()
        self._names: list[str] = []
        self._header_offsets: list[int] = []
        self._data_offsets: list[int] = []
        self._sizes: list[int] = []

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

    def append(self, sample: TarSample) -> int:
        """Append an already encoded sample; return the bytes it added."""
        self._check_open()
        if sample.key in self._keys:
            raise WriterError(
                "duplicate key: a sample with this key is already in this shard",
                shard=self.name,
                key=sample.key,
            )
        try:
            write = self._file.write
            for part in sample.parts:
                write(part)
        except BaseException:
            self._state = "failed"
            raise
        base = self._pos
        self._keys.add(sample.key)
        self._names += sample.names
        self._header_offsets += [base + offset for offset in sample.header_offsets]
        self._data_offsets += [base + offset for offset in sample.data_offsets]
        self._sizes += sample.sizes
        self._pos += sample.nbytes
        return sample.nbytes

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
        try:
            self._file.write(END_OF_ARCHIVE)
            self._file.flush()
            if self._tmp is None:
                self._state = "closed"
                return None
            os.fsync(self._file.fileno())
            self._file.close()
            assert self._path is not None
            os.replace(self._tmp, self._path)
            self._tmp = None
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        if self._index:
            self.index = self._write_index(self._path)
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

    def _write_index(self, path: Path) -> ShardIndex:
        st = path.stat()
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            content_fingerprint = fingerprint(mm, st.st_size)
        n = len(self._names)
        scan = TarScan(
            names=self._names,
            types=np.full(n, _REGULAR, dtype=np.uint8),
            header_offsets=np.asarray(self._header_offsets, dtype=np.int64),
            data_offsets=np.asarray(self._data_offsets, dtype=np.int64),
            sizes=np.asarray(self._sizes, dtype=np.int64),
            end_offset=self._pos,
            file_size=st.st_size,
        )
        grouping = group_members(scan, shard=str(path))
        meta = IndexMeta.describe(
            scan,
            grouping,
            shard_name=path.name,
            shard_size=st.st_size,
            shard_mtime_ns=st.st_mtime_ns,
            fingerprint=content_fingerprint,
        )
        target = index_path(path)
        write_index(target, meta, scan, grouping)
        return ShardIndex(shard=str(path), path=target, meta=meta)

    def __enter__(self) -> TarWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class ShardWriter:
    """Write samples to numbered shards, starting a new one at ``maxcount`` or ``maxsize``.

    Parameters
    ----------
    pattern
        Shard path with one ``%`` format for the shard number: ``"out-%06d.tar"``.
    maxcount
        At most this many samples per shard.
    maxsize
        At most this many bytes per shard, counting headers, padding and the end
        blocks. A sample larger than this on its own is written to a shard of its own.
    start_shard
        Number of the first shard.
    index
        Index each shard as it is written.
    manifest
        Also write a dataset manifest (:mod:`indextar.manifest`, readable by wids) to
        this path on close; needs ``index=True``.
    encoder
        As for :class:`TarWriter`.
    """

    def __init__(
        self,
        pattern: str,
        *,
        maxcount: int = 100_000,
        maxsize: float = 3e9,
        start_shard: int = 0,
        index: bool = True,
        manifest: PathLike | None = None,
        encoder: bool = True,
    ):
        try:
            distinct = (pattern % 0) != (pattern % 1)
        except (TypeError, ValueError) as e:
            raise WriterError(
                f"shard pattern {pattern!r} needs one %-format for the shard number, "
                f"such as 'out-%06d.tar' ({e})"
            ) from None
        if not distinct:
            raise WriterError(f"shard pattern {pattern!r} gives the same name for every shard")
        if maxcount < 1 or maxsize <= 0:
            raise WriterError(
                f"maxcount and maxsize must be positive, got {maxcount} and {maxsize}"
            )
        if manifest is not None and not index:
            raise WriterError("manifest= lists indexed shards; it needs index=True")
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.encoder = encoder
        self._index = index
        self._manifest = manifest
        self._next_shard = start_shard
        self._writer: TarWriter | None = None
        self._closed = False
        #: Paths of the shards finished so far.
        self.shards: list[str] = []
        #: Their indexes (when ``index=True``).
        self.indexes: list[ShardIndex] = []

    def write(self, sample: Mapping[str, Any]) -> int:
        """Encode and write one sample; return the bytes it added."""
        self._check_open()
        shard = self._writer.name if self._writer is not None else self.pattern % self._next_shard
        return self.append(encode_sample(sample, encoder=self.encoder, shard=shard))

    def append(self, sample: TarSample) -> int:
        """Write an already encoded sample; return the bytes it added."""
        self._check_open()
        writer = self._writer
        if writer is not None and _starts_new_shard(
            writer.count, writer.size, sample.nbytes, self.maxcount, self.maxsize
        ):
            self._finish_shard()
            writer = None
        if writer is None:
            writer = self._writer = TarWriter(
                self.pattern % self._next_shard, encoder=self.encoder, index=self._index
            )
            self._next_shard += 1
        return writer.append(sample)

    def _check_open(self) -> None:
        if self._closed:
            raise WriterError(f"cannot write: the ShardWriter for {self.pattern!r} is closed")

    def _finish_shard(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        index = writer.close()
        self.shards.append(writer.name)
        if index is not None:
            self.indexes.append(index)
        log.info("finished %s: %d samples, %d bytes", writer.name, writer.count, writer.size)

    def close(self) -> None:
        """Finish the last shard and write the manifest. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        self._finish_shard()
        if self._manifest is not None:
            write_manifest(self._manifest, self.indexes)

    def abort(self) -> None:
        """Abandon the shard being written; finished shards stay. No manifest is written."""
        self._closed = True
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
