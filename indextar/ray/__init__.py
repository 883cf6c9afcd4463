"""Ray Data over indexed shards: ``read_indextar(paths, where=..., keys=...)``.

``datasource`` has :class:`IndextarDatasource`, a ``ray.data.Datasource`` whose read
tasks each read a range of the selected samples, in shard order, straight from the
shards by their indexes; a ``where`` selection is evaluated on the indexes when the
datasource is made, so the read tasks read only the samples it keeps. Rows are a
sample's ``__key__``, ``__shard__`` and ``__index__`` and one binary column per member
extension. Ray is an optional dependency (the ``ray`` extra), imported by this room
only; ``import indextar`` does not import it.

May import: the shared modules, ``index/`` and ``read/``.
Must not import: ``tar/``, ``source/``, ``order/``, ``write/``, ``train/``, ``grain/``,
``cli/``.
"""

from .datasource import IndextarDatasource, read_indextar

__all__ = ["IndextarDatasource", "read_indextar"]
