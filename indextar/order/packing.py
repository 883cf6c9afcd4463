"""Sequence packing planned from lengths: which documents share each pack.

:func:`plan_packs` is a pure function of the documents' lengths, ``max_length``, the
strategy and ``(seed, epoch)``: every rank and worker computes the same plan with no
communication, and nothing is buffered, so resuming is the sampler's business alone.
A plan is three compact arrays (:class:`PackPlan`): each piece's document and token
count, and where each pack's pieces start; ``concat-split`` adds each piece's first
token within its document.

Strategies:

* ``"best-fit"``: documents longest first, each into the open pack with the least room
  that still fits it, else a new pack (best fit decreasing);
* ``"first-fit"``: the same order, each into the first opened pack that fits (first
  fit decreasing);
* ``"concat-split"``: documents in a seeded order laid end to end and cut every
  ``max_length`` tokens; a document may span packs, and only the last pack pads.

A document longer than ``max_length`` is truncated to it by the fit strategies (its
first ``max_length`` tokens are kept) and split by ``concat-split``; the plan counts
them (``overlong``). A document of length 0 is left out and counted (``empty``).
Among documents of equal length the fit strategies place them in a seeded order, so
the seed changes which documents share a pack but hardly the padding.

The fit loops are in C (``_pack.c``, 16 bytes a document while planning); the Python
references below give the same plans, pack for pack, and run where the extension is
not built or ``INDEXTAR_PURE_PYTHON`` is set (slowly: they are for tests).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from . import extensions

__all__ = ["PackPlan", "Strategy", "STRATEGIES", "plan_packs"]

Strategy = Literal["best-fit", "first-fit", "concat-split"]
STRATEGIES: tuple[str, ...] = ("best-fit", "first-fit", "concat-split")

_MAX_LENGTH_LIMIT = 1 << 30
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PackPlan:
    """Which documents share each pack, as flat arrays.

    Attributes
    ----------
    offsets
        int64, ``packs + 1``: pack ``p`` is pieces ``offsets[p]:offsets[p + 1]``.
    documents
        Each piece's document (its position in the lengths), int32 (int64 beyond 2**31
        documents).
    lengths
        int32, each piece's token count.
    starts
        int32, each piece's first token within its document (``concat-split``), or
        ``None``: every piece starts at its document's first token.
    max_length
        The packs' capacity.
    overlong
        Documents longer than ``max_length``: truncated (fit) or split (``concat-split``).
    empty
        Documents of length 0, left out.
    """

    offsets: I64
    documents: npt.NDArray[np.int32] | I64
    lengths: I32
    starts: I32 | None
    max_length: int
    overlong: int
    empty: int

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def tokens(self) -> int:
        """Tokens in all packs."""
        return int(self.lengths.sum(dtype=np.int64))

    @property
    def padding(self) -> float:
        """The fraction of the packs' ``len(self) * max_length`` slots left empty."""
        slots = len(self) * self.max_length
        return 0.0 if not slots else 1.0 - self.tokens / slots

    @property
    def nbytes(self) -> int:
        """Bytes the plan's arrays hold."""
        arrays = (self.offsets, self.documents, self.lengths, self.starts)
        return sum(a.nbytes for a in arrays if a is not None)

    def pack(self, index: int) -> tuple[I64, I64, I64]:
        """Pack ``index``'s pieces: ``(documents, starts, lengths)``, int64 each."""
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        documents = self.documents[lo:hi].astype(np.int64)
        lengths = self.lengths[lo:hi].astype(np.int64)
        if self.starts is None:
            return documents, np.zeros(hi - lo, np.int64), lengths
        return documents, self.starts[lo:hi].astype(np.int64), lengths


def plan_packs(
    lengths: npt.ArrayLike,
    max_length: int,
    *,
    strategy: Strategy = "best-fit",
    seed: int = 0,
    epoch: int = 0,
) -> PackPlan:
    """Plan packs of at most ``max_length`` tokens over documents of ``lengths``.

    A pure function of its arguments (see the module docstring for the strategies).

    Raises
    ------
    ValueError
        If a length is negative or not an integer, ``max_length`` is not in
        ``[1, 2**30)``, or ``strategy`` is unknown.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    if not 1 <= int(max_length) < _MAX_LENGTH_LIMIT:
        raise ValueError(f"max_length must be in [1, 2**30); got {max_length}")
    max_length = int(max_length)
    array = np.asarray(lengths)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise ValueError(
            f"lengths must be a 1-D array of integers; got {array.dtype} {array.shape}"
        )
    if array.size and int(array.min()) < 0:
        raise ValueError(f"lengths must not be negative; document {int(array.argmin())} is")
    rng = np.random.default_rng([int(seed), int(epoch)])
    kept = np.flatnonzero(array > 0) if array.size and int(array.min()) == 0 else None
    empty = 0 if kept is None else array.size - kept.size
    overlong = int(np.count_nonzero(array > max_length))
    if strategy == "concat-split":
        return _concat_split(array, kept, max_length, rng, overlong, empty)
    source = array if kept is None else array[kept]
    # int32 lengths go to the C code as they are (it truncates as it reads): no copy
    module = extensions.pack()
    clipped = (
        source
        if module is not None and source.dtype == np.int32
        else np.minimum(source, max_length).astype(np.int32, copy=False)
    )
    del source
    order = np.arange(clipped.size, dtype=np.int32)
    rng.shuffle(order)
    offsets, packed = _fit(clipped, order, max_length, best=strategy == "best-fit")
    del order
    piece_lengths = clipped[packed]
    np.minimum(piece_lengths, max_length, out=piece_lengths)
    documents: npt.NDArray[np.int32] | I64 = packed if kept is None else kept[packed]
    if documents.dtype != np.int32 and array.size < (1 << 31):
        documents = documents.astype(np.int32)
    return PackPlan(offsets, documents, piece_lengths, None, max_length, overlong, empty)


def _fit(clipped: I32, order: I32, max_length: int, *, best: bool) -> tuple[I64, I32]:
    """``(offsets, documents pack by pack)`` of best or first fit decreasing."""
    if clipped.size >= (1 << 31):  # pragma: no cover - 16 GB of lengths
        raise ValueError("the fit strategies plan at most 2**31 - 1 documents at once")
    module = extensions.pack()
    if module is not None:  # clipped may hold lengths over max_length: C truncates them
        scratch = np.empty_like(clipped)
        packed = np.empty_like(clipped)
        raw = module.fit_decreasing(clipped, order, scratch, packed, max_length, best)
        return np.frombuffer(raw, dtype=np.int64), packed
    return fit_reference(clipped, order, max_length, best=best)


def fit_reference(lengths: I32, order: I32, max_length: int, *, best: bool) -> tuple[I64, I32]:
    """What ``_pack.c`` computes, in Python: documents longest first (stable in
    ``order``); best fit takes the least room that fits, the latest pack given that
    room first; first fit the earliest opened pack that fits."""
    visit = order[np.argsort(-lengths[order].astype(np.int64), kind="stable")]
    room: list[int] = []  # each pack's room
    stacks: dict[int, list[int]] = {}  # best fit: room -> packs with it, latest last
    rooms: list[int] = []  # best fit: sorted rooms that have a pack
    bins = np.empty(visit.size, np.int64)
    for k, document in enumerate(visit.tolist()):
        length = int(lengths[document])
        pack = -1
        if best:
            at = bisect.bisect_left(rooms, length)
            if at < len(rooms):
                stack = stacks[rooms[at]]
                pack = stack.pop()
                if not stack:
                    del stacks[rooms.pop(at)]
        else:
            pack = next((p for p, r in enumerate(room) if r >= length), -1)
        if pack < 0:
            pack = len(room)
            room.append(max_length)
        room[pack] -= length
        bins[k] = pack
        if best and room[pack] > 0:
            if room[pack] not in stacks:
                bisect.insort(rooms, room[pack])
            stacks.setdefault(room[pack], []).append(pack)
    grouped = np.argsort(bins, kind="stable")
    offsets = np.zeros(len(room) + 1, np.int64)
    np.cumsum(np.bincount(bins, minlength=len(room)), out=offsets[1:])
    return offsets, visit[grouped].astype(np.int32)


def _concat_split(
    lengths: npt.NDArray[np.integer],
    kept: I64 | None,
    max_length: int,
    rng: np.random.Generator,
    overlong: int,
    empty: int,
) -> PackPlan:
    """Documents in a seeded order, end to end, cut every ``max_length`` tokens."""
    module = extensions.pack()
    if module is not None and lengths.size < (1 << 31):
        return _concat_split_c(module, lengths, kept, max_length, rng, overlong, empty)
    documents = rng.permutation(lengths.size if kept is None else kept)
    if kept is None:
        documents = documents.astype(np.int64)
    ends = np.cumsum(lengths[documents], dtype=np.int64)
    total = int(ends[-1]) if ends.size else 0
    packs = -(-total // max_length)
    begins = ends - lengths[documents]
    cuts = np.arange(1, packs, dtype=np.int64) * max_length
    # Both sorted: a stable sort merges the two runs in linear time (np.union1d sorts).
    merged = np.concatenate([begins, cuts])
    merged.sort(kind="stable")
    distinct = np.ones(merged.size, bool)
    np.not_equal(merged[1:], merged[:-1], out=distinct[1:])
    piece_begin = merged[distinct]
    which = np.searchsorted(ends, piece_begin, side="right")
    piece_end = np.append(piece_begin[1:], total)
    offsets = np.searchsorted(piece_begin, np.arange(packs + 1, dtype=np.int64) * max_length)
    offsets[-1] = piece_begin.size
    chosen: npt.NDArray[np.int32] | I64 = documents[which]
    if lengths.size < (1 << 31):
        chosen = chosen.astype(np.int32)
    return PackPlan(
        offsets=offsets.astype(np.int64),
        documents=chosen,
        lengths=(piece_end - piece_begin).astype(np.int32),
        starts=(piece_begin - begins[which]).astype(np.int32),
        max_length=max_length,
        overlong=overlong,
        empty=empty,
    )


def _concat_split_c(
    module: Any,
    lengths: npt.NDArray[np.integer],
    kept: I64 | None,
    max_length: int,
    rng: np.random.Generator,
    overlong: int,
    empty: int,
) -> PackPlan:
    """:func:`_concat_split` in ``_pack.c``, the same plan in 12 bytes a piece and 8 a
    pack: the seeded order (the same shuffle, in int32) is read from the tail of the
    buffer the pieces' documents are written into."""
    as_int32 = lengths.astype(np.int32, copy=False)
    if as_int32 is not lengths and lengths.size and int(lengths.max()) >= (1 << 31):
        raise ValueError("concat-split plans documents of at most 2**31 - 1 tokens")
    count = lengths.size if kept is None else kept.size
    total = int(lengths.sum(dtype=np.int64))
    packs = -(-total // max_length)
    pieces = np.empty(count + packs, np.int32)
    order = pieces[packs:]
    if kept is None:
        order[:] = np.arange(count, dtype=np.int32)
    else:
        order[:] = kept
    rng.shuffle(order)  # as rng.permutation(...): the same order, in 4 bytes a document
    del order
    piece_lengths = np.empty_like(pieces)
    piece_starts = np.empty_like(pieces)
    offsets = np.empty(packs + 1, np.int64)
    used = module.concat_split(as_int32, pieces, piece_lengths, piece_starts, offsets, max_length)
    for array in (pieces, piece_lengths, piece_starts):
        array.resize(used, refcheck=False)  # in place: the unused tail is given back
    return PackPlan(offsets, pieces, piece_lengths, piece_starts, max_length, overlong, empty)
