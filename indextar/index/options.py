"""How to build shards' indexes: one bundle of options, from the CLI or
:func:`~indextar.build_indexes` through each job (:mod:`.jobs`) to
:func:`~indextar.build_index` and the remote scan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..source.forward import ScanMode
from .attribute_json import OnError
from .checksums import ChecksumsArg
from .decompress import DEFAULT_SEEK_SPACING

__all__ = ["BuildOptions"]


@dataclass(frozen=True, slots=True)
class BuildOptions:
    """How to build each shard's index (see :func:`~indextar.build_indexes`).

    ``index_dir`` is required for remote shards (a local or shared folder);
    ``upload`` also puts each remote shard's index next to it as ``<url>.idx.sqlite``;
    ``remote_mode`` is how a remote shard is read (:mod:`indextar.source.forward`);
    the others are :func:`~indextar.build_index`'s.
    """

    index_dir: str | None = None
    force: bool = False
    ignore_zeros: bool = False
    meta: str | None = None
    on_error: OnError = "fail"
    upload: bool = False
    storage_options: dict[str, Any] | None = None
    remote_mode: ScanMode = "auto"
    seek_spacing: int = DEFAULT_SEEK_SPACING
    checksums: ChecksumsArg = False
