"""The GPU image stage's DALI backend: a batch decoded by DALI's mixed decoder.

``nvidia.dali``'s ``fn.decoders.image(device="mixed")`` uses the hardware JPEG engines
of an A100 or H100 where it can (nvJPEG's hardware backend), and nvJPEG's hybrid
decoder elsewhere. This module runs a one-operator pipeline fed from memory, and hands
each decoded image over to torch on the current stream as a CHW uint8 tensor; the
resize is the stage's own (``read/resize.py``), the same as for the nvjpeg backend.
Imported only when ``on_gpu(backend="dali")`` is asked for.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..errors import DecodeSpecError

if TYPE_CHECKING:
    import torch

__all__ = ["DaliDecoder"]

_THREADS = 4


class DaliDecoder:
    """Decodes lists of encoded JPEGs (1-D uint8 CPU tensors) to CHW uint8 on a CUDA
    device with DALI; a failed batch gives ``None`` for each image it held."""

    def __init__(self, device: torch.device) -> None:
        try:
            from nvidia import dali  # noqa: F401
        except ImportError as e:
            raise DecodeSpecError(
                "on_gpu(backend='dali') needs NVIDIA DALI: pip install "
                "nvidia-dali-cuda120 (or the build for your CUDA)"
            ) from e
        self.device_id = 0 if device.index is None else device.index
        self._pipe: Any = None
        self._capacity = 0
        self._lock = threading.Lock()  # one pipeline, fed and run by one thread at a time

    def _pipeline(self, count: int) -> Any:
        if self._pipe is not None and count <= self._capacity:
            return self._pipe
        from nvidia.dali import fn, pipeline_def, types

        capacity = max(count, 2 * self._capacity, 64)

        @pipeline_def(  # type: ignore[untyped-decorator]
            batch_size=capacity,
            num_threads=_THREADS,
            device_id=self.device_id,
            prefetch_queue_depth=1,
            exec_async=False,
            exec_pipelined=False,
        )
        def decode_pipeline() -> Any:
            jpegs = fn.external_source(name="jpegs", device="cpu", dtype=types.UINT8, ndim=1)
            return fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)

        pipe = decode_pipeline()
        pipe.build()
        self._pipe, self._capacity = pipe, capacity
        return pipe

    def __call__(self, blobs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        import torch
        from nvidia.dali.plugin.pytorch import feed_ndarray

        with self._lock:  # the pipeline's outputs are reused by its next run
            pipe = self._pipeline(len(blobs))
            try:
                pipe.feed_input("jpegs", [blob.numpy() for blob in blobs])
                (decoded,) = pipe.run()
            except Exception:  # noqa: BLE001 - the CPU path decodes them, or names the error
                return [None] * len(blobs)
            stream = torch.cuda.current_stream(self.device_id)
            out: list[torch.Tensor | None] = []
            for i in range(len(blobs)):
                image = decoded[i]
                pixels = torch.empty(
                    tuple(image.shape()), dtype=torch.uint8, device=f"cuda:{self.device_id}"
                )
                feed_ndarray(image, pixels, cuda_stream=stream)
                out.append(pixels.permute(2, 0, 1))
        return out
