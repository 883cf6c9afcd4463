"""How a dataset opens its shards, and reads remote ones: by ranged requests, a batch's
spans in flight together, or through the shard cache."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..index.opener import OpenOptions
from ..index.remote import default_cache_root
from ..source.base import ByteSource, SpanBytes
from ..source.cache import ShardCache
from ..source.frames import FramedSource
from ..source.remote import RangeSource, fetch_ranges

__all__ = ["dataset_options", "fetch_ranges", "fetch_spans"]

Strategy = Literal["ranges", "cache"]


def dataset_options(
    strategy: str,
    index_dir: str | os.PathLike[str] | None,
    *,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit: int | str,
    cache_fill: Literal["shards", "ranges"] = "shards",
    storage_options: Mapping[str, Any] | None,
    build_missing: bool = False,
) -> OpenOptions:
    """How a dataset opens its shards, from its arguments, checked.

    ``strategy`` is how remote shards are read: ``"ranges"``, one ranged request per
    sample, batches in flight together; ``"cache"``, whole shards downloaded into the
    shard cache at ``cache_dir`` (default ``~/.cache/indextar/shards``) and read locally
    (``cache_fill="ranges"``: filled by the ranged reads instead).
    """
    if strategy not in ("ranges", "cache"):
        raise ValueError(f"remote= must be 'ranges' or 'cache', got {strategy!r}")
    cache = None
    if strategy == "cache":
        cache = ShardCache(
            cache_dir if cache_dir is not None else default_cache_root() / "shards",
            limit=cache_limit,
            fill=cache_fill,
            storage_options=storage_options,
        )
    return OpenOptions.make(
        index_dir, storage_options=storage_options, cache=cache, build_missing=build_missing
    )


def fetch_spans(
    sources: Sequence[ByteSource],
    offsets: Sequence[int],
    lengths: Sequence[int],
    *,
    max_in_flight: int = 64,
    keys: Sequence[str] | None = None,
) -> list[SpanBytes]:
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
    results: list[SpanBytes | None] = [None] * len(sources)
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
