"""``IndexedTarDataset.join``: the method that makes a :class:`JoinedDataset`.

A mixin of its own, as :class:`~indextar.read.subset.KeyViews` is: the joined view
(:mod:`indextar.read.joined`) makes ``KeySubset``\\ s of itself, so ``subset`` cannot
import it back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import JoinError
from ..index.shard import PathLike
from .decode import DecodeArg
from .joined import JoinedDataset, member_names
from .keyjoin import JoinHow, plan_join
from .protocols import KeyedView, UnbuiltReader
from .sample import SampleBuilder
from .subset import KeySubset

__all__ = ["JoinViews"]


class JoinViews:
    """``join`` of a dataset of indexed shards that reads samples unbuilt
    (:class:`~indextar.read.protocols.UnbuiltReader`), which
    :class:`~indextar.IndexedTarDataset` has from here."""

    def join(
        self: UnbuiltReader,
        other: UnbuiltReader | KeySubset,
        *,
        how: JoinHow = "inner",
        prefix: str = "",
        rename: Mapping[str, str] | None = None,
        decode: DecodeArg = None,
        keys: str | Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        allow_unsafe: bool = False,
        cache_dir: PathLike | None | bool = None,
    ) -> JoinedDataset:
        """A view whose sample ``i`` holds the members of this dataset's sample and of
        ``other``'s sample with the same ``__key__``: a modality added without rewriting
        a shard (docs/joins.md).

        The join is computed from both sides' indexes alone (keys to positions, in
        numpy), whatever their shards' sizes and order, and cached like a ``where``
        under ``cache_dir`` (default ``~/.cache/indextar/selections/joins``; ``False``:
        no cache), keyed by both sides' index identities.

        Parameters
        ----------
        other
            The dataset whose members are added, one sample per key, or a view of one
            (``where``, ``select``, ``exclude``): its samples alone are joined.
        how
            ``"inner"``: only samples whose key both sides have, in this dataset's
            order. ``"left"``: every sample of this dataset; one that ``other`` lacks
            has only its own members.
        prefix, rename
            ``other``'s member extensions in the joined sample: ``rename`` maps some to
            new names, ``prefix`` is put before the others (``prefix="clip."`` makes
            ``npy`` ``clip.npy``, which decodes as ``npy``).
        decode, keys, transform, allow_unsafe
            As for :class:`~indextar.IndexedTarDataset`, applied to the joined sample;
            the sides' own are not used.

        Raises
        ------
        JoinError
            If a member extension is on both sides (without ``prefix``/``rename``), a
            key is held by more than one sample of ``other``, or ``other`` is a view of
            a joined view.
        StaleIndexError
            If a shard of either side changed since it was indexed.
        """
        builder = SampleBuilder.make(
            decode=decode, keys=keys, allow_unsafe=allow_unsafe, transform=transform
        )
        right: Any = other
        if isinstance(other, KeySubset):  # the base's join, with only the view's samples
            right = other.base
            if isinstance(right, KeyedView):
                raise JoinError(
                    f"cannot join {other!r}, a view of a joined view; join its datasets "
                    "one after the other, then select"
                )
        plan = plan_join(self, right, how, cache_dir=cache_dir)
        if isinstance(other, KeySubset):
            plan = plan.keeping_right(other.base_indices(np.arange(len(other))), how)
        names = member_names(plan.left_exts, plan.right_exts, prefix=prefix, rename=rename)
        return JoinedDataset(self, right, plan, how=how, names=names, builder=builder)
