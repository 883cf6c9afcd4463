"""Photo-like test images for the decode benchmarks (tools/bench_decode.py,
tools/bench_gpu.py): smooth shaded scenes with shapes, and noise to add to them, so
that JPEGs of them compress and decode like photographs, not flat colour."""

from __future__ import annotations

import numpy as np


def photo_scenes(rng: np.random.Generator, count: int, width: int, height: int) -> list[np.ndarray]:
    """``count`` scenes (int16, ``height x width x 3``): three shaded waves and 12
    ellipses each."""
    from PIL import Image, ImageDraw

    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    scenes = []
    for _ in range(count):
        scene = np.empty((height, width, 3), np.float32)
        for c in range(3):
            fx, fy, phase = rng.uniform(-1, 1, 3)
            scene[..., c] = 128 + 80 * np.sin(fx * x / 90 + fy * y / 70 + phase * 6)
        img = Image.fromarray(scene.clip(0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(12):
            x0, y0 = int(rng.integers(0, width - 100)), int(rng.integers(0, height - 100))
            box = [x0, y0, x0 + int(rng.integers(20, 300)), y0 + int(rng.integers(20, 300))]
            draw.ellipse(box, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        scenes.append(np.asarray(img, np.int16))
    return scenes


def photo_noise(rng: np.random.Generator, count: int, width: int, height: int) -> list[np.ndarray]:
    """``count`` noise fields (int16, -12..12) to add to a scene."""
    return [rng.integers(-12, 13, (height, width, 3), dtype=np.int16) for _ in range(count)]
