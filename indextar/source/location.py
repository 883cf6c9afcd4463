"""Where a shard lives, decided once from its name: a local file or a remote object.

A :class:`ShardLocation` is made from a path or URL once (:meth:`ShardLocation.of`);
what follows asks it, never the string: whether it is remote, its raw bytes checked
against the version its index recorded (:meth:`~ShardLocation.open_raw`), where its
index lives (:meth:`~ShardLocation.index_path`) and its codec
(:meth:`~ShardLocation.codec`, from its first bytes).

A name with a URL scheme (``s3://``, ``https://``, ...; not ``file://``) is remote and
read through fsspec. :data:`~indextar.source.filesystems.REMOTE_SCHEMES` registers the
package each scheme needs, as fsspec's ``known_implementations`` do, so that a missing
one is named in the ImportError (:func:`~indextar.source.filesystems.scheme_package`;
both kept beside the filesystems they open, and named here too); an unregistered
scheme is tried with fsspec all the same.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Union

from ..errors import PipeRefusedError
from ..tar.compress import sniff_codec
from .base import ByteSource
from .cache import ShardCache
from .conditional import RemoteStat
from .filesystems import REMOTE_SCHEMES, scheme_package
from .fillcache import cache_source
from .local import FileVersion, open_source
from .remote import RangeSource

__all__ = [
    "ALLOW_PIPE_ENV",
    "INDEX_SUFFIX",
    "REMOTE_SCHEMES",
    "Recorded",
    "ShardLocation",
    "SourceOptions",
    "check_pipe_allowed",
    "remote_shards",
    "scheme_package",
    "url_scheme",
]

ALLOW_PIPE_ENV = "INDEXTAR_ALLOW_PIPE"
"""Set to ``1`` to allow ``pipe:`` shards everywhere, as ``allow_pipe=True`` does."""


def check_pipe_allowed(url: str, allow_pipe: bool) -> None:
    """Refuse a ``pipe:CMD`` shard unless the caller or the environment allows it."""
    if url.startswith("pipe:") and not (allow_pipe or os.environ.get(ALLOW_PIPE_ENV) == "1"):
        raise PipeRefusedError(
            f"refusing the shard {url[:60]!r}: a pipe: shard runs a shell command; pass "
            f"allow_pipe=True or set the environment variable {ALLOW_PIPE_ENV}=1 if you trust it"
        )


PathLike = Union[str, "os.PathLike[str]"]

INDEX_SUFFIX = ".idx.sqlite"


def url_scheme(name: str) -> str:
    """The URL scheme of ``name`` if it names a remote object (``scheme://...``), else
    ``""``: the one test of whether a shard is remote (``file://`` names a local file,
    and so does a path with ``://`` inside it). 60 ns for a path."""
    head, sep, _ = name.partition("://")
    return head if sep and head.isidentifier() and head != "file" else ""


def remote_shards(names: Sequence[str]) -> frozenset[int]:
    """The positions of the remote shards among ``names`` (a dataset's, once: a
    :class:`ShardLocation` each would cost 2 us a shard)."""
    return frozenset(n for n, name in enumerate(names) if url_scheme(name))


class Recorded(Protocol):
    """What an index records of its shard's version (an
    :class:`~indextar.index.meta.IndexMeta` is one)."""

    @property
    def shard_size(self) -> int: ...
    @property
    def shard_mtime_ns(self) -> int: ...
    @property
    def etag(self) -> str: ...


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """How a remote shard's bytes are read: fsspec's ``storage_options``, by ranged
    requests (``max_in_flight`` of a batch at once) or through the whole-shard ``cache``.
    A local shard needs none of them."""

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    cache: ShardCache | None = None
    max_in_flight: int = 64


@dataclass(frozen=True, slots=True)
class ShardLocation:
    """A shard's path or URL, ``name``, and its URL ``scheme`` (``""``: a local file)."""

    name: str
    scheme: str = ""

    @classmethod
    def of(cls, shard: PathLike | ShardLocation) -> ShardLocation:
        """The location of ``shard``, a local path (``file://`` URLs too) or a URL."""
        if isinstance(shard, ShardLocation):
            return shard
        name = os.fspath(shard)
        scheme = url_scheme(name)
        return cls(name, scheme) if scheme else cls(name.removeprefix("file://"))

    @property
    def remote(self) -> bool:
        return bool(self.scheme)

    def open_raw(self, recorded: Recorded, options: SourceOptions | None = None) -> ByteSource:
        """The shard's bytes as they are stored (compressed ones compressed), every read
        checked against the version its index ``recorded``: a local file's size and
        mtime, an object's size and ETag."""
        if not self.remote:
            return open_source(self.name, FileVersion(recorded.shard_size, recorded.shard_mtime_ns))
        expected = RemoteStat(recorded.shard_size, recorded.etag)
        options = options or SourceOptions()
        if options.cache is not None:
            return cache_source(self.name, options.cache, expected)
        return RangeSource(
            self.name,
            expected=expected,
            storage_options=options.storage_options,
            max_in_flight=options.max_in_flight,
        )

    def codec(self, source: ByteSource | None = None) -> str | None:
        """``"gzip"`` or ``"zstd"`` if the shard is so compressed, ``None`` for a plain tar,
        from its first bytes (:func:`~indextar.tar.compress.sniff_codec`): read from
        ``source``, an open raw source of the shard, if given."""
        if source is None and not self.remote:
            with open(self.name, "rb") as f:
                return sniff_codec(f.read(8))
        if source is None:
            source = RangeSource(self.name)
        size = source.size
        return sniff_codec(source.read(0, min(8, size))) if size else None

    def index_path(self, index_dir: PathLike | None) -> Path:
        """Where the shard's index lives.

        A local shard's is next to it by default; in ``index_dir`` the file name also
        carries a hash of the shard's absolute path, so that equally named shards from
        different folders do not collide. A remote shard's is in ``index_dir`` (which
        it needs), under its name plus a hash of its URL.
        """
        if self.remote:
            if index_dir is None:
                raise ValueError(f"remote shard {self.name!r} needs an index_dir for its index")
            digest = hashlib.blake2b(self.name.encode(), digest_size=6).hexdigest()
            name = self.name.rstrip("/").rpartition("/")[2]
            return Path(index_dir) / f"{name}.{digest}{INDEX_SUFFIX}"
        shard_path = Path(self.name)
        if index_dir is None:
            return shard_path.with_name(shard_path.name + INDEX_SUFFIX)
        digest = hashlib.blake2b(str(shard_path.resolve()).encode(), digest_size=6).hexdigest()
        return Path(index_dir) / f"{shard_path.name}.{digest}{INDEX_SUFFIX}"

    def __str__(self) -> str:
        return self.name
