"""GNU sparse members (type ``S``, as ``tar --sparse --format=gnu`` writes them).

A GNU sparse header holds the first four entries of the member's sparse map (offset
and length of each stored data region) and a flag, at byte 482, saying that
extension blocks follow it. Each extension block holds 21 more entries and the same
flag, at byte 504. The member's data, only the stored regions, follows the last
extension block; its size field counts only those regions.

A sparse member's stored bytes are not its contents (the holes are missing), so
indextar refuses it by name rather than indexing the wrong bytes. The walkers use
:func:`sparse_extension_blocks` to step over the map to the next header, so that the
refusal names the member instead of calling the map's blocks corrupt headers.
Multi-volume continuations (type ``M``), whose data starts inside a file, are refused
alongside them (:func:`multivolume_error`), by the scan and by the stream alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import TruncatedShardError, UnsupportedMemberError
from .blocks import BLOCK, ShardBytes
from .ext import EXTENSION_TYPES, fold_extensions
from .fields import parse_octal

__all__ = [
    "GNU_MULTIVOL",
    "GNU_SPARSE",
    "multivolume_error",
    "sparse_error",
    "sparse_extension_blocks",
    "unsupported_member_error",
]

GNU_SPARSE = ord("S")
GNU_MULTIVOL = ord("M")  # a multi-volume continuation: refused with sparse members
_HEADER_EXTENDED = 482  # in the header: more map entries follow in extension blocks
_BLOCK_EXTENDED = 504  # in an extension block: after its 21 entries of 24 bytes
_REAL_SIZE = slice(483, 495)  # the file's size, holes included


def sparse_extension_blocks(shard: ShardBytes, header_pos: int) -> int:
    """How many sparse-map extension blocks follow the ``S`` header at ``header_pos``."""
    count = 0
    flag_at = header_pos + _HEADER_EXTENDED
    while shard.raw[flag_at] != 0:
        count += 1
        block = header_pos + count * BLOCK
        if block + BLOCK > shard.size:
            raise shard.error(
                TruncatedShardError,
                f"shard ends inside the sparse map of the GNU sparse member at {header_pos}: "
                f"extension block {count} would start at {block}, the file has {shard.size} bytes",
                header_pos,
            )
        flag_at = block + _BLOCK_EXTENDED
    return count


def sparse_error(
    header: bytes, name: str, shard: str | None, offset: int
) -> UnsupportedMemberError:
    """The refusal of the GNU sparse member ``name`` whose (``S``) header is ``header``."""
    real_size = parse_octal(header[_REAL_SIZE])
    size = f" of {real_size} bytes" if real_size else ""
    return UnsupportedMemberError(
        f"member {name!r} is a GNU sparse file{size}: its stored data leaves out the holes, "
        "and indextar cannot give random access to it (re-create the shard without --sparse)",
        shard=shard,
        offset=offset,
    )


def multivolume_error(name: str, shard: str | None, offset: int) -> UnsupportedMemberError:
    """The refusal of the member ``name`` whose (``M``) header continues a multi-volume file."""
    return UnsupportedMemberError(
        f"member {name!r} is a multi-volume continuation; indextar cannot give random access "
        "to it (re-create the shard without --multi-volume)",
        shard=shard,
        offset=offset,
    )


def unsupported_member_error(
    shard: ShardBytes,
    offsets: npt.NDArray[np.int64],
    types: npt.NDArray[np.uint8],
    sizes: npt.NDArray[Any],
    raw_names: list[bytes],
    i: int,
) -> UnsupportedMemberError:
    """The refusal of header ``i`` (of all headers at ``offsets``), a GNU sparse file or a
    multi-volume continuation, by its full name and at its first extension header."""
    first = i
    while first > 0 and int(types[first - 1]) in EXTENSION_TYPES:
        first -= 1
    part = slice(first, i + 1)
    folded = fold_extensions(shard, offsets[part], types[part].copy(), sizes[part], raw_names[part])
    name, where = folded.names[-1], int(folded.header_offsets[-1])
    if types[i] == GNU_SPARSE:
        return sparse_error(shard.blocks[offsets[i] // BLOCK].tobytes(), name, shard.shard, where)
    return multivolume_error(name, shard.shard, where)
