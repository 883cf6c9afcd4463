"""The options several commands share, each given only to the commands that honour it, and
the counted nouns their summaries print."""

from __future__ import annotations

import argparse

__all__ = ["add_options", "count"]

INDEX_DIR_HELP = (
    "the folder of the shards' indexes (default: next to each local shard; for URLs, "
    "$XDG_CACHE_HOME/indextar/indexes or ~/.cache/indextar/indexes)"
)


def add_options(
    parser: argparse.ArgumentParser,
    *,
    index_dir: bool = False,
    json: bool = False,
    quiet: bool = False,
) -> None:
    """Add ``--debug``, and ``--index-dir``, ``--json`` and ``--quiet`` where the
    command's handler reads them."""
    if index_dir:
        parser.add_argument("--index-dir", help=INDEX_DIR_HELP)
    if json:
        parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    if quiet:
        parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one: ``count(3, "shard")`` is ``"3 shards"``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
