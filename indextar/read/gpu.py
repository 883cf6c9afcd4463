"""The GPU image stage: a batch's JPEGs decoded and resized on the device.

DataLoader workers cannot use CUDA, and nvJPEG pays off on whole batches, so the
workers only read: :func:`~indextar.read.encoded.encoded_collate` hands a batch's
encoded images over as one uint8 tensor in shared memory. :class:`ImageStage` then
decodes the batch in the training process, with nvJPEG
(``torchvision.io.decode_jpeg(list, device="cuda")``) or DALI's mixed decoder,
resizes it by shape with ``image_decoder``'s rules (``read/resize.py``) and returns
uint8 NCHW on the device (or, with ``normalize=``, floats). Images a GPU decoder
refuses (PNG, WebP, CMYK, EXIF-turned; see ``read/sniff.py``), or that it fails on,
are decoded by ``image_decoder`` on the CPU instead: counted in
:attr:`ImageStage.fallbacks` and logged once per reason.
Without CUDA (``backend="cpu"``) every image takes that path, with the same shapes.

:func:`on_gpu` wraps a loader: a thread takes batches from the loader and two decode
them in turn, each on a side CUDA stream, while the caller trains on batch N
(``read/staged.py``).
torchvision (and DALI) are imported only here, and only when a GPU backend is used.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from ..errors import DecodeError, DecodeSpecError
from .encoded import EncodedBatch
from .image import Backend as JpegBackend
from .image import Fit, image_decoder
from .resize import check_filter, resize_groups
from .shmblocks import map_leaves

if TYPE_CHECKING:
    import torch

    from .staging import PinnedStaging

__all__ = ["ImageStage", "StageBackend", "STAGE_BACKENDS"]

log = logging.getLogger(__name__)

StageBackend = Literal["auto", "nvjpeg", "dali", "cpu", "reference"]
STAGE_BACKENDS = ("auto", "nvjpeg", "dali", "cpu", "reference")
DecodeMany = Callable[[list["torch.Tensor"]], list["torch.Tensor | None"]]


class ImageStage:
    """Decodes :class:`EncodedBatch` es to NCHW tensors on ``device``: uint8, or with
    ``normalize=(mean, std)`` floats in ``dtype``.

    Call it on a batch (``stage(batch)``) to get the batch back with the images decoded
    in the encoded ones' place, on the current CUDA stream; or use :func:`on_gpu`, which
    overlaps it with training. ``backend``: ``"nvjpeg"`` (torchvision's
    ``decode_jpeg`` on the GPU: nvJPEG's hardware JPEG engines on an A100 or H100),
    ``"dali"`` (DALI's mixed decoder), ``"cpu"`` (``image_decoder``, the same shapes),
    or ``"auto"``: nvjpeg where CUDA and torchvision are present, else cpu.
    ``"reference"`` does what the GPU backends do (full-size decode, refusals routed to
    the CPU path, torch's resize by shape) with Pillow on any device: the GPU path's
    twin, which the tests run where there is no GPU. Arguments as :func:`indextar.on_gpu`.
    """

    def __init__(
        self,
        size: int | tuple[int, int] | None = 256,
        *,
        fit: Fit = "crop",
        resample: str = "bilinear",
        orient: bool = True,
        device: str | torch.device | None = None,
        backend: StageBackend = "auto",
        jpeg_backend: JpegBackend = "auto",
        pin_memory: bool = False,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        import torch

        # image_decoder checks size, fit and resample, and is the CPU path.
        self._cpu = image_decoder(
            "rgb8", size, fit=fit, resample=resample, orient=orient, backend=jpeg_backend
        )
        if backend not in STAGE_BACKENDS:
            raise DecodeSpecError(
                f"on_gpu backend= must be one of {', '.join(STAGE_BACKENDS)}; got {backend!r}"
            )
        cuda = torch.cuda.is_available()
        self.device = torch.device(device if device is not None else ("cuda" if cuda else "cpu"))
        if self.device.type == "cuda" and self.device.index is None and cuda:
            # an index, for torch.cuda.set_device in on_gpu's thread (it refuses "cuda")
            self.device = torch.device("cuda", torch.cuda.current_device())
        if backend == "auto":
            on_cuda = self.device.type == "cuda" and cuda
            backend = "nvjpeg" if on_cuda and _torchvision_io() is not None else "cpu"
        self.backend: StageBackend = backend
        self.fallbacks: Counter[str] = Counter()
        """Images decoded on the CPU because the GPU decoder refused them, by reason
        (``"png"``, ``"webp"``, ``"cmyk"``, ``"orientation"``, ``"decoder"``, ...)."""
        self._logged: set[str] = set()
        self._count_lock = threading.Lock()
        self._gpu: DecodeMany | None = None
        self._pinned = False
        self._local = threading.local()  # each decoding thread's own pinned buffers
        if backend == "reference":
            check_filter(resample)
            self._gpu = _reference(self.device)
        elif backend != "cpu":
            if self.device.type != "cuda" or not cuda:
                raise DecodeSpecError(
                    f"on_gpu(backend={backend!r}) needs a CUDA device; got device="
                    f"{str(self.device)!r} with CUDA {'present' if cuda else 'absent'} "
                    f"(backend='cpu' or 'auto' decodes on the CPU)"
                )
            check_filter(resample)
            self._gpu = _nvjpeg(self.device) if backend == "nvjpeg" else _dali(self.device)
            self._pinned = pin_memory
        self.dtype, self._affine = _normalizing(normalize, dtype)
        """The images' dtype: ``torch.uint8``, or the float ``dtype`` of ``normalize``."""
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def size(self) -> int | tuple[int, int] | None:
        """The target size, as ``image_decoder``'s ``size=``."""
        return self._cpu.size

    def __call__(self, batch: EncodedBatch) -> Any:
        """``batch`` with its images decoded (:meth:`decode`) in their place, and its
        other tensors copied to the device (copied on the CPU too: they share the
        encoded images' shared-memory block, which is then free to be reused)."""
        images = self.decode(batch)
        if not batch.rest:
            return batch.assemble(images)
        return replace(batch, rest=_to_device(batch.rest, self.device)).assemble(images)

    def decode(self, batch: EncodedBatch) -> torch.Tensor | list[torch.Tensor]:
        """The batch's images as one NCHW tensor on the device (uint8, or normalized in
        :attr:`dtype`); a list of CHW tensors instead where their shapes differ (an int
        ``size`` and images of different aspect ratios)."""
        if not isinstance(batch, EncodedBatch):
            raise DecodeSpecError(
                f"on_gpu and ImageStage take the batches encoded_collate() makes (an "
                f"EncodedBatch); got a {type(batch).__name__}: give the DataLoader "
                f"collate_fn=encoded_collate()"
            )
        count = len(batch)
        sizes = batch.offsets.diff().tolist()
        first, last = int(batch.offsets[0]), int(batch.offsets[-1])
        # one call gives every image's view (64 slices would be 64 calls holding the GIL)
        blobs = batch.data[first:last].split(sizes)  # type: ignore[no-untyped-call]
        groups: list[tuple[list[int], torch.Tensor]] = []
        on_cpu: list[tuple[int, str | None]] = [(i, None) for i in range(count)]
        if self._gpu is not None:
            on_cpu = list(batch.refusals)
            refused = {i for i, _ in on_cpu}
            todo = [i for i in range(count) if i not in refused]
            staging = self._staging() if self._pinned else None
            if staging is not None:  # pinned: the decoder's copies to the device are DMA
                pinned = staging.take(batch.data[first:last])
                blobs = pinned.split(sizes)  # type: ignore[no-untyped-call]
            decoded = self._gpu([blobs[i] for i in todo]) if todo else []
            if staging is not None:
                staging.used()
            good = [(i, image) for i, image in zip(todo, decoded) if image is not None]
            on_cpu += [(i, "decoder") for i, image in zip(todo, decoded) if image is None]
            resized = resize_groups(
                [image for _, image in good],
                self.size,
                fit=self._cpu.fit,
                resample=self._cpu.resample,
            )
            groups = [([good[k][0] for k in members], stack) for members, stack in resized]
        for i, reason in sorted(on_cpu):
            if reason is not None:
                self._count(reason)
            image = self._decode_cpu(blobs[i], i, count)
            groups.append(([i], image.unsqueeze(0)))
        images = _assemble(count, groups, self.device)
        if self._affine is None:
            return images
        if isinstance(images, list):
            return [self._normalized(image[None])[0] for image in images]
        return self._normalized(images)

    def _normalized(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 NCHW ``images`` as ``(images / 255 - mean) / std``, in ``self.dtype``
        (computed in float32)."""
        import torch

        affine = self._on_device.get(images.device)
        if affine is None:  # once a device: a copy from pageable memory waits for the stream
            assert self._affine is not None
            offset, scale = (v.to(images.device) for v in self._affine)
            affine = self._on_device[images.device] = offset, scale
        offset, scale = affine
        out = images.to(torch.float32).sub_(offset).mul_(scale)
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def _staging(self) -> PinnedStaging:
        staging: PinnedStaging | None = getattr(self._local, "staging", None)
        if staging is None:
            from .staging import PinnedStaging

            staging = self._local.staging = PinnedStaging()
        return staging

    def _decode_cpu(self, blob: torch.Tensor, position: int, count: int) -> torch.Tensor:
        import numpy as np
        import torch

        try:
            img = self._cpu.decode_pil(blob.numpy().tobytes())
        except Exception as e:
            raise DecodeError(
                f"image {position} of a batch of {count} ({blob.numel()} bytes): cannot "
                f"decode it: {e}"
            ) from e
        pixels = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1)
        return pixels.to(self.device) if self.device.type != "cpu" else pixels

    def _count(self, reason: str) -> None:
        with self._count_lock:  # on_gpu's decoding threads share the stage
            self.fallbacks[reason] += 1
            first = reason not in self._logged
            self._logged.add(reason)
        if first:
            log.warning(
                "on_gpu: an image the %s decoder does not take (%s) is decoded on the CPU; "
                "such images are counted in ImageStage.fallbacks and not logged again",
                self.backend,
                reason,
            )


def _normalizing(
    normalize: tuple[Sequence[float], Sequence[float]] | None, dtype: torch.dtype | None
) -> tuple[torch.dtype, tuple[torch.Tensor, torch.Tensor] | None]:
    """The output dtype, and the ``(offset, scale)`` per channel (shaped ``(1, 3, 1,
    1)``, in units of the uint8 pixels) that ``normalize=(mean, std)`` asks for."""
    import torch

    if normalize is None:
        if dtype not in (None, torch.uint8):
            raise DecodeSpecError(
                f"on_gpu dtype={dtype} needs normalize=(mean, std): without it images are "
                f"uint8 (normalize=((0, 0, 0), (1, 1, 1)) gives floats in [0, 1])"
            )
        return torch.uint8, None
    dtype = torch.float32 if dtype is None else dtype
    try:
        mean, std = (torch.tensor(list(v), dtype=torch.float64) for v in normalize)
    except (TypeError, ValueError) as e:
        raise DecodeSpecError(
            f"on_gpu normalize= must be (mean, std), three numbers each; got {normalize!r}"
        ) from e
    if mean.shape != (3,) or std.shape != (3,) or not bool((std > 0).all()):
        raise DecodeSpecError(
            f"on_gpu normalize= must be (mean, std), three numbers each (R, G, B, as "
            f"fractions of 255), every std above 0; got {normalize!r}"
        )
    if not dtype.is_floating_point:
        raise DecodeSpecError(f"on_gpu dtype= must be a float dtype with normalize=; got {dtype}")
    offset = (mean * 255).to(torch.float32).view(1, 3, 1, 1)
    scale = (1 / (std * 255)).to(torch.float32).view(1, 3, 1, 1)
    return dtype, (offset, scale)


def _assemble(
    count: int, groups: list[tuple[list[int], torch.Tensor]], device: torch.device
) -> torch.Tensor | list[torch.Tensor]:
    """``count`` images from ``groups`` (their positions, their NCHW stack) in order:
    one NCHW tensor where they share a shape (the one stack itself when there is one
    group), else a list of CHW tensors."""
    import torch

    if not groups:
        return torch.empty((0, 3, 0, 0), dtype=torch.uint8, device=device)
    if len(groups) == 1:
        return groups[0][1]
    shape = groups[0][1].shape[1:]
    if all(stack.shape[1:] == shape for _, stack in groups):
        out = torch.empty((count, *shape), dtype=torch.uint8, device=device)
        for members, stack in groups:
            if len(members) == 1:
                out[members[0]] = stack[0]
            else:
                out[torch.tensor(members, device=device)] = stack
        return out
    images: list[torch.Tensor | None] = [None] * count
    for members, stack in groups:
        for i, image in zip(members, stack):
            images[i] = image
    return [image for image in images if image is not None]


def _to_device(value: Any, device: torch.device) -> Any:
    """``value`` with a copy of every tensor in it (tuples, lists, dicts) on ``device``."""
    import torch

    pin = device.type == "cuda"

    def move(item: Any) -> Any:
        if not isinstance(item, torch.Tensor):
            return item
        if pin and not item.is_cuda:
            # from pageable memory a copy first waits for the stream's work (this batch's
            # decode and resize): through torch's cached pinned blocks it does not
            item = item.pin_memory()
        return item.to(device, non_blocking=True, copy=True)

    return map_leaves(move, value)


def _torchvision_io() -> Any:
    try:
        import torchvision.io
    except ImportError:
        return None
    return torchvision.io


def _nvjpeg(device: torch.device) -> DecodeMany:
    io = _torchvision_io()
    if io is None:
        raise DecodeSpecError(
            "on_gpu(backend='nvjpeg') needs torchvision (pip install torchvision, the build "
            "matching your torch)"
        )
    rgb = io.ImageReadMode.RGB

    def decode(blobs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        try:
            return list(io.decode_jpeg(blobs, mode=rgb, device=device))
        except Exception:  # noqa: BLE001 - its checks raise RuntimeError or ValueError
            pass  # one bad image fails the batch: find it, and decode the rest
        decoded: list[torch.Tensor | None] = []
        for blob in blobs:
            try:
                decoded.append(io.decode_jpeg(blob, mode=rgb, device=device))
            except Exception:  # noqa: BLE001 - the CPU path decodes it, or names the error
                decoded.append(None)
        return decoded

    return decode


def _reference(device: torch.device) -> DecodeMany:
    import io

    import numpy as np
    import PIL.Image
    import torch

    def decode(blobs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        decoded: list[torch.Tensor | None] = []
        for blob in blobs:
            try:
                with PIL.Image.open(io.BytesIO(blob.numpy().tobytes())) as img:
                    pixels = np.array(img.convert("RGB"), dtype=np.uint8)
            except (OSError, ValueError):
                decoded.append(None)
                continue
            decoded.append(torch.from_numpy(pixels).permute(2, 0, 1).to(device))
        return decoded

    return decode


def _dali(device: torch.device) -> DecodeMany:
    from .gpu_dali import DaliDecoder

    return DaliDecoder(device)
