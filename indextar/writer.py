"""Write WebDataset shards that are deterministic and indexed as they are written.

:class:`TarWriter` writes one shard, :class:`ShardWriter` a numbered series of them.
Both differ from webdataset's writers of the same names in four ways:

* **Deterministic.** Members are sorted by extension and every header has the same
  mode, owner and mtime (:mod:`indextar.tarheader`), so equal samples give
  byte-identical shards.
* **Indexed as written.** The writer knows every offset, so on close it writes the
  shard's ``<shard>.idx.sqlite`` without reading the shard again. The index has the
  same rows :func:`~indextar.build_index` would write.
* **Sizes are real.** ``maxsize`` counts what lands on disk: headers, padding and the
  end-of-archive blocks. A shard exceeds it only when a single sample is larger than
  ``maxsize``; such a sample gets a shard of its own.
* **Crash-safe.** A shard is written to a hidden temporary file in the target folder
  and renamed into place on close. An exception inside ``with`` deletes it, so a
  shard under its final name is always complete.

The work is split by job; this module gathers their names in one place:

* :mod:`indextar.tarsample`: encode a sample dict (:func:`encode_sample`,
  :class:`TarSample`) and check its key (:func:`check_key`);
* :mod:`indextar.tarwriter`: :class:`TarWriter`, one shard and its index;
* :mod:`indextar.shardwriter`: :class:`ShardWriter` and :func:`plan_shards`, a
  numbered series of shards and their manifest.
"""

from .shardwriter import ShardWriter, plan_shards
from .tarsample import TarSample, check_key, encode_sample
from .tarwriter import PathLike as PathLike
from .tarwriter import TarWriter

__all__ = [
    "TarWriter",
    "ShardWriter",
    "TarSample",
    "encode_sample",
    "check_key",
    "plan_shards",
]
