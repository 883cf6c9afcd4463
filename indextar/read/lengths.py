"""Documents' token counts from the index, for packing: no sample is read.

``lengths=`` of :class:`~indextar.PackedDataset` is one of:

* an attribute column's name (``"num_tokens"``, from ``attributes_from="json"`` or
  ``import_attributes``), or any SQL expression a ``where`` may name, such as
  ``"size(tokens) / 2"`` for a raw ``uint16`` member ``.tokens`` (the member's size is
  in every index), or ``"(size(npy) - 128) / 4"`` for a 1-D ``int32`` ``.npy`` whose
  header takes 128 bytes (as ``np.save`` writes it for a 1-D array);
* a callable of one shard's :class:`~indextar.index.arrays.ShardArrays` giving that
  shard's samples' lengths, for anything else;
* an array of one length per sample, already known.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SelectionError
from ..index.arrays import ShardArrays
from .lookup import sample_keys
from .protocols import KeyedView
from .selection import attribute_values

__all__ = ["LengthsArg", "document_lengths"]

LengthsArg = str | Callable[[ShardArrays], npt.ArrayLike] | npt.ArrayLike
"""A column or SQL expression, a callable of a shard's arrays, or the lengths."""

I64 = npt.NDArray[np.int64]


def document_lengths(data: Any, lengths: LengthsArg) -> I64:
    """Each sample's token count, in ``data``'s order (an IndexedTarDataset, or a
    ``select``/``where`` view of one), as int64.

    Raises
    ------
    SelectionError
        If an expression is NULL, negative or not an integer for some sample (the first
        is named, with a count), or fails on a shard's index.
    ValueError
        If an array's length is not ``len(data)``.
    """
    base = getattr(data, "base", data)
    keyed = isinstance(base, KeyedView)  # a joined view: its own values, by its index
    if isinstance(lengths, str):
        values = base.attribute_values(lengths) if keyed else attribute_values(base, lengths)
    elif callable(lengths) and keyed:
        raise TypeError(
            f"lengths= of {base!r}: an attribute or SQL expression, or an array; "
            "a callable of shards' arrays needs an IndexedTarDataset"
        )
    elif callable(lengths):
        values = _from_arrays(base, lengths)
    else:
        given = np.asarray(lengths)
        if given.ndim != 1 or given.size != len(data):
            raise ValueError(
                f"lengths must hold one value per sample ({len(data)}); got shape {given.shape}"
            )
        return _checked(data, base, given.astype(np.float64), "the lengths given", None)
    if base is not data:
        values = values[data.base_indices(np.arange(len(data)))]
    what = repr(lengths) if isinstance(lengths, str) else getattr(lengths, "__name__", "lengths")
    return _checked(data, base, values, what, None if keyed else base)


def _from_arrays(base: Any, lengths: Callable[[ShardArrays], npt.ArrayLike]) -> npt.NDArray[Any]:
    """``lengths`` of every shard's arrays, concatenated in dataset order."""
    out = np.zeros(len(base), np.float64)
    starts = base.shard_starts.tolist()
    for shard_no, size in enumerate(base.shard_sizes.tolist()):
        if not size:
            continue
        found = np.asarray(lengths(base.shard_index(shard_no).load_arrays()))
        if found.shape != (size,):
            raise SelectionError(
                f"lengths gave shape {found.shape} for {base.shards[shard_no]!r}, "
                f"which has {size} samples"
            )
        out[starts[shard_no] : starts[shard_no] + size] = found
    return out


def _checked(data: Any, base: Any, values: npt.NDArray[Any], what: str, keyed: Any) -> I64:
    """``values`` as int64, or a :class:`SelectionError` naming the first bad sample."""
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0) | (values != np.floor(values)))
    if bad.size:
        first = int(bad[0])
        value = values[first]
        where = f"sample {first}"
        if keyed is not None:
            position = first if base is data else int(data.base_indices(first))
            shard_no, _ = base.locate(position)
            key = next(sample_keys(base, [position]))
            where = f"{key!r} in {base.shards[shard_no]!r}"
        raise SelectionError(
            f"{bad.size} of {values.size} samples have no length in {what} (the first: "
            f"{where}, {'NULL' if np.isnan(value) else value}); lengths must be integers >= 0"
        )
    return values.astype(np.int64)
