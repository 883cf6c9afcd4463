"""Decoded images resized in torch, batched by shape, with ``image_decoder``'s rules.

The GPU image stage decodes full-size images on the device; this module brings them to
training size there. Images of one shape share a :class:`~indextar.read.image.Geometry`,
so each shape is one stacked, antialiased ``interpolate`` call (the filter Pillow uses
when it shrinks, which ``image_decoder`` uses). The crop box is rounded to whole source
pixels: at most half a source pixel from ``image_decoder``'s box, a fraction of an
output pixel once shrunk. Runs on any torch device; the tests run it on the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import DecodeSpecError
from .image import Fit, Geometry, target_geometry

if TYPE_CHECKING:
    import torch

__all__ = ["TORCH_FILTERS", "check_filter", "resize_groups"]

# image_decoder's filters that torch's interpolate has: (mode, antialias).
TORCH_FILTERS = {
    "nearest": ("nearest", False),
    "bilinear": ("bilinear", True),
    "bicubic": ("bicubic", True),
}


def check_filter(resample: str) -> None:
    """Raise :class:`DecodeSpecError` unless torch can resize with ``resample``."""
    if resample not in TORCH_FILTERS:
        raise DecodeSpecError(
            f"on_gpu resample= must be one of {', '.join(TORCH_FILTERS)} to resize on the "
            f"GPU; got {resample!r} (backend='cpu' has every image_decoder filter)"
        )


def resize_groups(
    images: list[torch.Tensor],
    size: int | tuple[int, int] | None,
    *,
    fit: Fit = "crop",
    resample: str = "bilinear",
) -> list[tuple[list[int], torch.Tensor]]:
    """The uint8 CHW ``images`` resized as ``image_decoder(size=, fit=, resample=)``
    would, on their own device, one call per distinct input shape: for each shape, the
    positions in ``images`` of its images and their NCHW stack, resized."""
    import torch

    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(image.shape), []).append(i)
    out = []
    for shape, members in groups.items():
        stack = torch.stack([images[i] for i in members])
        if size is not None:
            geometry = target_geometry(shape[-1], shape[-2], size, fit)
            stack = _resize_stack(stack, geometry, resample)
        out.append((members, stack))
    return out


def _resize_stack(stack: torch.Tensor, geometry: Geometry, resample: str) -> torch.Tensor:
    """An NCHW uint8 stack of one shape, resized and placed as ``geometry`` says."""
    import torch
    from torch.nn.functional import interpolate

    left, top, right, bottom = geometry.box
    x0, y0 = round(left), round(top)
    x1, y1 = max(x0 + 1, round(right)), max(y0 + 1, round(bottom))
    source = stack[:, :, y0:y1, x0:x1]
    content_w, content_h = geometry.content
    if (source.shape[-2], source.shape[-1]) == (content_h, content_w):
        resized = source
    else:
        mode, antialias = TORCH_FILTERS[resample]
        pixels = interpolate(
            source.float(),
            (content_h, content_w),
            mode=mode,
            antialias=antialias,
            **({} if mode == "nearest" else {"align_corners": False}),
        )
        resized = pixels.round_().clamp_(0, 255).to(torch.uint8)
    canvas_w, canvas_h = geometry.canvas
    if (canvas_w, canvas_h) == (content_w, content_h):
        return resized
    canvas = torch.zeros(
        (*stack.shape[:2], canvas_h, canvas_w), dtype=torch.uint8, device=stack.device
    )
    offset_x, offset_y = geometry.offset
    canvas[:, :, offset_y : offset_y + content_h, offset_x : offset_x + content_w] = resized
    return canvas
