"""Shard patterns: brace expansion and globs, into an ordered list of shards.

A URL is kept as given, a local path is globbed or listed: which is which is the
:class:`~indextar.source.location.ShardLocation`'s to say.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

import braceexpand

from ..errors import ShardNotFoundError
from .location import ShardLocation

__all__ = ["expand_shards"]

_GLOB_CHARS = frozenset("*?[")


def expand_shards(patterns: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[str]:
    """Expand brace patterns and globs into a list of shards, in the order given.

    ``'data-{000000..000099}.tar'`` expands by brace rules (``braceexpand``);
    a pattern with ``*``, ``?`` or ``[`` is a glob and expands to the sorted
    matching files; a local folder expands to the ``.tar`` files in it, sorted.
    ``file://`` URLs are local paths.
    Duplicates keep their first position.

    >>> expand_shards("x-{0..2}.tar")
    ['x-0.tar', 'x-1.tar', 'x-2.tar']

    Raises
    ------
    ShardNotFoundError
        If a glob or a folder gives no shard, or the patterns give none at all.
    """
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    shards: dict[str, None] = {}
    for pattern in patterns:
        for expanded in braceexpand.braceexpand(os.fspath(pattern)):
            location = ShardLocation.of(expanded)  # file:// URLs are local paths
            expanded = location.name
            if location.remote:
                shards[expanded] = None
            elif not expanded.endswith(".tar") and os.path.isdir(expanded):  # no stat per shard
                inside = glob.glob(os.path.join(glob.escape(expanded), "*.tar"))
                matches = sorted(path for path in inside if os.path.isfile(path))
                if not matches:
                    raise ShardNotFoundError(f"folder {expanded!r} holds no .tar shard")
                shards.update(dict.fromkeys(matches))
            elif _GLOB_CHARS & set(expanded):
                matches = sorted(glob.glob(expanded))
                if not matches:
                    raise ShardNotFoundError(f"pattern {expanded!r} matches no file")
                shards.update(dict.fromkeys(matches))
            else:
                shards[expanded] = None
    if not shards:
        raise ShardNotFoundError(f"no shards given (patterns: {patterns!r})")
    return list(shards)
