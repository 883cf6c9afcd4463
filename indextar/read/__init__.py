"""Reading samples: open shards, ``IndexedTarDataset``, ``StreamingTarDataset``.

``shard`` holds one opened shard's arrays and byte source; ``entries`` lists a
dataset's shards and opens each one's index; ``dataset`` is the map-style dataset;
``decode`` turns members into values; ``image`` decodes images straight to training
size (``image_decoder``); ``pool`` decodes a batch in threads; ``sample`` makes what
both datasets return for a sample (``decode=``, ``keys=``); ``lookup`` finds samples by
key; ``subset`` holds key and ``where`` views; ``selection`` evaluates SQL over the
indexes (``ds.where``, ``bucket_ids``); ``streaming`` reads shards front to back;
``remote_options`` chooses how remote shards are read; ``lengths`` finds documents'
token counts in the index and ``packed`` serves packs of them (``PackedDataset``).

May import: the shared modules, ``tar/``, ``source/``, ``index/`` and ``order/``.
Must not import: ``write/``, ``cli/``.
"""
