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
from typing import TYPE_CHECKING, Any

from ..errors import DecodeSpecError
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


@dataclass(frozen=True, slots=True)
class EncodedCollate:
    """A DataLoader ``collate_fn`` that makes an :class:`EncodedBatch`; see
    :func:`encoded_collate`."""

    field: int | str = 0
    orient: bool = True

    def __call__(self, samples: Sequence[Any]) -> EncodedBatch:
        import torch
        from torch.utils.data import default_collate, get_worker_info

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
        offsets = torch.zeros(len(blobs) + 1, dtype=torch.int64)
        torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0, out=offsets[1:])
        data = torch.empty(int(offsets[-1]), dtype=torch.uint8)
        if get_worker_info() is not None:
            # Put it in shared memory now, as default_collate does in a worker: the
            # DataLoader would otherwise copy it there when it sends the batch.
            data.share_memory_()  # type: ignore[no-untyped-call]
            offsets.share_memory_()  # type: ignore[no-untyped-call]
        view = memoryview(data.numpy()).cast("B")  # type: ignore[arg-type]
        position = 0
        for blob, size in zip(blobs, sizes):
            view[position : position + size] = blob
            position += size
        refusals = tuple(
            (i, reason)
            for i, blob in enumerate(blobs)
            if (reason := gpu_refusal(blob, orient=self.orient)) is not None
        )
        return EncodedBatch(data, offsets, refusals, rest, field)


def encoded_collate(field: int | str = 0, *, orient: bool = True) -> EncodedCollate:
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
    """
    return EncodedCollate(field, orient)
