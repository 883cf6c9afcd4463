"""A batch's encoded images as one uint8 tensor: the DataLoader workers' side of the
GPU image stage (``read/gpu.py``).

A worker that returns a list of ``bytes`` has the DataLoader pickle every image through
a pipe, and the training process copy them again. :func:`encoded_collate` joins a
batch's images end to end in one uint8 tensor, with an int64 tensor of offsets, in
shared memory: the DataLoader hands tensors to the training process by passing a
shared-memory handle, not their bytes. The other fields of the samples are collated
by ``torch``'s ``default_collate``. Each image is sniffed on the way
(:func:`~indextar.read.sniff.gpu_refusal`), in the workers, so that the training
process knows without reading them which images a GPU decoder refuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from ..errors import DecodeSpecError
from .shmblocks import (
    PooledBlock,
    batch_buffer,
    fill,
    given_back_on_error,
    lay_out,
    mark_views,
    rebuild,
)
from .sniff import gpu_refusal

if TYPE_CHECKING:
    import torch

__all__ = ["EncodedBatch", "EncodedCollate", "encoded_collate", "BytesLike"]

BytesLike = bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A batch's encoded images end to end, and the rest of its fields.

    Image ``i`` is ``data[offsets[i]:offsets[i + 1]]``. ``refusals`` holds
    ``(i, reason)`` for the images a GPU decoder refuses (``gpu_refusal``); ``rest`` is
    the other fields, collated: a tuple for tuple samples, a dict for dict samples,
    ``()`` for samples that are the image alone. ``field`` is where the images go back:
    a position in the tuple, a key of the dict, or ``None``.
    """

    data: torch.Tensor
    offsets: torch.Tensor
    refusals: tuple[tuple[int, str], ...]
    rest: Any
    field: int | str | None
    _block: PooledBlock | None = dataclass_field(default=None, repr=False, compare=False)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        fields = (self.data, self.offsets, self.refusals, self.rest, self.field)
        if self._block is None:
            return EncodedBatch, fields
        # a worker's batch in a reused block: the block's name crosses, not its memory;
        # the fields as they are now (a collate_fn around this one may have changed them)
        return _in_block, (self._block, mark_views(fields, self._block.tensor))

    def __len__(self) -> int:
        return int(self.offsets.numel()) - 1

    def images(self) -> list[torch.Tensor]:
        """Each image's bytes, a 1-D uint8 view of ``data``."""
        bounds = self.offsets.tolist()
        return [self.data[start:stop] for start, stop in zip(bounds, bounds[1:])]

    def assemble(self, images: Any) -> Any:
        """The batch with ``images`` in the place of the encoded ones."""
        if self.field is None:
            return images
        if isinstance(self.field, str):
            return {**self.rest, self.field: images}
        fields = list(self.rest)
        fields.insert(self.field, images)
        return tuple(fields)


def _in_block(whole: torch.Tensor, template: Any) -> EncodedBatch:
    """A pooled batch in the training process: its fields, views of the block
    ``whole`` where :func:`~indextar.read.shmblocks.mark_views` marked them."""
    return EncodedBatch(*rebuild(whole, template))


@dataclass(frozen=True, slots=True)
class EncodedCollate:
    """A DataLoader ``collate_fn`` that makes an :class:`EncodedBatch`; see
    :func:`encoded_collate`."""

    field: int | str = 0
    orient: bool = True
    reuse: bool = True

    def __call__(self, samples: Sequence[Any]) -> EncodedBatch:
        import torch
        from torch.utils.data import default_collate

        if not samples:
            raise DecodeSpecError("encoded_collate got an empty batch")
        first = samples[0]
        field: int | str | None
        if isinstance(first, BytesLike):
            blobs, rest, field = list(samples), (), None
        elif isinstance(first, dict):
            blobs = [sample[self.field] for sample in samples]
            others = [{k: v for k, v in s.items() if k != self.field} for s in samples]
            rest, field = (default_collate(others) if others[0] else {}), self.field
        elif isinstance(first, (tuple, list)) and isinstance(self.field, int):
            position = self.field
            blobs = [sample[position] for sample in samples]
            fields = [tuple(s[:position]) + tuple(s[position + 1 :]) for s in samples]
            rest, field = (tuple(default_collate(fields)) if fields[0] else ()), position
        else:
            raise DecodeSpecError(
                f"encoded_collate(field={self.field!r}) cannot find the image in a sample "
                f"of type {type(first).__name__}: samples must be bytes, tuples "
                f"(field= a position) or dicts (field= a key)"
            )
        for i, blob in enumerate(blobs):
            if not isinstance(blob, BytesLike):
                raise DecodeSpecError(
                    f"encoded_collate: sample {i} of the batch has a {type(blob).__name__} "
                    f"where the encoded image should be; read that member without decoding "
                    f"it (no image handler for it in decode=)"
                )
        sizes = [len(blob) for blob in blobs]
        bounds = [0, *accumulate(sizes)]
        refusals = tuple(
            (i, reason)
            for i, blob in enumerate(blobs)
            if (reason := gpu_refusal(blob, orient=self.orient)) is not None
        )
        # One block a batch: the offsets, the other fields' tensors, then the images.
        head = torch.tensor(bounds, dtype=torch.int64), rest
        template, parts, data_at = lay_out(head)
        whole, taken = batch_buffer(data_at + bounds[-1], self.reuse)
        with given_back_on_error(taken):
            fill(whole, parts)
            view = memoryview(whole[data_at:].numpy()).cast("B")  # type: ignore[arg-type]
            for blob, start, stop in zip(blobs, bounds, bounds[1:]):
                view[start:stop] = blob
        offsets, rest = rebuild(whole, template)
        return EncodedBatch(whole[data_at:], offsets, refusals, rest, field, taken)


def encoded_collate(
    field: int | str = 0, *, orient: bool = True, reuse: bool = True
) -> EncodedCollate:
    """A DataLoader ``collate_fn`` that hands a batch's encoded images over as one
    uint8 tensor with offsets (an :class:`EncodedBatch`), for :func:`indextar.on_gpu`.

    Parameters
    ----------
    field
        Where the image is in a sample: a position for tuple samples (``keys=``), a key
        for dict samples (``"jpg"``). Samples that are bytes alone are the image.
    orient
        Send JPEGs whose EXIF orientation turns them to the CPU path, which turns them
        upright as ``image_decoder(orient=True)`` does. Pass the stage's ``orient``.
    reuse
        In DataLoader workers, put each batch in one of a few shared-memory blocks the
        worker reuses once the training process has let go of every tensor of an
        earlier batch in it (``read/shmblocks.py``): a batch then crosses as a few
        bytes, where a new block a batch costs the training process a descriptor
        handshake, a mapping and 13 MB of pages freed for 64 JPEGs of 1024x768. A
        worker whose blocks are all held makes a new one, so keeping batches is safe;
        ``False`` makes a new block for every batch. The other fields' tensors share
        the images' block: a label tensor kept after its batch keeps that block (the
        GPU stage copies them out). A ``collate_fn`` around this one that returns new
        tensors in place of these should pass ``False``: a block whose batch is never
        sent stays taken (a worker whose blocks all stay taken logs a warning).
    """
    return EncodedCollate(field, orient, reuse)
