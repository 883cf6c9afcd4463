"""Grain's data source over indexed shards: ``source(ds)``.

``datasource`` has :class:`GrainSource`, what :func:`source` wraps a map-style dataset
in (an :class:`~indextar.IndexedTarDataset`, a ``where``/``select`` view of one, a
``MixtureDataset``): Grain's ``RandomAccessDataSource`` protocol (``__len__``,
``__getitem__``, the batched ``_getitems``), safe to call from Grain's reading threads,
picklable for its worker processes, with a ``repr`` that names exactly which samples it
serves, which Grain's ``DataLoader`` checkpoints compare. The protocol is structural:
this room never imports Grain, which only the caller's pipeline needs (the ``grain``
extra); ``import indextar`` does not import this room.

May import: the shared modules and ``read/``.
Must not import: ``tar/``, ``source/``, ``index/``, ``order/``, ``write/``, ``train/``,
``ray/``, ``cli/``.
"""

from .datasource import GrainSource, MapStyle, source

__all__ = ["GrainSource", "MapStyle", "source"]
