"""A compressed shard made of independent frames, read at uncompressed offsets.

A shard written with ``compress="gzip"`` or ``"zstd"`` holds each sample as its own gzip
member or zstd frame; a multi-frame ``.tar.zst`` holds runs of the tar in frames. The
index records every frame's compressed and uncompressed span, so a range of the
uncompressed tar is one read of the frames that cover it, each decompressed whole: a
sample of a per-sample shard is one read of exactly its compressed bytes.

A shard of one frame (a ``.tar.zst`` written by ``tar --zstd``) has no frame to start
a sample's read at: it is read from a decompressed copy of the whole shard where its
source keeps one (:meth:`~indextar.source.base.ByteSource.decompressed_copy`: the shard
cache), and refused elsewhere.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import CompressedShardError, StaleIndexError, TruncatedShardError
from .base import (
    ByteSource,
    Span,
    SpanBytes,
    checked_key,
    corrupt_layout_error,
    outside_error,
    split_members,
)
from .codecs import decompress_frame, zstd_context

__all__ = ["FramedSource"]

_ONE_MEMBER = ("",)


class FramedSource(ByteSource):
    """The uncompressed bytes of a framed shard, over the source of its compressed bytes.

    Parameters
    ----------
    raw
        The compressed file (local or remote).
    codec
        ``"gzip"`` or ``"zstd"``.
    frames
        ``(compressed_offset, compressed_size, uncompressed_offset, uncompressed_size)``
        per data frame, in file order (the index's ``frames`` table).
    """

    __slots__ = ("url", "raw", "codec", "_frames", "_size", "_columns", "_as_members", "_whole")

    def __init__(self, raw: ByteSource, codec: str, frames: npt.NDArray[np.int64]):
        self.url = raw.url
        self.raw = raw
        self.codec = codec
        self._frames = frames
        self._size = int(frames[-1, 2] + frames[-1, 3]) if len(frames) else 0
        # The same columns as compact arrays of machine integers, for finding frames:
        # bisect and indexing on them cost a fraction of numpy's calls on one scalar.
        self._columns = tuple(
            array("q", frames[:, column].astype(np.int64).tobytes()) for column in range(4)
        )
        # Each frame's compressed bytes as one member of a "sample" at its offset: the
        # raw source's read_members then copies them out with its checks in one call
        # (a local file's _mapread: the fstat in C, the copy guarded against SIGBUS).
        self._as_members = np.zeros((len(frames), 3), np.int64)
        self._as_members[:, 1] = frames[:, 1]
        # One frame: every read goes to the whole shard decompressed, if raw keeps one.
        self._whole = raw.decompressed_copy(codec, self._size) if len(frames) == 1 else None

    @property
    def size(self) -> int:
        return self._size

    def compressed_span(self, offset: int, length: int) -> tuple[int, int, int, int]:
        """``(first frame, last frame + 1, compressed offset, compressed length)`` of the
        frames that hold uncompressed bytes ``[offset, offset + length)``."""
        if offset < 0 or length < 0 or offset + length > self._size:
            raise outside_error(self.url, offset, length, self._size)
        if len(self._frames) == 1:
            raise CompressedShardError(
                f"shard is one {self.codec} frame of {self._size} bytes decompressed: no read "
                "can start inside it, so every sample would fetch and decompress all of it; "
                "read it with remote='cache' (the cache keeps it decompressed), from the "
                "front (StreamingTarDataset), or convert a copy into a frame per sample "
                "(indextar recompress)",
                shard=self.url,
            )
        c_offsets, c_sizes, u_offsets, _ = self._columns
        first = bisect_right(u_offsets, offset) - 1
        last = max(first + 1, bisect_left(u_offsets, offset + length))
        c_start = c_offsets[first]
        c_end = c_offsets[last - 1] + c_sizes[last - 1]
        return first, last, c_start, c_end - c_start

    def decompress(self, first: int, last: int, data: SpanBytes, offset: int, length: int) -> bytes:
        """Uncompressed ``[offset, offset + length)`` from ``data``, the compressed bytes of
        frames ``first`` to ``last - 1`` (as :meth:`compressed_span` gave them)."""
        rows = self._frames[first:last].tolist()
        base, view = rows[0][0], memoryview(data)  # each frame decompressed in place
        parts = []
        for c_offset, c_size, _, u_size in rows:
            frame = decompress_frame(
                self.codec, view[c_offset - base : c_offset - base + c_size],
                shard=self.url, offset=c_offset,
            )  # fmt: skip
            if len(frame) != u_size:
                raise TruncatedShardError(
                    f"the {self.codec} frame at compressed byte offset {c_offset} holds "
                    f"{len(frame)} bytes; the index recorded {u_size}",
                    shard=self.url,
                    offset=c_offset,
                )
            parts.append(frame)
        whole = parts[0] if len(parts) == 1 else b"".join(parts)
        skip = offset - rows[0][2]
        return whole if skip == 0 and len(whole) == length else whole[skip : skip + length]

    def read(self, offset: int, length: int) -> bytes:
        if self._whole is not None:
            return self._whole.read(offset, length)
        # The common case, one whole frame (a sample of a per-sample shard), in few steps.
        c_offsets, c_sizes, u_offsets, u_sizes = self._columns
        first = bisect_right(u_offsets, offset) - 1
        if first >= 0 and offset == u_offsets[first] and length == u_sizes[first]:
            c_offset = c_offsets[first]
            data = self.raw.read_members(
                c_offset, c_sizes[first], self._as_members, first, 1, _ONE_MEMBER
            )[0][1]
            if self.codec == "zstd":
                try:  # one call where the frame records its size (the writer's frames do)
                    frame: bytes = zstd_context().decompress(data)
                except Exception:  # no content size, or corrupt: the checked path says
                    frame = decompress_frame("zstd", data, shard=self.url, offset=c_offset)
            else:
                frame = decompress_frame(self.codec, data, shard=self.url, offset=c_offset)
            if len(frame) == length:
                return frame
        first, last, c_offset, c_length = self.compressed_span(offset, length)
        return self.decompress(first, last, self.raw.read(c_offset, c_length), offset, length)

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
        """The members of the decompressed span, copied and its headers checked by
        ``_mapread`` where it is built (the reference, :func:`split_members`, in Python
        costs more than a small frame's decompression)."""
        if self._whole is not None:
            return self._whole.read_members(
                offset, length, member_rows, first, count, ext_names, key,
                check_names=check_names,
            )  # fmt: skip
        span = self.read(offset, length)
        try:
            return split_members(
                span, member_rows, first, count, ext_names, checked_key(key, check_names),
                shard=self.url, offset=offset, name=key,
            )  # fmt: skip
        except StaleIndexError as e:
            where = f"the sample at uncompressed byte offset {offset}"
            raise corrupt_layout_error(self.raw, self.url, "frames", where) from e

    def read_members_many(
        self,
        spans: Sequence[Span],
        member_rows: npt.NDArray[np.int64],
        ext_names: tuple[str, ...],
        *,
        check_names: bool = True,
    ) -> list[list[tuple[str, bytes]]]:
        """:meth:`read_members` for each sample: a frame is read and decompressed on its own
        either way."""
        if self._whole is not None:
            return self._whole.read_members_many(
                spans, member_rows, ext_names, check_names=check_names
            )
        read = self.read_members
        return [
            read(offset, length, member_rows, first, count, ext_names, key, check_names=check_names)
            for offset, length, first, count, key in spans
        ]

    def read_many(self, offsets: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        if self._whole is not None:
            return self._whole.read_many(offsets, lengths)
        spans = [self.compressed_span(o, n) for o, n in zip(offsets, lengths)]
        datas = self.raw.read_many([s[2] for s in spans], [s[3] for s in spans])
        return [
            self.decompress(first, last, data, offset, length)
            for (first, last, _, _), data, offset, length in zip(spans, datas, offsets, lengths)
        ]

    def close(self) -> None:
        self.raw.close()
        if self._whole is not None:
            self._whole.close()
