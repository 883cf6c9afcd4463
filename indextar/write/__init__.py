"""Writing shards: ``TarWriter``, ``ShardWriter``, ``create``, ``reshard``, ``export``.

``sample`` and ``encode`` turn a sample dict into members; ``closing`` is what every
writer shares (``with``, ``compress=``); ``tarwriter`` writes one shard and indexes it
as it goes; ``shardwriter`` rolls over shards; ``create`` packs a folder, ``reshard``
rewrites shards through their indexes, ``export`` writes other tools' lists.

May import: the shared modules, ``tar/``, ``source/`` and ``index/``.
Must not import: ``order/``, ``read/``, ``cli/``.
"""
