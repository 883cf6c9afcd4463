"""PackedDataset: a map-style dataset of packs, planned from the index.

The documents' lengths come from the index (:mod:`indextar.read.lengths`), the plan
from :func:`~indextar.order.packing.plan_packs`, once, when the dataset is made: a
pure function of the lengths, ``max_length``, the strategy and the seed, so every
rank and worker holds the same packs and ``len()`` is known up front. Pack ``i`` is
read with one grouped read of its documents (the data's ``__getitems__``), and a
batch of packs with one grouped read of all their documents. The packs are planned
once; :class:`~indextar.ResumableSampler` shuffles their order every epoch
(docs/packing.md says why, with the measurements).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..errors import SampleFormatError
from ..index.shard import PathLike
from ..order.packing import PackPlan, Strategy, plan_packs
from ..order.readahead import Hint, HintedBatch
from .lengths import LengthsArg, document_lengths
from .packcache import (
    CachedPlan,
    lengths_digest,
    lengths_source,
    load_plan,
    plan_cache_folder,
    plan_key,
    save_plan,
)
from .shmblocks import PooledDict, batch_buffer, given_back_on_error

if TYPE_CHECKING:
    import torch

__all__ = ["Pack", "PackedDataset", "collate_packs"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Pack:
    """One pack: its documents' tokens, in order, and where they came from.

    Attributes
    ----------
    tokens
        Each piece's tokens, a 1-D array (a piece is a whole document, a truncated one,
        or with ``concat-split`` a part of one).
    indices
        The data's index of each piece's document.
    max_length
        The pack's capacity; ``collate_packs`` pads to it.
    """

    tokens: tuple[npt.NDArray[Any], ...]
    indices: I64
    max_length: int

    def __len__(self) -> int:
        return int(sum(len(t) for t in self.tokens))


def _as_tokens(sample: Any) -> npt.NDArray[Any]:
    """A sample that is its tokens, or a one-member tuple of them (``keys="tokens"``)."""
    if isinstance(sample, tuple) and len(sample) == 1:
        sample = sample[0]
    return np.asarray(sample)


class PackedDataset:
    """Packs of documents of at most ``max_length`` tokens, planned from the index.

    Parameters
    ----------
    data
        An :class:`~indextar.IndexedTarDataset`, or a ``where``/``select``/``exclude``
        view of one, whose samples give tokens (``tokens=``).
    max_length
        Tokens per pack.
    lengths
        Each document's token count, without reading it: an attribute column or SQL
        expression over the index (``"num_tokens"``, ``"size(tokens) / 2"``), a
        callable of a shard's ``ShardArrays``, or an array (see
        :mod:`indextar.read.lengths`).
    strategy
        ``"best-fit"``, ``"first-fit"`` or ``"concat-split"`` (see
        :mod:`indextar.order.packing`). Fit strategies truncate documents longer than
        ``max_length``; ``concat-split`` splits them. Both are counted and logged.
    seed
        Selects the plan (which documents share a pack).
    tokens
        The tokens of a sample as ``data`` returns it, a 1-D array. Default: the sample
        itself, or the one member of a one-member tuple (``keys="tokens"``).
    cache_dir
        Where the lengths and the plan are cached (as ``packs/<key>.npz`` under it;
        default: the selection cache's folder), keyed by the lengths' source (an
        expression and the indexes' identities, or an array's values), ``max_length``,
        the strategy and the seed (:mod:`indextar.read.packcache`); the next open with
        the same arguments loads them. ``False`` neither reads nor writes. The plans of
        :meth:`set_epoch` are made, not cached.

    Raises
    ------
    SelectionError
        If a length is missing, negative or not an integer for some sample.
    """

    def __init__(
        self,
        data: Any,
        *,
        max_length: int,
        lengths: LengthsArg,
        strategy: Strategy = "best-fit",
        seed: int = 0,
        tokens: Callable[[Any], npt.ArrayLike] | None = None,
        cache_dir: PathLike | None | bool = None,
    ) -> None:
        self.data = data
        self.strategy = strategy
        self.seed = int(seed)
        self.epoch = 0
        self._tokens = _as_tokens if tokens is None else tokens
        self._cache = plan_cache_folder(cache_dir)
        self._source = None if self._cache is None else lengths_source(data, lengths)
        planned = self._planned(int(max_length), lambda: document_lengths(data, lengths))
        self.lengths = planned.lengths
        """Each document's token count, from the index."""
        self.plan: PackPlan = planned.plan
        """The packs: which documents, which tokens of each."""
        self._digest = planned.digest
        if self.plan.overlong or self.plan.empty:
            log.info(
                "%d of %d documents are longer than %d tokens (%s); %d are empty (left out)",
                self.plan.overlong,
                len(data),
                max_length,
                "split" if strategy == "concat-split" else "truncated",
                self.plan.empty,
            )

    def set_epoch(self, epoch: int) -> None:
        """Plan the packs again for ``epoch`` (the plan of ``(seed, epoch)``).

        Not needed for training with the block-diagonal mask (``cu_seqlens``), where a
        pack's documents never see each other; the sampler reshuffles the packs every
        epoch anyway. Only documents of equal length trade places, so the number of
        packs and the padding stay the same. Call it before the epoch's DataLoader
        iterator is made: workers with ``persistent_workers=True`` keep their plan.
        """
        self.epoch = int(epoch)
        self.plan = plan_packs(
            self.lengths, self.max_length, strategy=self.strategy, seed=self.seed, epoch=epoch
        )

    def _planned(self, max_length: int, lengths: Callable[[], I64]) -> CachedPlan:
        """The lengths (``lengths()`` unless cached) and the plan of epoch 0, from the
        cache or made (and cached). Only the first plan is cached: one file a dataset,
        not one an epoch (at 1e8 documents a plan is 1.3 GB), and a later epoch's plan
        needs no lengths read, only planning."""
        key = None
        if self._cache is not None and self._source is not None:
            key = plan_key(
                self._source, max_length=max_length, strategy=self.strategy, seed=self.seed, epoch=0
            )
            cached = load_plan(
                self._cache, key, len(self.data), split=self.strategy == "concat-split"
            )
            if cached is not None:
                log.debug("plan of %r from the cache %s", self.data, self._cache)
                return cached
        found = lengths()
        plan = plan_packs(found, max_length, strategy=self.strategy, seed=self.seed)
        made = CachedPlan(found, lengths_digest(found), plan)
        if key is not None and self._cache is not None:
            save_plan(self._cache, key, made)
        return made

    @property
    def max_length(self) -> int:
        """Tokens per pack."""
        return self.plan.max_length

    def __len__(self) -> int:
        return len(self.plan)

    @property
    def token_count(self) -> int:
        """Tokens in all packs (padding not counted). A ``ResumableSampler`` over a
        ``MixtureDataset`` whose parts all have it reads ``weights=`` as shares of tokens."""
        return self.plan.tokens

    def __getitem__(self, index: int) -> Pack:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Pack]:
        """Packs ``indices``: their documents read in one grouped read."""
        count = len(self.plan)
        pieces = []
        for index in indices:
            position = int(index) + count if int(index) < 0 else int(index)
            if not 0 <= position < count:
                raise IndexError(f"pack {index} is out of range for {count} packs")
            pieces.append(self.plan.pack(position))
        documents = np.concatenate([p[0] for p in pieces]) if pieces else np.empty(0, np.int64)
        hint = getattr(indices, "hint", None)
        wanted: list[int] = documents.tolist()
        if isinstance(hint, Hint):  # ReadAheadBatches: the next batches' documents
            wanted = HintedBatch(wanted, self._documents_hint(hint))
        samples = iter(self._read(wanted))
        packs = []
        for documents_of, starts, lengths in pieces:
            tokens = []
            for document, start, length in zip(
                documents_of.tolist(), starts.tolist(), lengths.tolist()
            ):
                tokens.append(self._piece(next(samples), document, start, length))
            packs.append(Pack(tuple(tokens), documents_of, self.max_length))
        return packs

    def _documents_hint(self, hint: Hint) -> Hint:
        """``hint``'s batches of packs as batches of their documents (a pure function
        of the plan, which every worker holds)."""
        count = len(self.plan)
        batches, sizes = [], []
        for _, packs in hint.batches():
            ok = packs[(packs >= 0) & (packs < count)].tolist()
            documents = [self.plan.pack(pack)[0] for pack in ok]
            batches += documents
            sizes.append(sum(map(len, documents)))
        ahead = np.concatenate(batches).astype(np.int64) if batches else np.empty(0, np.int64)
        return dataclasses.replace(hint, ahead=ahead, sizes=tuple(sizes))

    def _read(self, documents: list[int]) -> list[Any]:
        getitems = getattr(self.data, "__getitems__", None)
        return list(getitems(documents)) if getitems else [self.data[i] for i in documents]

    def _piece(self, sample: Any, document: int, start: int, length: int) -> npt.NDArray[Any]:
        tokens = np.asarray(self._tokens(sample))
        if tokens.ndim != 1 or tokens.size < start + length:
            key = sample.get("__key__") if isinstance(sample, dict) else None
            raise SampleFormatError(
                f"document {document}{f' ({key!r})' if key else ''} has tokens of shape "
                f"{tokens.shape}; its length in the index says at least {start + length}"
            )
        return tokens[start : start + length]

    @property
    def selection(self) -> dict[str, Any]:
        """What ``ResumableSampler`` records of this dataset and checks on resume: the
        plan's strategy, seed and size, a digest of the documents' lengths (which with
        those fix every epoch's plan), and the data's own selection, if a view's."""
        return {
            "packing": self.strategy,
            "max_length": self.max_length,
            "seed": self.seed,
            "packs": len(self),
            "digest": self._digest,
            "data": getattr(self.data, "selection", None),
        }

    def close(self) -> None:
        """Close the data's open shards."""
        close = getattr(self.data, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return (
            f"PackedDataset({self.data!r}, {len(self)} packs of {self.max_length} tokens, "
            f"{self.strategy}, padding {self.plan.padding:.2%})"
        )


def collate_packs(
    packs: Sequence[Pack],
    *,
    pad_id: int = 0,
    ignore_index: int = -100,
    dtype: torch.dtype | None = None,
    reuse: bool = True,
) -> dict[str, Any]:
    """A batch of packs as torch tensors, for variable-length attention.

    Returns a dict of:

    * ``input_ids``: ``(batch, max_length)``, each pack's tokens end to end, then
      ``pad_id``;
    * ``position_ids``: the same shape, restarting at 0 with each document (and with the
      padding);
    * ``labels``: ``input_ids`` with ``ignore_index`` at each document's first token (so
      no document is trained to follow the one before it) and over the padding;
    * ``cu_seqlens``: int32, the cumulative lengths of the documents of the flattened
      batch (``batch * max_length`` tokens, each row's padding one more segment), as
      flash-attention's varlen functions take them;
    * ``max_seqlen``: the longest document, an int.

    ``dtype`` is that of the first three: ``torch.int64`` (the default: what
    ``torch.nn.functional.cross_entropy`` takes as targets, and so every trainer's loss
    over ``labels``) or ``torch.int32`` (half the bytes; embeddings and indexing take
    it, the loss wants ``labels.long()``). All four tensors are views of one buffer, so
    a DataLoader worker hands the batch over in one shared-memory block, not four; with
    ``reuse`` (the default), one of a few blocks the worker fills again once the
    training process has let go of every tensor of an earlier batch in it
    (:mod:`~indextar.read.shmblocks`), so that a batch crosses as a block's name, not a
    new block's descriptor, mapping and pages. A ``collate_fn`` around this one that
    returns new tensors in place of these (a cast, a copy) should pass ``reuse=False``:
    a block whose batch is never sent stays taken, and once all are, the worker makes a
    new block a batch, as with ``reuse=False`` (and logs a warning that says so).
    """
    import torch

    if not packs:
        raise ValueError("collate_packs needs at least one pack")
    dtype = torch.int64 if dtype is None else dtype
    if dtype not in (torch.int64, torch.int32):
        raise ValueError(f"dtype must be torch.int64 or torch.int32; got {dtype}")
    width = packs[0].max_length
    rows = len(packs)
    cells = rows * width
    used = np.zeros(rows, np.int64)
    sizes: list[int] = []  # every segment's length, row by row: documents, then padding
    for row, pack in enumerate(packs):
        if pack.max_length != width:
            raise ValueError(f"packs of {pack.max_length} and {width} tokens in one batch")
        pieces = [len(piece) for piece in pack.tokens]
        used[row] = filled = sum(pieces)
        sizes += pieces
        if filled < width:
            sizes.append(width - filled)
        elif filled > width:
            raise ValueError(f"a pack of {filled} tokens in packs of {width}")
    segments = np.asarray(sizes, np.int64)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    buffer, taken = batch_buffer(3 * cells * itemsize + 4 * (len(segments) + 1), reuse)
    with given_back_on_error(taken):
        batch = _fill_packs(packs, buffer, used, segments, dtype, itemsize, pad_id, ignore_index)
    return batch if taken is None else PooledDict(batch, taken)


def _fill_packs(
    packs: Sequence[Pack],
    buffer: torch.Tensor,
    used: npt.NDArray[np.int64],
    segments: npt.NDArray[np.int64],
    dtype: torch.dtype,
    itemsize: int,
    pad_id: int,
    ignore_index: int,
) -> dict[str, Any]:
    """:func:`collate_packs`'s tensors, written into ``buffer``."""
    import torch

    rows, width = len(packs), packs[0].max_length
    cells = rows * width
    grid = buffer[: 3 * cells * itemsize].view(dtype).view(3, rows, width)
    cu_seqlens = buffer[3 * cells * itemsize :].view(torch.int32)
    input_ids, labels, positions = grid.numpy()
    for row, pack in enumerate(packs):
        filled = int(used[row])
        if filled:
            np.concatenate(pack.tokens, out=input_ids[row, :filled], casting="unsafe")
        input_ids[row, filled:] = pad_id
    np.copyto(labels, input_ids)
    for row in np.flatnonzero(used < width).tolist():
        labels[row, used[row] :] = ignore_index
    ends = np.cumsum(segments)
    cu = cu_seqlens.numpy()
    cu[0] = 0
    cu[1:] = ends
    starts = ends[:-1]  # the first token of every segment after the first
    flat_labels = labels.reshape(-1)
    flat_labels[0] = ignore_index
    flat_labels[starts] = ignore_index
    # positions: 1 a token, minus the segment before at each segment's start, summed
    flat_positions = positions.reshape(-1)
    flat_positions.fill(1)
    flat_positions[0] = 0
    flat_positions[starts] = 1 - segments[:-1]
    np.cumsum(flat_positions, out=flat_positions, dtype=flat_positions.dtype)
    return {
        "input_ids": grid[0],
        "labels": grid[1],
        "position_ids": grid[2],
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(segments.max()),
    }
