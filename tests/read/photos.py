"""Photo-like test images made at run time: smooth gradients, noise and shapes."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw


def photo(width: int = 640, height: int = 480, seed: int = 0) -> Image.Image:
    """An RGB image with what makes photos photos: smooth shading, sensor-like noise and
    hard-edged shapes (so that resampling differences show), seeded."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.empty((height, width, 3), np.float32)
    for channel in range(3):
        fx, fy, phase = rng.uniform(-1, 1, 3)
        pixels[..., channel] = 128 + 80 * np.sin(fx * x / 60 + fy * y / 45 + phase * 6)
    pixels += rng.normal(0, 10, pixels.shape)
    img = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(8):
        x0, y0 = int(rng.integers(0, width * 3 // 4)), int(rng.integers(0, height * 3 // 4))
        x1, y1 = x0 + int(rng.integers(2, width // 3)), y0 + int(rng.integers(2, height // 3))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=fill)
    return img


def encode(img: Image.Image, fmt: str = "JPEG", **options: object) -> bytes:
    """``img`` saved as ``fmt`` (JPEG at quality 90 unless told otherwise)."""
    if fmt == "JPEG":
        options.setdefault("quality", 90)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **options)
    return buf.getvalue()


def psnr(got: np.ndarray, want: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images, in dB (inf when equal)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    mse = float(np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
