"""How a dataset reads remote shards: by ranged requests, or through the shard cache."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..index.meta import _read_meta
from ..index.remote import default_cache_root, default_index_dir, expected_stat, open_remote_index
from ..index.shard import ShardIndex
from ..source.base import ByteSource
from ..source.cache import CachedSource, ShardCache
from ..source.frames import FramedSource
from ..source.remote import RangeSource, fetch_ranges

__all__ = ["RemoteOptions", "fetch_ranges", "fetch_spans"]

Strategy = Literal["ranges", "cache"]


@dataclass(frozen=True, slots=True)
class RemoteOptions:
    """A dataset's choices for its remote shards.

    Attributes
    ----------
    strategy
        ``"ranges"``: one ranged request per sample, batches in flight together.
        ``"cache"``: whole shards downloaded into ``cache`` and read locally.
    index_dir
        Local folder of the remote shards' indexes.
    cache
        The shard cache (``"cache"`` only).
    storage_options
        fsspec options for every remote shard.
    max_in_flight
        Requests a batch keeps in flight at once.
    """

    strategy: Strategy
    index_dir: Path
    cache: ShardCache | None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    max_in_flight: int = 64

    @classmethod
    def make(
        cls,
        strategy: str,
        index_dir: str | os.PathLike[str] | None,
        *,
        cache_dir: str | os.PathLike[str] | None,
        cache_limit: int | str,
        storage_options: Mapping[str, Any] | None,
    ) -> RemoteOptions:
        """Check the dataset's ``remote=`` arguments and fill in the default folders."""
        if strategy not in ("ranges", "cache"):
            raise ValueError(f"remote= must be 'ranges' or 'cache', got {strategy!r}")
        folder = Path(index_dir) if index_dir is not None else default_index_dir()
        cache = None
        if strategy == "cache":
            cache = ShardCache(
                cache_dir if cache_dir is not None else default_cache_root() / "shards",
                limit=cache_limit,
                storage_options=storage_options,
            )
        return cls(
            "ranges" if strategy == "ranges" else "cache",
            folder,
            cache,
            dict(storage_options or {}),
        )

    def index(self, url: str, path: str | None, *, build_missing: bool) -> ShardIndex:
        """The index of remote shard ``url``: at ``path`` if known (no request), else found
        or built."""
        if path is not None and Path(path).exists():
            return ShardIndex(shard=url, path=Path(path), meta=_read_meta(Path(path)))
        return open_remote_index(
            url,
            index_dir=self.index_dir,
            storage_options=self.storage_options,
            build_missing=build_missing,
        )

    def source(self, url: str, index: ShardIndex) -> ByteSource:
        """The byte source of ``url``, checked against the object version ``index`` describes."""
        expected = expected_stat(index.meta)
        if self.cache is not None:
            return CachedSource(url, cache=self.cache, expected=expected)
        return RangeSource(
            url,
            expected=expected,
            storage_options=self.storage_options,
            max_in_flight=self.max_in_flight,
        )


def fetch_spans(
    sources: Sequence[ByteSource],
    offsets: Sequence[int],
    lengths: Sequence[int],
    *,
    max_in_flight: int = 64,
    keys: Sequence[str] | None = None,
) -> list[bytes]:
    """What :func:`fetch_ranges` gives, where some sources are compressed shards' sources
    of uncompressed bytes: a per-sample shard's ranges become the ranges of its frames,
    all in flight together and then decompressed; a ``.tar.gz`` read through seek points
    fetches from the point before each range, one range after another. ``keys[i]``, if
    given, names the sample of range ``i`` in errors."""
    if all(isinstance(source, RangeSource) for source in sources):
        return fetch_ranges(
            sources,  # type: ignore[arg-type]
            offsets, lengths, max_in_flight=max_in_flight, keys=keys,
        )  # fmt: skip
    results: list[bytes | None] = [None] * len(sources)
    batched: list[tuple[int, RangeSource, int, int]] = []  # (position, raw, offset, length)
    framed: dict[int, tuple[FramedSource, tuple[int, int, int, int]]] = {}
    for i, (source, offset, length) in enumerate(zip(sources, offsets, lengths)):
        if isinstance(source, RangeSource):
            batched.append((i, source, offset, length))
        elif isinstance(source, FramedSource) and isinstance(source.raw, RangeSource):
            span = source.compressed_span(offset, length)
            framed[i] = (source, span)
            batched.append((i, source.raw, span[2], span[3]))
        else:
            results[i] = source.read(offset, length)
    fetched = fetch_ranges(
        [raw for _, raw, _, _ in batched],
        [offset for _, _, offset, _ in batched],
        [length for _, _, _, length in batched],
        max_in_flight=max_in_flight,
        keys=None if keys is None else [keys[i] for i, _, _, _ in batched],
    )
    for (i, _, _, _), data in zip(batched, fetched):
        if i in framed:
            source, (first, last, _, _) = framed[i]
            data = source.decompress(first, last, data, offsets[i], lengths[i])
        results[i] = data
    return [r for r in results if r is not None]
