"""A small tokenized corpus for the packing tests: raw ``uint16`` token members
(``.tokens``) with their count in a JSON member (``num_tokens``, indexed with
``attributes_from="json"``), written with ShardWriter; and the reader of those members."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import indextar

PATTERN = "tok-{000000..000003}.tar"


def write_corpus(folder: Path, *, documents: int = 150, longest: int = 80, seed: int = 0) -> str:
    """Write the corpus into ``folder`` (4 shards); its shards' brace pattern."""
    rng = np.random.default_rng(seed)
    with indextar.ShardWriter(
        str(folder / "tok-%06d.tar"), maxcount=40, attributes_from="json"
    ) as sink:
        for i in range(documents):
            n = int(rng.integers(1, longest + 1))
            tokens = rng.integers(1, 1000, n).astype(np.uint16)
            sink.write(
                {"__key__": f"doc{i:05d}", "tokens": tokens.tobytes(), "json": {"num_tokens": n}}
            )
    assert len(sink.shards) == 4
    return str(folder / PATTERN)


def as_uint16(sample: tuple[bytes]) -> np.ndarray:
    """A ``keys="tokens"`` sample's tokens."""
    return np.frombuffer(sample[0], np.uint16)


def dataset(pattern: str) -> indextar.IndexedTarDataset:
    """The corpus read as token arrays."""
    return indextar.IndexedTarDataset(pattern, keys="tokens", transform=as_uint16)
