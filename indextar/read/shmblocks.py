"""Shared-memory blocks that a DataLoader worker reuses from batch to batch.

The DataLoader hands a worker's tensors to the training process through shared memory,
but for every storage of every batch the worker makes a new shared-memory file, fills
fresh pages (the kernel zeroes them first), and passes its descriptor over a socket
with an authentication handshake; the training process maps it, and frees the pages
once the batch is gone. For a batch of 64 JPEGs of 1024x768 that is 13 MB of pages
made and freed, and several milliseconds of the training process's CPU a batch, all
of it holding the GIL its decoding thread needs (``tools/bench_gpu.py``).

A :class:`BlockPool` keeps a few blocks per worker instead. A block and the pool's
in-use flags (one byte a block, itself in shared memory) cross to the training process
once, the first time they are used; after that a batch names its block and length, a
few bytes of pickle. The training process (:func:`attach`) gives the batch a tensor
over the block that holds a *lease*; when the last tensor sharing that memory is gone
(views included: they all keep the lease), the block's flag is cleared and the worker
may fill it again. A worker that finds no free block makes a one-off block, as the
DataLoader would, so a caller that keeps batches never stalls a worker.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import IndextarError

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

__all__ = [
    "BlockPool",
    "PooledBlock",
    "PooledDict",
    "PooledList",
    "Stacked",
    "attach",
    "batch_buffer",
    "fill",
    "given_back_on_error",
    "lay_out",
    "map_leaves",
    "mark_views",
    "pooled",
    "rebuild",
    "shared_bytes",
    "worker_pool",
]

SLOTS = 8
"""Blocks a worker keeps: the DataLoader's batches in flight (``prefetch_factor``, 2 by
default) and those the training process holds (on_gpu's queues) fit with room."""

HELD_TOO_LONG = 4 * SLOTS
"""Batches in a row that found every block held, after which a worker says so (once):
each of them paid for new shared memory, the path the pool is there to avoid."""

_MIN_BLOCK = 1 << 20
_ALIGN = 64


def shared_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` in new shared memory (not zeroed first)."""
    import torch

    try:  # what default_collate uses in a worker: no zero-filled copy first
        storage = torch.UntypedStorage._new_shared(nbytes)  # type: ignore[no-untyped-call]
    except AttributeError:  # a torch without it
        shared: torch.Tensor = torch.empty(nbytes, dtype=torch.uint8)
        shared.share_memory_()  # type: ignore[no-untyped-call]
        return shared
    return torch.empty(0, dtype=torch.uint8).set_(storage)


# -- many tensors in one block ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Slice:
    """Where a tensor lies in a block: ``rebuild`` puts the view back in its place."""

    start: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def map_leaves(function: Callable[[Any], Any], value: Any) -> Any:
    """``value`` (tuples, lists and dicts, nested) with ``function`` of each other item
    in its place."""
    if isinstance(value, tuple):
        return tuple(map_leaves(function, item) for item in value)
    if isinstance(value, list):
        return [map_leaves(function, item) for item in value]
    if isinstance(value, dict):
        return {key: map_leaves(function, item) for key, item in value.items()}
    return function(value)


@dataclass(frozen=True, slots=True)
class Stacked:
    """Tensors of one shape and dtype, to be stacked into a block (:func:`lay_out`)."""

    tensors: list[torch.Tensor]

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.tensors), *self.tensors[0].shape)


def lay_out(value: Any, at: int = 0) -> tuple[Any, list[tuple[int, torch.Tensor | Stacked]], int]:
    """Place every CPU tensor in ``value`` (tuples, lists, dicts), and the stack of each
    :class:`Stacked`, in one block from ``at``, each aligned to 64 bytes: ``value`` with
    each replaced by where it goes, the ``(start, tensor or Stacked)`` copies to make
    (:func:`fill`), and the end."""
    import torch

    parts: list[tuple[int, torch.Tensor | Stacked]] = []

    def place(item: Any) -> Any:
        nonlocal at
        if isinstance(item, Stacked):
            dtype, shape = item.tensors[0].dtype, item.shape
        elif isinstance(item, torch.Tensor) and item.device.type == "cpu":
            dtype, shape = item.dtype, tuple(item.shape)
        else:
            return item
        at = -(-at // _ALIGN) * _ALIGN
        parts.append((at, item))
        where = _Slice(at, dtype, shape)
        at += _nbytes(where)
        return where

    template = map_leaves(place, value)
    return template, parts, -(-at // _ALIGN) * _ALIGN


def mark_views(value: Any, block: torch.Tensor) -> Any:
    """``value`` with each contiguous tensor over ``block``'s memory replaced by where it
    lies (:func:`rebuild` puts it back), and a copy of each other tensor over it (a
    view that crossed on its own would not hold the block's lease)."""
    import torch

    base = block.untyped_storage().data_ptr()

    def mark(item: Any) -> Any:
        if not isinstance(item, torch.Tensor) or item.device.type != "cpu":
            return item
        if item.untyped_storage().data_ptr() != base:
            return item
        if not item.is_contiguous():
            return item.clone()
        start = int(item.storage_offset()) * item.element_size()
        return _Slice(start, item.dtype, tuple(item.shape))

    return map_leaves(mark, value)


def fill(block: torch.Tensor, parts: list[tuple[int, torch.Tensor | Stacked]]) -> None:
    """Copy each of :func:`lay_out`'s tensors into the uint8 ``block``, and stack each
    :class:`Stacked` there (``torch.stack`` raises, as ``default_collate``'s does, for
    tensors of different shapes)."""
    import torch

    for start, tensor in parts:
        if isinstance(tensor, Stacked):
            first = tensor.tensors[0]
            size = math.prod(tensor.shape) * first.element_size()
            out = block[start : start + size].view(first.dtype).view(tensor.shape)
            torch.stack(tensor.tensors, out=out)
        elif tensor.numel():
            flat = tensor.contiguous().view(-1).view(torch.uint8)
            block[start : start + flat.numel()].copy_(flat)


def rebuild(block: torch.Tensor, template: Any) -> Any:
    """``template`` with each tensor put back, as a view of ``block``."""

    def view(item: Any) -> Any:
        if not isinstance(item, _Slice):
            return item
        stop = item.start + _nbytes(item)
        return block[item.start : stop].view(item.dtype).view(item.shape)

    return map_leaves(view, template)


def _nbytes(where: _Slice) -> int:
    return math.prod(where.shape) * where.dtype.itemsize


@dataclass(frozen=True, slots=True)
class PooledBlock:
    """A block taken from a worker's :class:`BlockPool` for one batch: ``tensor`` is
    ``nbytes`` long. Pickled, it is only the pool's key, the slot and the length, plus
    the block (and the pool's flags) the first time; :func:`attach` rebuilds it."""

    pool: str
    slot: int
    nbytes: int
    tensor: torch.Tensor
    new_block: torch.Tensor | None
    flags: torch.Tensor | None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return attach, (self.pool, self.slot, self.nbytes, self.new_block, self.flags)


class BlockPool:
    """A worker's reusable shared-memory blocks; see the module's docstring."""

    def __init__(self, slots: int = SLOTS) -> None:
        import torch

        self.pid = os.getpid()
        self.key = f"{self.pid}-{uuid.uuid4().hex[:12]}"
        self._flags = torch.zeros(slots, dtype=torch.uint8)
        self._flags.share_memory_()  # type: ignore[no-untyped-call]
        self._in_use: npt.NDArray[np.uint8] = self._flags.numpy()
        self._blocks: list[torch.Tensor | None] = [None] * slots
        self._sent = [False] * slots  # the training process has each block
        self._flags_sent = False
        self._missed = 0  # takes in a row that found every block held

    def take(self, nbytes: int) -> PooledBlock | None:
        """A free block of at least ``nbytes``, marked in use; ``None`` when every block
        is held by the training process (the caller makes a one-off block)."""
        free = [k for k in range(len(self._blocks)) if not self._in_use[k]]
        if not free:
            self._missed += 1
            if self._missed == HELD_TOO_LONG:
                log.warning(
                    "DataLoader worker (pid %d): its %d reusable shared-memory blocks have "
                    "been held for the last %d batches, so each batch is in new shared "
                    "memory (as default_collate's are, and as slow). A batch's block is "
                    "held while any of its tensors is; a collate_fn that wraps "
                    "encoded_collate, collate_packs or pooled_collate and returns new "
                    "tensors never gives it back: pass reuse=False there",
                    self.pid, len(self._blocks), self._missed,
                )  # fmt: skip
            return None
        self._missed = 0
        fits = [k for k in free if (b := self._blocks[k]) is not None and b.numel() >= nbytes]
        if fits:
            slot = fits[0]
        else:
            # the largest free block grown (by a quarter more than asked), a new one only
            # where no block is free: a worker keeps no more blocks than were held at once
            made = {k: b.numel() for k in free if (b := self._blocks[k]) is not None}
            slot = max(made, key=made.__getitem__) if made else free[0]
            self._blocks[slot] = shared_bytes(max(nbytes + nbytes // 4, _MIN_BLOCK))
            self._sent[slot] = False
        block = self._blocks[slot]
        assert block is not None
        self._in_use[slot] = 1
        taken = PooledBlock(
            self.key,
            slot,
            nbytes,
            block[:nbytes],
            None if self._sent[slot] else block,
            None if self._flags_sent else self._flags,
        )
        self._sent[slot] = self._flags_sent = True
        return taken

    def give_back(self, taken: PooledBlock) -> None:
        """Free a block whose batch will not be sent after all (it failed): what that
        batch would have brought (the block, the flags) is sent with the next."""
        self._in_use[taken.slot] = 0
        if taken.new_block is not None:
            self._sent[taken.slot] = False
        if taken.flags is not None:
            self._flags_sent = False


def batch_buffer(nbytes: int, reuse: bool = True) -> tuple[torch.Tensor, PooledBlock | None]:
    """A uint8 buffer of ``nbytes`` for a collated batch, and its pooled block if it is
    one: in a DataLoader worker, a block of the worker's pool (``reuse``, where one is
    free), else new shared memory, as ``default_collate`` makes there; elsewhere, plain
    memory. A caller that fails before the batch is returned gives the block back
    (:func:`given_back_on_error`)."""
    import torch
    from torch.utils.data import get_worker_info

    if get_worker_info() is None:
        return torch.empty(nbytes, dtype=torch.uint8), None
    if reuse and (taken := worker_pool().take(nbytes)) is not None:
        return taken.tensor, taken
    return shared_bytes(nbytes), None


@contextlib.contextmanager
def given_back_on_error(taken: PooledBlock | None) -> Iterator[None]:
    """Around filling a batch into ``taken`` (:func:`batch_buffer`'s pooled block, if
    any): a batch that fails is never sent, so its block goes back to the pool."""
    try:
        yield
    except BaseException:
        if taken is not None:
            worker_pool().give_back(taken)
        raise


class PooledList(list[Any]):
    """A collated list batch in a worker's pooled block: pickled, the block's name
    crosses, not its memory, and the training process gets a plain ``list`` of views
    of the block (:func:`pooled`)."""

    __slots__ = ("_block",)

    def __init__(self, items: list[Any], block: PooledBlock) -> None:
        super().__init__(items)
        self._block = block

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # the items as they are now (a collate_fn around this one may have changed them)
        return rebuild, (self._block, mark_views(list(self), self._block.tensor))


class PooledDict(dict[str, Any]):
    """:class:`PooledList` for a collated ``dict`` batch."""

    __slots__ = ("_block",)

    def __init__(self, items: dict[str, Any], block: PooledBlock) -> None:
        super().__init__(items)
        self._block = block

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return rebuild, (self._block, mark_views(dict(self), self._block.tensor))


def pooled(value: list[Any] | dict[str, Any], block: PooledBlock) -> PooledList | PooledDict:
    """``value``, a batch whose tensors lie in ``block``, as what crosses to the training
    process by the block's name: a :class:`PooledList` or :class:`PooledDict`."""
    return PooledList(value, block) if isinstance(value, list) else PooledDict(value, block)


_worker_pool: BlockPool | None = None


def worker_pool() -> BlockPool:
    """This process's pool (a forked child makes its own)."""
    global _worker_pool
    if _worker_pool is None or _worker_pool.pid != os.getpid():
        _worker_pool = BlockPool()
    return _worker_pool


# -- the training process's side ------------------------------------------------------


@dataclass(slots=True)
class _Attached:
    pid: int
    flags: npt.NDArray[np.uint8]  # its base is the tensor over the shared memory
    blocks: list[npt.NDArray[np.uint8] | None]


_attached: dict[str, _Attached] = {}
_lock = threading.Lock()


def attach(
    pool: str, slot: int, nbytes: int, new_block: torch.Tensor | None, flags: torch.Tensor | None
) -> torch.Tensor:
    """The first ``nbytes`` of block ``slot`` of worker pool ``pool``, as a uint8
    tensor that holds the block until it and every view of it are gone. Unpickling a
    :class:`PooledBlock` calls this."""
    import torch

    with _lock:
        attached = _attached.get(pool)
        if attached is None:
            if flags is None:
                raise IndextarError(
                    f"a batch names block {slot} of shared-memory pool {pool}, which this "
                    f"process was never sent: a pooled batch can be unpickled only by the "
                    f"process its DataLoader worker sends it to"
                )
            _forget_exited()
            attached = _Attached(int(pool.split("-")[0]), flags.numpy(), [None] * len(flags))
            _attached[pool] = attached
        if new_block is not None:
            attached.blocks[slot] = new_block.numpy()
        block = attached.blocks[slot]
    if block is None:
        raise IndextarError(f"block {slot} of shared-memory pool {pool} was never sent here")
    lease = block[:nbytes]  # a new array object: the tensor below keeps it alive
    weakref.finalize(lease, _release, attached.flags, slot, os.getpid(), pool).atexit = False
    return torch.from_numpy(lease)


def _release(flags: npt.NDArray[np.uint8], slot: int, pid: int, pool: str) -> None:
    """A lease is gone: its block is free for the worker again; and where that worker
    has exited (its loader is done), every exited worker's pool is dropped, so that
    their blocks are unmapped once no batch holds them rather than when a next pool
    attaches. A loop's last batch outlives its loader's workers (the loop's variable
    holds it while the loader shuts them down): its release lets them all go, those
    whose own last batch went while they ran too."""
    if os.getpid() != pid:  # a forked child's copy of the batch: the flags are shared
        return
    flags[slot] = 0
    # a finalizer runs wherever the last reference goes, attach's lock held or not:
    # never wait for it (a later release drops the pool)
    if _lock.acquire(blocking=False):
        try:
            attached = _attached.get(pool)
            if attached is not None and not _alive(attached.pid):
                _forget_exited()
        finally:
            _lock.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _forget_exited() -> None:
    """Drop the pools of workers that have exited (batches still held keep their own
    block mapped through their lease)."""
    for key, attached in list(_attached.items()):
        if not _alive(attached.pid):
            del _attached[key]
