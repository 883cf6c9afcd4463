"""Shard patterns: brace expansion and globs, into an ordered list of shards."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

import braceexpand

from .errors import ShardNotFoundError

__all__ = ["expand_shards", "is_url"]

_GLOB_CHARS = frozenset("*?[")


def is_url(path: str) -> bool:
    """Whether ``path`` names a remote object (``scheme://...``) rather than a local file."""
    head, sep, _ = path.partition("://")
    return bool(sep) and head.isidentifier() and head != "file"


def expand_shards(patterns: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Expand brace patterns and globs into a list of shards, in the order given.

    ``'data-{000000..000099}.tar'`` expands by brace rules (``braceexpand``);
    a pattern with ``*``, ``?`` or ``[`` is a glob and expands to the sorted
    matching files. Duplicates keep their first position.

    >>> expand_shards("x-{0..2}.tar")
    ['x-0.tar', 'x-1.tar', 'x-2.tar']

    Raises
    ------
    ShardNotFoundError
        If a glob matches nothing, or the patterns give no shard at all.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    shards: dict[str, None] = {}
    for pattern in patterns:
        for expanded in braceexpand.braceexpand(os.fspath(pattern)):
            if not is_url(expanded) and _GLOB_CHARS & set(expanded):
                matches = sorted(glob.glob(expanded))
                if not matches:
                    raise ShardNotFoundError(f"pattern {expanded!r} matches no file")
                shards.update(dict.fromkeys(matches))
            else:
                shards[expanded] = None
    if not shards:
        raise ShardNotFoundError(f"no shards given (patterns: {patterns!r})")
    return list(shards)
