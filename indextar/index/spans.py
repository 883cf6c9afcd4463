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

import numpy as np

from .. import native
from ..tar.scan import TarScan
from ..tar.spancheck import OK, check_headers
from .naming import Grouping

__all__ = ["spans_name_their_keys"]

log = logging.getLogger(__name__)


def spans_name_their_keys(
    buf: mmap.mmap | bytes, scan: TarScan, grouping: Grouping, *, shard: str
) -> bool:
    """Whether every sample's span in ``buf`` (the shard's bytes) names its key."""
    if not grouping.keys:
        return True
    rows = grouping.entries[grouping.first_member]
    starts = scan.header_offsets[rows].astype(np.int64)
    header_lens = (scan.data_offsets[rows] - starts).astype(np.int64)
    keys = [key.encode("utf-8", "surrogateescape") for key in grouping.keys]
    mapread = native.mapread()
    if mapread is not None:
        failing = int(mapread.first_failing(buf, starts, header_lens, keys))
    else:
        failing = next(
            (
                i
                for i, (start, length, key) in enumerate(
                    zip(starts.tolist(), header_lens.tolist(), keys)
                )
                if check_headers(buf[start : start + length], key) != OK
            ),
            -1,
        )
    if failing >= 0:
        log.info(
            "%s: sample %r is not named by its own headers (a global PAX header names it); "
            "reads of this shard check header checksums, not names",
            shard,
            grouping.keys[failing],
        )
    return failing < 0
