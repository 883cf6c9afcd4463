"""Datasets of samples of many kinds, for collate tests through real fork and spawn
DataLoader workers (a module of its own: a spawned worker imports it by name)."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np
import torch

Pair = namedtuple("Pair", "x y")

KINDS = ("tuple", "dict", "nested", "namedtuple", "array", "strings", "ragged")


class Kinds(torch.utils.data.Dataset[Any]):
    """``count`` samples of ``kind``, each a function of its index."""

    def __init__(self, kind: str, count: int = 40) -> None:
        self.kind, self.count = kind, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> Any:
        rng = np.random.default_rng(i)
        latent = rng.standard_normal((4, 8, 8)).astype(np.float16)
        if self.kind == "tuple":  # a numpy array, an int, a float, a str, a numpy scalar
            return latent, i, i / 7, f"s{i}", np.float32(i * 0.5)
        if self.kind == "dict":  # a tensor, a bool, bytes, a numpy int
            return {"x": torch.from_numpy(latent).float(), "flag": i % 2 == 0,
                    "raw": b"k%d" % i, "label": np.int64(i)}  # fmt: skip
        if self.kind == "nested":  # a dict of lists of tuples
            return {"pair": [(latent[:2], i), (latent[2:], -i)], "meta": {"n": i, "tag": "t"}}
        if self.kind == "namedtuple":  # left to default_collate
            return Pair(latent, i)
        if self.kind == "array":  # a bare array: default_collate's tensor
            return latent
        if self.kind == "strings":  # no tensor at all
            return (f"a{i}", f"b{i}")
        if self.kind == "ragged":  # shapes that differ: default_collate's error
            return rng.standard_normal((1 + i % 3, 4)).astype(np.float32), i
        raise ValueError(self.kind)


def same(a: Any, b: Any) -> bool:
    """Whether two collated batches are the same: types, dtypes, shapes and values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)
