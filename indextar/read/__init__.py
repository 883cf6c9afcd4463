"""Reading samples: open shards, ``IndexedTarDataset``, ``StreamingTarDataset``.

``shard`` holds one opened shard's arrays and byte source, and the LRU of a process's
open shards; ``entries`` lists a
dataset's shards from their indexes (each is opened by ``index.opener``); ``dataset``
is the map-style dataset; ``decode`` turns members into values; ``image`` decodes
images straight to training size (``image_decoder``); ``pool`` decodes a batch in
threads; ``encoded``, ``shmblocks``, ``sniff``, ``resize``, ``staging``, ``gpu``,
``gpu_dali`` and ``staged`` are the GPU image stage (``on_gpu``: workers hand over
encoded images as one tensor, in shared-memory blocks they reuse, and the training
process decodes them on the device); ``sample`` makes what both
datasets return for a sample (``decode=``, ``keys=``); ``lookup`` finds samples by key;
``subset`` holds key and ``where`` views;
``selection`` evaluates SQL over the indexes (``ds.where``, ``bucket_ids``);
``streaming`` reads shards front to back; ``remote_options`` makes a dataset's
options for opening shards (how remote ones are read) and fetches a batch's remote
spans together; ``lengths`` finds documents' token counts in the index and
``packed`` serves packs of them (``PackedDataset``), whose lengths and plans
``packcache`` caches on disk; ``keyjoin`` plans the join of two
datasets by key from their indexes (``extensions`` loads its C hash join), ``joined``
serves the joined view (``JoinedDataset``) and ``joining`` gives the dataset its
``join``. ``protocols`` says what the views
and ``MixtureDataset`` use of a dataset (``IndexedShards``, ``BatchReader``), so that
none of them imports ``dataset``.

May import: the shared modules, ``tar/``, ``source/``, ``index/`` and ``order/``.
Must not import: ``write/``, ``cli/``.
"""
