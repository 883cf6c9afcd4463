"""An index file's metadata, kept as JSON in an extended attribute of the file.

A re-check of 100k shards (:mod:`indextar.index.fresh`) then reads one attribute each
instead of opening 100k SQLite files (about 20 us against 200 us). An index is
replaced by a rename, never changed in place, so the attribute on its inode always
describes that inode's contents. The jobs set it when they build or find an index.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from .meta import NAMING, READABLE_VERSIONS, IndexMeta

__all__ = ["META_XATTR", "cache_meta", "cached_meta"]

META_XATTR = "user.indextar.meta"
"""The extended attribute that holds an index file's metadata."""


def cached_meta(path: str | Path) -> IndexMeta | None:
    """The metadata kept on the index file at ``path``, if any, of a format and naming
    rules this version reads."""
    try:
        raw = os.getxattr(path, META_XATTR)
    except (OSError, AttributeError):  # no index, none set, or no xattrs here
        return None
    try:
        meta = IndexMeta(**json.loads(raw))
    except (ValueError, TypeError):
        return None
    if meta.format_version not in READABLE_VERSIONS or meta.naming != NAMING:
        return None
    return meta


def cache_meta(path: str | Path, meta: IndexMeta) -> None:
    """Keep ``meta`` in an extended attribute of the index file at ``path``, if it can."""
    try:
        os.setxattr(path, META_XATTR, json.dumps(asdict(meta)).encode())
    except (OSError, AttributeError):  # read-only, or no xattrs: the SQLite read stays
        pass
