"""Reading samples: open shards, ``IndexedTarDataset``, ``StreamingTarDataset``.

``shard`` holds one opened shard's arrays and byte source; ``dataset`` is the
map-style dataset; ``decode`` turns members into values; ``lookup`` finds samples by
key; ``streaming`` reads shards front to back; ``remote_options`` chooses how remote
shards are read.

May import: the shared modules, ``tar/``, ``source/``, ``index/`` and ``order/``.
Must not import: ``write/``, ``cli/``.
"""
