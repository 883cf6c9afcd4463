"""Whether a shard's sample spans name their keys, checked once when it is indexed.

Every read checks that a sample's span still begins with headers naming its key
(:mod:`indextar.tar.spancheck`). The rule sees only the headers inside the span; a
global PAX header earlier in the archive can name members too, and then a good shard
would be refused on every read. So an index build runs the same check over every
sample, and records in the index whether names can be checked (``span_names``); where
not, reads check the headers' checksums only.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..source import extensions
from ..tar.scan import TarScan
from ..tar.spancheck import OK, check_headers
from .naming import Grouping

__all__ = ["spans_name_their_keys", "headers_name_their_keys"]

log = logging.getLogger(__name__)


def spans_name_their_keys(
    buf: mmap.mmap | bytes, scan: TarScan, grouping: Grouping, *, shard: str
) -> bool:
    """Whether every sample's span in ``buf`` (the shard's bytes) names its key."""
    if not grouping.keys:
        return True
    starts, header_lens, keys = _sample_headers(scan, grouping)
    return _named(_first_failing(buf, starts, header_lens, keys), grouping, shard)


def headers_name_their_keys(
    read: Callable[[int, int], bytes], scan: TarScan, grouping: Grouping, *, shard: str
) -> bool:
    """:func:`spans_name_their_keys` where only the headers are at hand: ``read(start,
    end)`` gives the shard's bytes ``[start, end)`` for each sample's leading headers
    (a streamed scan keeps those)."""
    if not grouping.keys:
        return True
    starts, header_lens, keys = _sample_headers(scan, grouping)
    headers = b"".join([read(s, s + n) for s, n in zip(starts.tolist(), header_lens.tolist())])
    packed = np.zeros(len(starts), np.int64)
    np.cumsum(header_lens[:-1], out=packed[1:])
    return _named(_first_failing(headers, packed, header_lens, keys), grouping, shard)


def _sample_headers(
    scan: TarScan, grouping: Grouping
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], list[bytes]]:
    """Where each sample's first member's headers start, their length, and its key."""
    rows = grouping.entries[grouping.first_member]
    starts = scan.header_offsets[rows].astype(np.int64)
    header_lens = (scan.data_offsets[rows] - starts).astype(np.int64)
    keys = [key.encode("utf-8", "surrogateescape") for key in grouping.keys]
    return starts, header_lens, keys


def _first_failing(
    buf: mmap.mmap | bytes,
    starts: npt.NDArray[np.int64],
    header_lens: npt.NDArray[np.int64],
    keys: list[bytes],
) -> int:
    mapread = extensions.mapread()
    if mapread is not None:
        return int(mapread.first_failing(buf, starts, header_lens, keys))
    return next(
        (
            i
            for i, (start, length, key) in enumerate(
                zip(starts.tolist(), header_lens.tolist(), keys)
            )
            if check_headers(buf[start : start + length], key) != OK
        ),
        -1,
    )


def _named(failing: int, grouping: Grouping, shard: str) -> bool:
    if failing >= 0:
        log.info(
            "%s: sample %r is not named by its own headers (a global PAX header names it); "
            "reads of this shard check header checksums, not names",
            shard,
            grouping.keys[failing],
        )
    return failing < 0
