"""Shards for the dataset tests, written by webdataset's own TarWriter."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


def jpeg(seed: int, size: tuple[int, int] = (8, 6)) -> bytes:
    """A small, valid JPEG whose pixels depend on ``seed``."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def sample(i: int, *, images: bool = True) -> dict[str, Any]:
    """Sample number ``i``: jpg (or png every 5th), cls, json; txt on every 3rd."""
    record: dict[str, Any] = {
        "__key__": f"sample{i:06d}",
        "cls": str(i % 10).encode(),
        "json": json.dumps({"i": i}).encode(),
    }
    if images:
        record["png" if i % 5 == 4 else "jpg"] = jpeg(i)
    if i % 3 == 0:
        record["txt"] = f"caption {i}".encode()
    return record


def write_shards(
    folder: Path, shards: int, per_shard: int, *, images: bool = True, name: str = "data"
) -> list[Path]:
    """``shards`` shards of ``per_shard`` samples each, numbered consecutively."""
    import webdataset

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in range(shards):
        path = folder / f"{name}-{n:06d}.tar"
        with webdataset.TarWriter(str(path)) as sink:
            for i in range(n * per_shard, (n + 1) * per_shard):
                sink.write(sample(i, images=images))
        paths.append(path)
    return paths
