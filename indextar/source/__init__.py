"""Bytes of one shard: where it lives, the ``ByteSource`` primitives, local files,
remote objects.

``location`` decides once whether a shard is a local file or a remote object (by URL
scheme), and knows its raw bytes, where its index lives and its codec: no other module
looks at a name for a scheme (``tests/test_layering.py`` counts the places), but
``filesystems``, the scheme registry, which splits a remote URL for its backend;
``patterns`` expands brace patterns, globs and folders into shards; ``base`` is the
``ByteSource`` primitives and what is built on them; ``local`` memory-maps local
shards and copies samples out of the map (``_mapread.c``; ``extensions`` loads it and
``_gunzip.c``); ``remote`` reads byte ranges of URLs with retries, through
``filesystems`` (fsspec by URL scheme, with the package each scheme needs) and
``conditional`` (object versions: reads conditional on the ETag an index recorded),
which reach under fsspec's public API only through ``fsspec_internals``; ``s3direct``
sends S3 ranged GETs with ``http11`` (a small HTTP/1.1 client on keep-alive
connections), signed by ``sigv4``, without botocore's request pipeline; ``stream`` reads
an object front to back in ranged chunks, ``objectstream`` by one streaming GET (http,
s3) resumed where it broke, sent by ``streamgets``; ``forward`` reads one forward for a
scan, streamed or by ranged reads of what is asked for; ``cache`` keeps whole remote
shards in a bounded folder.

May import: the shared modules, and ``tar/`` for two things only: the check that a
sample's span still begins with its own tar headers (``tar.spancheck``), which must
run where the bytes are copied, before a sample leaves the source; and what a
compressed shard's magic bytes say (``tar.compress``).
Must not import: ``index/``, ``order/``, ``read/``, ``write/``, ``cli/``.
"""
