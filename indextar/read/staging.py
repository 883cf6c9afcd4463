"""Pinned host buffers that a batch's encoded bytes are copied into before decoding.

The GPU decoders read their input from host memory and copy it to the device; from
pinned (page-locked) memory those copies are DMA, asynchronous to the host. Three
buffers take turns (the batch the caller holds, the one waiting for it, the one being
decoded); each is reused only once the device work that read it has finished.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["PinnedStaging"]

_BUFFERS = 3


class PinnedStaging:
    """A ring of growing pinned uint8 buffers; see the module's docstring."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor | None] = [None] * _BUFFERS
        self._events: list[torch.cuda.Event | None] = [None] * _BUFFERS
        self._turn = -1

    def take(self, data: torch.Tensor) -> torch.Tensor:
        """A pinned copy of the 1-D uint8 ``data``, in the next buffer of the ring."""
        import torch

        self._turn = (self._turn + 1) % _BUFFERS
        event = self._events[self._turn]
        if event is not None:
            event.synchronize()  # the device may still read this buffer's last batch
        buffer = self._buffers[self._turn]
        size = data.numel()
        if buffer is None or buffer.numel() < size:
            # Grow by a quarter more than asked, so that slightly larger batches fit.
            buffer = torch.empty(size + size // 4, dtype=torch.uint8, pin_memory=True)
            self._buffers[self._turn] = buffer
        pinned = buffer[:size]
        pinned.copy_(data)
        return pinned

    def used(self) -> None:
        """Mark the buffer last taken as read by the work queued so far on the current
        stream."""
        import torch

        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record()
        self._events[self._turn] = event
