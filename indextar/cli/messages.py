"""What the command line says about an error: the library's message, except where its
remedy names a library call (``build_index()``): there it names the command to run."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..errors import MissingIndexError

__all__ = ["error_message", "index_command"]

#: Shards a suggested command names; past that it says to give the same shards.
NAMED_SHARDS = 5


def error_message(error: BaseException, *, index_dir: str | None = None) -> str:
    """``str(error)``, with the command that fixes it where the library named a call.

    ``index_dir`` is the command's ``--index-dir``: the suggested command needs it too.
    """
    if isinstance(error, MissingIndexError) and error.shards:
        them = "it" if len(error.shards) == 1 else "them"
        return f"{error.problem}; build {them} with {index_command(error.shards, index_dir)}"
    return str(error)


def index_command(shards: Sequence[str], index_dir: str | None) -> str:
    """The ``indextar index`` command line that builds ``shards``' indexes, in backticks."""
    words = ["indextar", "index"]
    if index_dir is not None:
        words += ["--index-dir", index_dir]
    if len(shards) > NAMED_SHARDS:
        return f"`{shlex.join(words)}` on the same {len(shards)} shards"
    return f"`{shlex.join([*words, *shards])}`"
