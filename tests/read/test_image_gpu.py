"""The GPU hand-off planned in docs/dataset.md: workers pass JPEG bytes, the main process
decodes a batch with nvJPEG (torchvision.io.decode_jpeg(device="cuda")) and resizes it
as image_decoder does. Skips without a GPU; the CPU path is what CI proves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from photos import encode, photo, psnr

from indextar import image_decoder

torchvision = pytest.importorskip("torchvision")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def decode_on_gpu(jpegs: list[bytes], size: int) -> list[torch.Tensor]:
    """uint8 CHW tensors on the GPU, shorter side ``size`` (torchvision's rule)."""
    from torch.nn.functional import interpolate
    from torchvision.io import ImageReadMode, decode_jpeg

    data = [torch.frombuffer(bytearray(jpeg), dtype=torch.uint8) for jpeg in jpegs]
    images = decode_jpeg(data, mode=ImageReadMode.RGB, device="cuda")
    out = []
    for image in images:
        h, w = image.shape[1:]
        new = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
        resized = interpolate(image[None].float(), new, mode="bilinear", antialias=True)
        out.append(resized[0].round().clamp(0, 255).to(torch.uint8))
    return out


def test_gpu_decode_matches_image_decoder() -> None:
    jpegs = [encode(photo(640, 480, seed)) for seed in range(4)]
    cpu = image_decoder("torchrgb8", 224)
    for got, jpeg in zip(decode_on_gpu(jpegs, 224), jpegs):
        want = cpu(".jpg", jpeg)
        assert got.shape == want.shape
        assert psnr(got.cpu().numpy(), np.asarray(want)) >= 30
