"""The byte-source primitives every backend builds on.

A :class:`ByteSource` has two primitives, :attr:`~ByteSource.size` and
:meth:`~ByteSource.read`; :meth:`~ByteSource.read_many` and the member reads are built
on them, and a backend may override them to batch requests or to copy less: local
shards are :class:`~indextar.source.local.LocalFileSource`, remote ones
:class:`~indextar.source.remote.RangeSource` (ranges) and
:class:`~indextar.source.cache.CachedSource` (a local copy).

Sources open what they need lazily and never carry an open file across a fork or a
pickle: they remember the :func:`fork_generation` they opened under and reopen in any
other.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import IndexFormatError, TruncatedShardError
from ..tar.spancheck import OK, check_headers, stale_error
from .extensions import mapread

__all__ = [
    "ByteSource",
    "Span",
    "SpanBytes",
    "SpanT",
    "checked_key",
    "fork_generation",
    "corrupt_layout_error",
    "outside_error",
    "split_members",
]


SpanBytes = bytes | bytearray
SpanT = TypeVar("SpanT", bound=SpanBytes)  # a function that gives back the kind it is given
"""A span's bytes as fetched: ``bytes``, or the ``bytearray`` an answer was received
into (:mod:`~indextar.source.http11`), which the members are then copied out of once."""


class ByteSource(abc.ABC):
    """Random access to the bytes of one shard.

    Subclasses implement :attr:`size` and :meth:`read`. A source must be picklable and
    must hold no open resource across ``fork`` or pickle.
    """

    url: str

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Size of the shard in bytes."""

    @abc.abstractmethod
    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``.

        Raises
        ------
        TruncatedShardError
            If the shard ends before ``offset + length``.
        """

    def read_many(self, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        """Several ranges at once; backends with request overhead batch them."""
        read = self.read
        return [read(offset, length) for offset, length in zip(offsets, lengths)]

    def read_members(
        self,
        offset: int,
        length: int,
        member_rows: npt.NDArray[np.int64],
        first: int,
        count: int,
        ext_names: tuple[str, ...],
        key: bytes | None = None,
        *,
        check_names: bool = True,
    ) -> list[tuple[str, bytes]]:
        """A sample's ``(extension, data)`` members, from one read of its span.

        ``offset`` and ``length`` are the sample's span; ``member_rows[first : first +
        count]`` its members as ``(span_offset, size, ext_code)`` rows (the index's
        packed ``members`` array). With ``key`` (the sample's key as raw bytes), the
        span's headers are checked first (:mod:`indextar.tar.spancheck`): their names
        and checksums, or with ``check_names=False`` (a shard whose global PAX header
        names its members) their checksums only; an error names the sample by ``key``
        either way. Sources that can copy members straight out of their storage (a
        memory map) override this to skip the span's copy.
        """
        return split_members(
            self.read(offset, length), member_rows, first, count, ext_names,
            checked_key(key, check_names), shard=self.url, offset=offset, name=key,
        )  # fmt: skip

    def read_members_many(
        self,
        spans: Sequence[Span],
        member_rows: npt.NDArray[np.int64],
        ext_names: tuple[str, ...],
        *,
        check_names: bool = True,
    ) -> list[list[tuple[str, bytes]]]:
        """:meth:`read_members` for several samples, ``(offset, length, first, count,
        key)`` each, with one :meth:`read_many` of their spans."""
        datas = self.read_many([span[0] for span in spans], [span[1] for span in spans])
        return [
            split_members(
                data,
                member_rows,
                first,
                count,
                ext_names,
                checked_key(key, check_names),
                shard=self.url,
                offset=offset,
                name=key,
            )  # fmt: skip
            for (offset, _, first, count, key), data in zip(spans, datas)
        ]

    def decompressed_copy(self, codec: str, size: int) -> ByteSource | None:
        """A source of this shard decompressed whole (its ``size`` plain bytes, from a
        ``codec`` stream), where this source can keep one; ``None`` where it cannot.

        What reads a shard of one zstd frame, which no read can start inside. The shard
        cache keeps such a shard decompressed
        (:meth:`~indextar.source.cache.CachedSource.decompressed_copy`); a ranged or a
        local source cannot.
        """
        return None

    def check_unchanged(self) -> None:  # noqa: B027 (a hook: most sources check as they read)
        """Raise what a read would raise if the shard changed since this source opened it.

        For what serves bytes it kept from this source without reading it again (the
        span cache of :class:`~indextar.source.gzipped.GzipSeekSource`): a local file's
        ``fstat``; a remote object's reads are each conditional on its version, so
        nothing here.
        """

    def close(self) -> None:  # noqa: B027 (a hook: sources that hold nothing need not close)
        """Release open resources; the source reopens on the next read."""

    def __enter__(self) -> ByteSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Span = tuple[int, int, int, int, "bytes | None"]
"""A sample to read: ``(offset, length, first member row, member count, key or None)``."""


_MAPREAD = mapread()


def checked_key(key: bytes | None, check_names: bool) -> bytes | None:
    """What :func:`split_members` checks a span's headers against: ``key``, or ``b""``
    (their checksums only) where names are not checked; ``None``: nothing."""
    return key if check_names or key is None else b""


def split_members(
    span: SpanBytes,
    member_rows: npt.NDArray[np.int64],
    first: int,
    count: int,
    ext_names: tuple[str, ...],
    key: bytes | None = None,
    *,
    shard: str = "",
    offset: int = 0,
    name: bytes | None = None,
) -> list[tuple[str, bytes]]:
    """A sample's ``(extension, data)`` members, sliced out of its span's bytes.

    With ``key``, the span's headers must still be those of a member named ``key``
    (``b""``: headers with valid checksums, whatever their names): else
    :class:`~indextar.errors.StaleIndexError`, naming ``shard``, ``offset`` and the
    sample, ``name`` if given (its key where ``key`` is ``b""``), else ``key``.
    In C where it is built (``_mapread``: the headers checked and the members copied
    out in one pass); the Python below is the reference, and runs where C refuses a
    span, to raise the error that says what is wrong.
    """
    if _MAPREAD is not None and count <= _MAPREAD.MAX_MEMBERS:
        got = _MAPREAD.members(span, 0, member_rows, first, count, ext_names, key)
        if type(got) is list:
            return got
    rows = member_rows[first : first + count].tolist()
    if key is not None and rows:
        headers = bytes(span[: rows[0][0]])
        failed = check_headers(headers, key)
        if failed != OK:
            named = key if name is None else name
            raise stale_error(failed, shard=shard, offset=offset, key=named, headers=headers)
    if isinstance(span, bytes):
        return [(ext_names[code], span[start : start + size]) for start, size, code in rows]
    view = memoryview(span)  # members are bytes, copied once out of the buffer
    return [(ext_names[code], bytes(view[start : start + size])) for start, size, code in rows]


def corrupt_layout_error(raw: ByteSource, url: str, layout: str, where: str) -> IndexFormatError:
    """The error for a decompressed span (``where`` says which) whose headers are not its
    sample's (the :class:`~indextar.errors.StaleIndexError` of :func:`split_members`,
    which the caller chains), of the compressed file ``raw``. If the file changed,
    ``raw.check_unchanged()`` raises its own ``StaleIndexError``; else the index is
    corrupt, its ``layout`` (frames or seek points) mapping the sample onto other bytes,
    and this :class:`~indextar.errors.IndexFormatError` says so."""
    raw.check_unchanged()
    return IndexFormatError(
        f"the index of {url!r} is corrupt: its {layout} decompress {where} to other bytes "
        "than the sample's tar headers, though the shard is unchanged; rebuild the index "
        "with build_index(shard, force=True)"
    )


def outside_error(url: str, offset: int, length: int, size: int) -> TruncatedShardError:
    """The refusal of a read of ``[offset, offset + length)`` from a decompressed shard of
    ``size`` bytes that does not hold it."""
    return TruncatedShardError(
        f"range [{offset}, {offset + length}) is outside the decompressed shard ({size} bytes)",
        shard=url,
        offset=offset,
    )


# Incremented in every forked child: objects that opened something compare it with the
# value they opened under, which is cheaper than os.getpid() (a system call) per read.
# LocalFileSource reads it as ``base._fork_generation``, one attribute load per read.
_fork_generation = 0


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


def fork_generation() -> int:
    """A number that changes in every forked child process (see :func:`os.register_at_fork`)."""
    return _fork_generation
