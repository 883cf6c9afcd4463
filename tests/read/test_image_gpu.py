"""The GPU image stage on a CUDA device: nvJPEG (and DALI where installed) against
image_decoder, the CPU fallbacks on the device, and on_gpu's side stream through real
DataLoader workers. Skips without a GPU and torchvision; tests/read/test_gpu_stage.py
runs everything else on the CPU."""

from __future__ import annotations

import importlib.util
import io
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from photos import encode, photo, psnr
from torch.utils.data import DataLoader

from indextar import ImageStage, IndexedTarDataset, encoded_collate, image_decoder, on_gpu

torchvision = pytest.importorskip("torchvision")
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    # Python 3.12 warns when a process with threads (CUDA's, torch's pools) forks workers
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]
BACKENDS = ["nvjpeg"] + (["dali"] if importlib.util.find_spec("nvidia.dali") else [])


def photos(count: int = 6) -> list[bytes]:
    return [encode(photo(640 - 16 * (i % 3), 480, i)) for i in range(count)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size,fit", [(224, "crop"), ((224, 224), "crop"), ((200, 240), "pad")])
def test_gpu_decode_matches_image_decoder(backend: str, size: object, fit: str) -> None:
    jpegs = photos()
    stage = ImageStage(size, fit=fit, backend=backend, device="cuda")  # type: ignore[arg-type]
    images = stage.decode(encoded_collate()(jpegs))
    cpu = image_decoder("rgb8", size, fit=fit)  # type: ignore[arg-type]
    for got, jpeg in zip(images, jpegs):
        want = cpu(".jpg", jpeg)
        assert got.is_cuda and got.dtype == torch.uint8
        assert got.shape == (3, *want.shape[:2])
        assert psnr(got.permute(1, 2, 0).cpu().numpy(), want) >= 30
    assert not stage.fallbacks


def test_refused_images_fall_back_on_the_device() -> None:
    base = photo(320, 240, 9)
    blobs = [
        encode(base),
        encode(base, "PNG"),
        encode(base, "WEBP"),
        encode(base.convert("CMYK")),
        encode(base, progressive=True),
        encode(base.convert("L")),
    ]
    stage = ImageStage((96, 128), backend="nvjpeg", device="cuda")
    images, labels = stage(encoded_collate()([(blob, i) for i, blob in enumerate(blobs)]))
    assert images.shape == (6, 3, 96, 128) and images.is_cuda and labels.is_cuda
    # nvJPEG builds differ on progressive JPEGs: a refusal falls back as "decoder"
    assert stage.fallbacks["decoder"] <= 1
    assert {k: n for k, n in stage.fallbacks.items() if k != "decoder"} == {
        "png": 1,
        "webp": 1,
        "cmyk": 1,
    }
    want = image_decoder("rgb8", (96, 128))
    for got, blob in zip(images, blobs):
        assert psnr(got.permute(1, 2, 0).cpu().numpy(), want(".jpg", blob)) >= 30


@pytest.mark.parametrize("decoders", [1, 2])
def test_on_gpu_through_workers(tmp_path: Path, decoders: int) -> None:
    jpegs = photos(24)
    path = tmp_path / "gpu-000000.tar"
    with tarfile.open(path, "w") as tar:
        for i, jpeg in enumerate(jpegs):
            for ext, data in (("jpg", jpeg), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    ds = IndexedTarDataset(str(path), keys=("jpg", "cls"), decode=[])
    loader = DataLoader(ds, batch_size=5, num_workers=2, collate_fn=encoded_collate(), shuffle=True)
    staged = on_gpu(loader, (128, 160), decoders=decoders)
    assert staged.stage.backend == "nvjpeg"
    got = []
    for images, labels in staged:
        assert images.is_cuda and labels.is_cuda
        # work on the caller's stream that reads the batch, as training would
        got.append((labels.tolist(), images.float().sum().item(), images.clone()))
    assert sorted(i for labels, _, _ in got for i in labels) == list(range(24))
    synchronous = ImageStage((128, 160), device="cuda")
    for labels, total, images in got:
        again = synchronous.decode(encoded_collate()([jpegs[i] for i in labels]))
        assert torch.equal(images, again) and total == again.float().sum().item()
    assert staged.timings.batches == 5
    # a break part-way stops the threads and the workers
    for _ in staged:
        break
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith(("indextar-on-gpu", "indextar-fetch"))]


def test_psnr_over_a_batch_is_reported() -> None:
    """One figure for the notes: the mean PSNR of nvJPEG + torch against image_decoder."""
    jpegs = photos(8)
    images = ImageStage(256, device="cuda").decode(encoded_collate()(jpegs))
    cpu = image_decoder("rgb8", 256)
    values = [
        psnr(got.permute(1, 2, 0).cpu().numpy(), cpu(".jpg", jpeg))
        for got, jpeg in zip(images, jpegs)
    ]
    print(f"PSNR nvjpeg vs image_decoder: mean {np.mean(values):.1f} dB, min {min(values):.1f}")
    assert min(values) >= 30


def test_normalize_on_the_device() -> None:
    """normalize= on CUDA: the uint8 images' (pixels / 255 - mean) / std, per channel, in
    bfloat16, on the device; through on_gpu's two decoding threads too."""
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    jpegs = photos(8)
    batch = encoded_collate()(jpegs)
    plain = ImageStage((64, 80), device="cuda").decode(batch)
    stage = ImageStage((64, 80), device="cuda", normalize=(mean, std), dtype=torch.bfloat16)
    scaled = stage.decode(batch)
    assert isinstance(scaled, torch.Tensor) and scaled.is_cuda and scaled.dtype == torch.bfloat16
    shape = (1, 3, 1, 1)
    want = (plain.double() / 255 - torch.tensor(mean, device="cuda").view(shape)) / torch.tensor(
        std, device="cuda"
    ).view(shape)
    assert torch.allclose(scaled.double(), want, atol=2e-2, rtol=2e-2)
    staged = on_gpu([encoded_collate()(jpegs[:4]), encoded_collate()(jpegs[4:])], (64, 80),
                    normalize=(mean, std))  # fmt: skip
    got = torch.cat([images for images in staged])
    assert got.dtype == torch.float32 and torch.allclose(got.double(), want, atol=1e-4)
