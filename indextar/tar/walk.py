"""Finding a tar's header chain: the sequential and the vectorised walker, and the
walks built on them.

A tar is a chain of 512-byte header blocks, each followed by its member's data
rounded up to whole blocks.

* :func:`walk_sequential` reads one header at a time and jumps over the data. It
  reads only the headers, which is what large members want, and honours the sizes
  PAX headers give: it is the reference.
* :func:`walk_window` looks at every block of a window at once: blocks carrying the
  ``ustar`` magic are header candidates; their sizes give each candidate's
  successor, and the window is accepted only if the candidates form one unbroken
  chain. Dense shards (many small members) take this path. A window holding a GNU
  sparse header (whose map may run on in extension blocks) is left to the sequential
  walk.

:func:`walk_adaptive` probes with the first and switches to the second where members
turn out small; :func:`walk_parts` walks on past zero blocks through concatenated
archives. :mod:`indextar.tar.scan` sets the probe and window sizes, and decodes the
headers these walks find.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..errors import ShardFormatError, TruncatedShardError
from .blocks import BLOCK, NO_DATA_TYPES, ShardBytes, header_number
from .ext import EXTENSION_TYPES, PAX_GLOBAL, PAX_LOCAL, PendingExtensions
from .fields import MAGIC_OFFSET, cached_octal, parse_numeric
from .sparse import GNU_SPARSE, sparse_extension_blocks

__all__ = ["walk_adaptive", "walk_parts", "walk_sequential", "walk_window"]

_ZERO_BLOCK = bytes(BLOCK)
# A walk from a start offset: the header offsets and where it stopped.
_Walk = Callable[[int], tuple[npt.NDArray[np.int64], int]]
_WindowWalk = Callable[[int], tuple[npt.NDArray[np.int64] | None, int]]


def walk_parts(
    shard: ShardBytes, walk: _Walk, *, ignore_zeros: bool
) -> tuple[npt.NDArray[np.int64], int]:
    """``walk`` from the start to the end marker, and with ``ignore_zeros`` past zero
    blocks through every later part (concatenated archives, as GNU tar's
    ``--ignore-zeros`` reads them); the offsets and the last end marker."""
    parts = []
    offsets, end = walk(0)
    parts.append(offsets)
    while ignore_zeros and (start := shard.next_part(end)) is not None:
        offsets, end = walk(start)
        parts.append(offsets)
    return (np.concatenate(parts) if len(parts) > 1 else parts[0]), end


def walk_adaptive(
    shard: ShardBytes,
    start: int,
    *,
    window: _WindowWalk,
    probe_headers: int,
    dense_member_bytes: int,
) -> tuple[npt.NDArray[np.int64], int]:
    """Header offsets from ``start`` and the end-of-archive offset, choosing walkers
    as the members turn out.

    The first ``probe_headers`` headers are walked sequentially; then, while the members
    seen average under ``dense_member_bytes``, ``window`` (:func:`walk_window` over some
    window size) walks on, and wherever it declines, the sequential walk does.
    """
    chunks: list[npt.NDArray[np.int64]] = []
    probe, pos = walk_sequential(shard, start, shard.size, max_headers=probe_headers)
    chunks.append(probe)
    while pos < shard.size and not shard.is_zero_block(pos):
        # pos is a header offset still to be walked.
        walked = pos - start
        dense = len(probe) and (walked / max(1, sum(map(len, chunks)))) < dense_member_bytes
        if dense:
            found, nxt = window(pos)
            if found is not None:
                chunks.append(found)
                pos = nxt
                continue
        seq, pos = walk_sequential(shard, pos, shard.size, max_headers=probe_headers * 16)
        chunks.append(seq)
    return np.concatenate(chunks), pos


def walk_sequential(
    shard: ShardBytes,
    pos: int,
    limit: int,
    *,
    max_headers: int | None = None,
) -> tuple[npt.NDArray[np.int64], int]:
    """Walk headers from ``pos``; stop at a zero block, ``limit`` or ``max_headers``.

    Returns the header offsets walked and the offset where the walk stopped. Sizes
    given by PAX headers are honoured, so this walk is the reference.
    """
    raw, size = shard.raw, shard.size
    found: list[int] = []
    pending = PendingExtensions(shard.shard)  # only PAX sizes matter here
    try:
        while pos < limit:
            if max_headers is not None and len(found) >= max_headers:
                break
            if pos + BLOCK > size:
                raise shard.error(
                    TruncatedShardError,
                    f"shard ends inside a header: {size - pos} of 512 header bytes present",
                    pos,
                )
            # Plain bytes, not numpy: a header here is a few small slices.
            header = bytes(raw[pos : pos + BLOCK])
            if header == _ZERO_BLOCK:
                break
            typeflag = header[156]
            size_field = header[124:136]
            member_size = cached_octal(size_field)
            if member_size is None:
                member_size = header_number(size_field, "size", shard.shard, pos + 124)
            if typeflag in (PAX_LOCAL, PAX_GLOBAL):
                pending.read(typeflag, shard.read_data(pos, member_size), pos)
            elif typeflag not in EXTENSION_TYPES:
                member_size = pending.data_size(typeflag, member_size)
                pending.next_member()
            found.append(pos)
            if typeflag == GNU_SPARSE:  # its map's extension blocks come before its data
                pos += sparse_extension_blocks(shard, pos) * BLOCK
            pos += BLOCK + -(-member_size // BLOCK) * BLOCK
    except ShardFormatError:
        # A corrupt size field sends the walk into member data, where it fails
        # far from the cause: the header with the bad checksum is the better report.
        shard.check_checksums_at([*found, pos] if pos + BLOCK <= size else found)
        raise
    return np.asarray(found, dtype=np.int64), pos


def walk_window(
    shard: ShardBytes, start: int, *, window_blocks: int
) -> tuple[npt.NDArray[np.int64] | None, int]:
    """Vectorised walk of one window of ``window_blocks`` blocks from header ``start``.

    Returns the header offsets and the offset of the header after the window, or
    ``(None, start)`` when the candidates do not form one chain: a block in a
    member's data that merely looks like a header (a tar inside a tar) breaks the
    chain, and the window is then walked sequentially instead.
    """
    first_block = start // BLOCK
    nblocks = min(window_blocks, shard.size // BLOCK - first_block)
    blocks = shard.blocks[first_block : first_block + nblocks]
    # A cheap one-byte filter first, then the full magic on the survivors.
    candidate = np.flatnonzero(blocks[:, MAGIC_OFFSET] == ord("u"))
    magic = blocks[candidate, MAGIC_OFFSET + 1 : MAGIC_OFFSET + 5]
    candidate = candidate[(magic == np.frombuffer(b"star", np.uint8)).all(axis=1)]
    if candidate.size == 0 or candidate[0] != 0:
        return None, start
    rows = blocks[candidate, 124:157]
    if (rows[:, 32] == GNU_SPARSE).any():  # extension blocks may follow: walk sequentially
        return None, start
    sizes, ok = parse_numeric(rows[:, :12], values=True)
    if not ok.all():
        return None, start
    no_data = np.isin(rows[:, 32], np.frombuffer(NO_DATA_TYPES, np.uint8))
    sizes = np.where(no_data, 0, sizes)
    successor = candidate + 1 + (sizes + BLOCK - 1) // BLOCK
    if not np.array_equal(successor[:-1], candidate[1:]):
        return None, start
    next_pos = start + int(successor[-1]) * BLOCK
    # The chain's last successor must leave the window or land on a zero block
    # (the end marker); anything else inside the window is not a valid header.
    if successor[-1] < nblocks and blocks[successor[-1]].any():
        return None, start
    return (start + candidate.astype(np.int64) * BLOCK), next_pos
