"""One shard's SQLite index, and many shards' builds.

``shard`` builds and finds one index, ``meta`` is an opened index: what it records of
the shard it was built from, validated (``meta_cache`` keeps it on the index file, for
quick re-checks); ``tables`` writes its tables (``schema.sql``, ``_sqlitebulk.c``,
loaded by ``extensions``), ``spans`` checks at build time that every sample's headers
name it; ``naming`` groups members into samples; ``arrays`` packs and reads the reader's
arrays, and a compressed shard's frames or seek points with the source that decompresses
it; ``attributes`` stores per-sample attributes (optional tables), which
``attribute_json`` reads from each sample's JSON member (``attributes_from="json"``) and
``attribute_import`` joins in from a parquet table; ``checksums`` hashes each sample's
span (``checksums=``), which reads check; ``members`` and ``verify`` read and check the
tables; ``build`` indexes many shards on any executor, each as a ``jobs`` job (``jobs``
also checks fresh shards on a stat); ``manifest`` lists a dataset's shards; ``remote``
finds, fetches or builds the index of a remote shard, scanning it as it streams;
``opener`` is the one door to a shard: its index and its bytes, from its
``source.location`` (every reader, tool and the CLI opens shards by it); ``localscan``
is the one scan of a local shard, plain or compressed, that a build and ``verify``
share; ``options`` is the build options.

May import: the shared modules, ``tar/`` and ``source/``.
Must not import: ``order/``, ``read/``, ``write/``, ``cli/``.
"""
