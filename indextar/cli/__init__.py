"""The ``indextar`` command (also ``python -m indextar``): the only room that prints or exits.

``commands`` parses arguments and runs ``index``, ``info``, ``verify`` and the rest;
``tools`` adds the commands that create, reshard, list and export shards; ``query``
adds ``query`` and ``meta import`` (per-sample attributes); ``options``
gives each command the shared options (``--json``, ``--quiet``, ...) it honours.

May import: every room.
Must not import: ``tools/`` (the benchmarks and scripts beside the package).
"""

from .commands import main

__all__ = ["main"]
