"""Bytes of one shard: the ``ByteSource`` primitives, local files, remote objects.

``local`` memory-maps local shards and copies samples out of the map (``_mapread.c``);
``remote`` reads byte ranges of URLs through fsspec, with retries and conditional
requests; ``cache`` keeps whole remote shards in a bounded folder.

May import: the shared modules, and ``tar/`` for one thing only: the check that a
sample's span still begins with its own tar headers (``tar.spancheck``), which must
run where the bytes are copied, before a sample leaves the source.
Must not import: ``index/``, ``order/``, ``read/``, ``write/``, ``cli/``.
"""
