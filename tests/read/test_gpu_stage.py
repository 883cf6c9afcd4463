"""The GPU image stage without a GPU: the workers' hand-off (one uint8 tensor with
offsets, in shared memory, through real fork and spawn DataLoader workers), the sniffing
that routes images a GPU decoder refuses to the CPU, and the CPU backend against
image_decoder. tests/read/test_image_gpu.py runs the CUDA half."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import logging
import struct
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from photos import encode, photo, psnr
from procstats import mapping_of
from torch.utils.data import DataLoader

from indextar import (
    DecodeError,
    DecodeSpecError,
    ImageStage,
    IndexedTarDataset,
    encoded_collate,
    image_decoder,
    on_gpu,
)
from indextar.read.sniff import gpu_refusal

# Python 3.12 warns when a process with threads forks (torch's own thread pools count);
# DataLoader workers fork so in every torch program.
pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


def stage_threads() -> list[str]:
    """The names of on_gpu's threads (fetching and decoding) still running."""
    names = (t.name for t in threading.enumerate())
    return [n for n in names if n.startswith(("indextar-on-gpu", "indextar-fetch"))]


def exif_jpeg(orientation: int) -> bytes:
    """A JPEG with an EXIF block giving ``orientation``."""
    img = photo(64, 48, 7)
    exif = img.getexif()
    exif[0x0112] = orientation
    return encode(img, exif=exif.tobytes())


def mixed_images() -> dict[str, bytes]:
    base = photo(160, 120, 1)
    return {
        "jpg": encode(base),
        "progressive": encode(photo(160, 120, 2), progressive=True),
        "grey": encode(photo(160, 120, 3).convert("L")),
        "png": encode(photo(160, 120, 4), "PNG"),
        "webp": encode(photo(160, 120, 5), "WEBP"),
        "cmyk": encode(photo(160, 120, 6).convert("CMYK")),
        "turned": exif_jpeg(6),
    }


def test_sniff_names_what_a_gpu_decoder_refuses() -> None:
    images = mixed_images()
    got = {name: gpu_refusal(data) for name, data in images.items()}
    assert got == {
        "jpg": None,
        "progressive": None,
        "grey": None,
        "png": "png",
        "webp": "webp",
        "cmyk": "cmyk",
        "turned": "orientation",
    }
    assert gpu_refusal(images["turned"], orient=False) is None
    assert gpu_refusal(exif_jpeg(1)) is None
    assert gpu_refusal(encode(photo(32, 32, 0), "GIF")) == "gif"
    assert gpu_refusal(encode(photo(32, 32, 0), "BMP")) == "bmp"
    assert gpu_refusal(images["jpg"][:40]) == "truncated"
    assert gpu_refusal(b"") == "other"
    # a 12-bit frame header: precision byte 12
    sof = images["jpg"].index(b"\xff\xc0")
    twelve = bytearray(images["jpg"])
    twelve[sof + 4] = 12
    assert gpu_refusal(bytes(twelve)) == "precision"


def test_collate_joins_images_in_one_tensor() -> None:
    blobs = [encode(photo(40 + i, 30, i)) for i in range(3)] + [encode(photo(20, 20), "PNG")]
    batch = encoded_collate()([(blob, i, f"k{i}") for i, blob in enumerate(blobs)])
    assert batch.data.dtype == torch.uint8 and batch.offsets.dtype == torch.int64
    assert batch.offsets.tolist() == list(np.cumsum([0, *map(len, blobs)]))
    assert [bytes(image.numpy()) for image in batch.images()] == blobs
    assert batch.refusals == ((3, "png"),)
    labels, keys = batch.rest
    assert labels.tolist() == [0, 1, 2, 3] and list(keys) == ["k0", "k1", "k2", "k3"]
    assert batch.assemble("images") == ("images", labels, keys)

    dicts = encoded_collate("jpg")([{"jpg": blob, "cls": i} for i, blob in enumerate(blobs)])
    assert dicts.assemble("images")["jpg"] == "images" and len(dicts) == 4
    assert encoded_collate()(blobs).assemble("images") == "images"
    with pytest.raises(DecodeSpecError, match="sample 0 of the batch has a ndarray"):
        encoded_collate()([(np.zeros(3), 0)])


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gpu") / "photos-000000.tar"
    images = list(mixed_images().values())
    with tarfile.open(path, "w") as tar:
        for i in range(16):
            for ext, data in (("jpg", images[i % len(images)]), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{i:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("reuse", [True, False])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_hand_over_shared_tensors(shard: Path, method: str, reuse: bool) -> None:
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    loader = DataLoader(
        ds,
        batch_size=5,
        num_workers=2,
        multiprocessing_context=method,
        collate_fn=encoded_collate(reuse=reuse),
    )
    seen = 0
    for batch in loader:
        if reuse:  # a block the worker reuses, mapped here once (test_shmblocks.py)
            assert "/dev/shm/" in mapping_of(batch.data.data_ptr())
        else:
            assert batch.data.is_shared() and batch.offsets.is_shared()
        labels = batch.rest[0].tolist()
        assert [bytes(b.numpy()) for b in batch.images()] == [ds[i][0] for i in labels]
        assert [i for i, _ in batch.refusals] == [
            k for k, i in enumerate(labels) if gpu_refusal(ds[i][0]) is not None
        ]
        seen += len(batch)
    assert seen == 16


@pytest.mark.parametrize("size,fit", [((64, 96), "crop"), ((64, 64), "pad"), (48, "crop")])
def test_cpu_backend_is_image_decoder(shard: Path, size: int | tuple[int, int], fit: str) -> None:
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    loader = DataLoader(ds, batch_size=7, num_workers=1, collate_fn=encoded_collate())
    staged = on_gpu(loader, size, fit=fit, device="cpu")  # backend="auto": cpu on a CPU
    assert staged.stage.backend == "cpu" and len(staged) == 3
    reference = image_decoder("rgb8", size, fit=fit)
    for images, labels in staged:
        # an int size keeps aspects: a batch with the EXIF-turned (standing) photo is a list
        turned = any(i % 7 == 6 for i in labels.tolist())
        one_shape = isinstance(size, tuple) or not turned
        assert isinstance(images, torch.Tensor if one_shape else list)
        for image, i in zip(images, labels.tolist()):
            assert image.dtype == torch.uint8
            want = reference(".jpg", ds[i][0])
            assert image.permute(1, 2, 0).numpy().tobytes() == want.tobytes()
    assert not staged.stage.fallbacks  # nothing refused: everything is the CPU's


def test_reference_backend_routes_refusals(shard: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The GPU path's routing and resize, with Pillow as the decoder: refused images are
    image_decoder's, counted, and logged once per reason; the rest are within 30 dB."""
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=encoded_collate())
    staged = on_gpu(loader, (56, 72), backend="reference", device="cpu")
    reference = image_decoder("rgb8", (56, 72))
    with caplog.at_level(logging.WARNING, logger="indextar.read.gpu"):
        for _ in range(2):
            for images, labels in staged:
                assert images.shape == (8, 3, 56, 72)
                for image, i in zip(images, labels.tolist()):
                    want = reference(".jpg", ds[i][0])
                    assert psnr(image.permute(1, 2, 0).numpy(), want) >= 30
    # 16 samples cycle over 7 images: png, webp, cmyk and turned come twice or three times
    refused = [gpu_refusal(ds[i][0]) for i in range(16)]
    expected = {reason: 2 * refused.count(reason) for reason in set(refused) - {None}}
    assert dict(staged.stage.fallbacks) == expected
    assert set(expected) == {"png", "webp", "cmyk", "orientation"}
    assert len(caplog.records) == 4  # once per reason, over two epochs
    for _ in staged:
        break  # leaving part-way stops the thread
    assert not stage_threads()


def test_mixed_aspects_with_an_int_size_give_a_list() -> None:
    blobs = [encode(photo(80, 60, 0)), encode(photo(60, 80, 1))]
    stage = ImageStage(30, backend="reference", device="cpu")
    images = stage(encoded_collate()(blobs))
    assert [tuple(image.shape) for image in images] == [(3, 30, 40), (3, 40, 30)]


@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_a_batch_whose_offsets_start_past_zero(backend: str) -> None:
    """EncodedBatch promises data[offsets[i]:offsets[i + 1]], not offsets from 0."""
    blobs = [encode(photo(80, 60, i)) for i in range(3)]
    whole = encoded_collate()([(blob, i) for i, blob in enumerate(blobs)])
    shifted = dataclasses.replace(
        whole,
        data=torch.cat([torch.full((9,), 255, dtype=torch.uint8), whole.data]),
        offsets=whole.offsets + 9,
    )
    stage = ImageStage((30, 40), backend=backend, device="cpu")  # type: ignore[arg-type]
    assert torch.equal(stage.decode(shifted), stage.decode(whole))


def test_the_stage_copies_the_other_fields_out_of_the_block(shard: Path) -> None:
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    loader = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=encoded_collate())
    batch = next(iter(loader))
    images, labels = ImageStage((30, 40), device="cpu")(batch)
    block = batch.data.untyped_storage().data_ptr()
    assert batch.rest[0].untyped_storage().data_ptr() == block  # the labels share it
    assert labels.untyped_storage().data_ptr() != block  # a copy: the block can go
    assert labels.tolist() == batch.rest[0].tolist()


def test_stage_errors() -> None:
    gpu = torch.cuda.is_available() and importlib.util.find_spec("torchvision") is not None
    assert ImageStage().backend == ("nvjpeg" if gpu else "cpu")
    with pytest.raises(DecodeSpecError, match="backend= must be one of"):
        ImageStage(backend="vulkan")  # type: ignore[arg-type]
    with pytest.raises(DecodeSpecError, match="needs a CUDA device"):
        ImageStage(backend="nvjpeg", device="cpu")
    with pytest.raises(DecodeSpecError, match="resample= must be one of"):
        ImageStage(resample="lanczos", backend="reference", device="cpu")
    with pytest.raises(DecodeSpecError, match="size= must be"):
        ImageStage(size=0)
    with pytest.raises(DecodeSpecError, match="decoders= must be at least 1; got 0"):
        on_gpu([], 16, device="cpu", decoders=0)
    plain = DataLoader([(encode(photo(20, 20)), 0)] * 2, batch_size=2)  # default_collate
    with pytest.raises(DecodeSpecError, match="got a list: give the DataLoader collate_fn="):
        next(iter(on_gpu(plain, 16, device="cpu")))
    broken = encoded_collate()([b"\xff\xd8" + struct.pack(">HH", 0xFFC0, 4) + b"\0" * 8])
    with pytest.raises(DecodeError, match="image 0 of a batch of 1"):
        ImageStage(backend="cpu", device="cpu")(broken)


def test_a_failure_in_the_loader_reaches_the_caller() -> None:
    def batches():  # a loader that fails part-way, as a worker's error would
        yield encoded_collate()([encode(photo(20, 20))])
        raise RuntimeError("worker died")

    staged = on_gpu(batches(), 16, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="worker died"):
        for _ in staged:
            pass


def test_timings_say_the_loader_holds_the_decoder_back() -> None:

    def slow_batches():  # a loader that takes 50 ms a batch, as too few workers would
        for _ in range(4):
            time.sleep(0.05)
            yield encoded_collate()([encode(photo(20, 20))] * 2)

    staged = on_gpu(slow_batches(), 16, device="cpu")  # type: ignore[arg-type]
    assert staged.timings.batches == 0
    assert sum(images.shape[0] for images in staged) == 8
    timings = staged.timings
    assert timings.batches == 4
    assert timings.fetch_s >= 0.2  # the four sleeps, in the fetching thread
    # the decoder waited for all but what it decoded; the caller waited for the decoder
    assert timings.starved_s >= 0.15 and timings.waited_s >= 0.15
    assert timings.decode_s > 0


@pytest.mark.parametrize("decoders", [2, 3])
def test_several_decoding_threads_keep_the_loaders_order(shard: Path, decoders: int) -> None:
    """Batches go to the decoding threads in turn and come back in the loader's order,
    over workers and for two passes; each thread decodes as the one thread does."""
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=encoded_collate())
    staged = on_gpu(loader, (40, 48), device="cpu", decoders=decoders)
    one = on_gpu(loader, (40, 48), device="cpu")
    for _ in range(2):
        got = [(images, labels.tolist()) for images, labels in staged]
        want = [(images, labels.tolist()) for images, labels in one]
        assert [labels for _, labels in got] == [labels for _, labels in want]
        assert [labels for _, labels in got] == [
            list(range(i, min(i + 3, 16))) for i in range(0, 16, 3)
        ]
        assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, want))
        assert staged.timings.batches == 6
    assert not stage_threads()


@pytest.mark.parametrize("decoders", [1, 2, 3])
@pytest.mark.parametrize("fail_at", [0, 1, 4])
def test_a_failure_reaches_the_caller_in_its_place(decoders: int, fail_at: int) -> None:
    """What the loader raises at batch k comes after the k batches before it, whichever
    decoding thread would have had it."""

    def batches():
        for i in range(6):
            if i == fail_at:
                raise RuntimeError(f"worker died at {i}")
            yield encoded_collate()([(encode(photo(20, 20, i)), i)])

    staged = on_gpu(batches(), 16, device="cpu", decoders=decoders)  # type: ignore[arg-type]
    seen = []
    with pytest.raises(RuntimeError, match=f"worker died at {fail_at}"):
        for _, labels in staged:
            seen += labels.tolist()
    assert seen == list(range(fail_at))


@pytest.mark.parametrize("count", [0, 1, 2, 5])
def test_every_batch_count_ends_cleanly_with_two_decoders(count: int) -> None:
    batches = [encoded_collate()([(encode(photo(20, 20, i)), i)]) for i in range(count)]
    staged = on_gpu(batches, 16, device="cpu", decoders=2)
    assert [labels.item() for _, labels in staged] == list(range(count))
    assert staged.timings.batches == count


def test_persistent_workers_over_epochs(shard: Path) -> None:
    """Workers that outlive a pass (persistent_workers=True) keep their reused blocks
    from epoch to epoch: each epoch's batches are right, in the loader's order, with two
    decoding threads and the batches of the epoch before still held."""
    ds = IndexedTarDataset(str(shard), keys=("jpg", "cls"), decode=[])
    loader = DataLoader(
        ds, batch_size=3, num_workers=2, collate_fn=encoded_collate(), persistent_workers=True
    )
    staged = on_gpu(loader, (40, 48), device="cpu")
    reference = image_decoder("rgb8", (40, 48))
    want = [torch.from_numpy(reference(".jpg", ds[i][0])).permute(2, 0, 1) for i in range(16)]
    held = []
    for _ in range(3):
        epoch = [(images, labels.tolist()) for images, labels in staged]
        assert [i for _, labels in epoch for i in labels] == list(range(16))
        for images, labels in epoch:
            assert all(torch.equal(image, want[i]) for image, i in zip(images, labels))
        held.append(epoch)
    for epoch in held:  # what was handed out is still each batch's own
        for images, labels in epoch:
            assert all(torch.equal(image, want[i]) for image, i in zip(images, labels))


class _DiesAt(torch.utils.data.Dataset[tuple[bytes, int]]):
    """Samples ``(jpeg, i)``; the worker that reads sample ``at`` is killed."""

    def __init__(self, count: int, at: int) -> None:
        self.blob, self.count, self.at = encode(photo(20, 20)), count, at

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        if i == self.at:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return self.blob, i


def test_a_killed_worker_is_an_error_not_a_hang() -> None:
    """A DataLoader worker killed mid-epoch reaches the caller as the DataLoader's
    error, after the batches before it, and every thread of the stage ends."""
    loader = DataLoader(
        _DiesAt(40, at=22), batch_size=4, num_workers=2, collate_fn=encoded_collate()
    )
    staged = on_gpu(loader, 16, device="cpu")  # two decoding threads
    seen: list[int] = []
    with pytest.raises(
        RuntimeError, match="DataLoader worker .* exited unexpectedly|killed by signal"
    ):
        for _, labels in staged:
            seen += labels.tolist()
    assert seen == list(range(len(seen))) and len(seen) <= 20  # in order, none past the kill
    assert not stage_threads()


@pytest.mark.parametrize("target", [(threading.Thread, "is_alive"), (time, "sleep")])
def test_an_exception_while_stopping_still_ends_every_thread(
    monkeypatch: pytest.MonkeyPatch, target: tuple[object, str]
) -> None:
    """The DataLoader's SIGCHLD handler raises in the caller's thread wherever it is, once
    a worker that ends: raised twice at a step of stopping the stage's threads, the
    threads still end, and what was raised reaches the caller after."""
    owner, name = target
    real = getattr(owner, name)
    armed = [0]

    def interrupted(*args: object, **kwargs: object) -> object:
        if armed[0] and threading.current_thread() is threading.main_thread():
            armed[0] -= 1
            raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)
    batches = [encoded_collate()([(encode(photo(20, 20, i)), i)]) for i in range(8)]
    passes = iter(on_gpu(batches, 16, device="cpu", decoders=2))
    next(passes)
    armed[0] = 2
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        passes.close()  # as the caller's loop ends: the stage's threads are stopped
    assert armed[0] == 0  # both raised while stopping
    assert not stage_threads()


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("dtype", [None, torch.float32, torch.bfloat16])
def test_normalize_gives_floats_of_the_same_pixels(backend: str, dtype: torch.dtype | None) -> None:
    """normalize=(mean, std) is (pixels / 255 - mean) / std of the uint8 images, per
    channel, in dtype (float32 by default), for one-shape batches and lists alike."""
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    batch = encoded_collate()([encode(photo(80, 60, i)) for i in range(3)])
    plain = ImageStage((30, 40), backend=backend, device="cpu")  # type: ignore[arg-type]
    scaled = ImageStage(
        (30, 40),
        backend=backend,
        device="cpu",
        normalize=(mean, std),
        dtype=dtype,  # type: ignore[arg-type]
    )
    pixels, got = plain.decode(batch), scaled.decode(batch)
    assert isinstance(pixels, torch.Tensor) and isinstance(got, torch.Tensor)
    assert got.dtype == (dtype or torch.float32) == scaled.dtype and got.shape == pixels.shape
    want = (pixels.double() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1
    )
    tolerance = 1e-5 if got.dtype == torch.float32 else 2e-2
    assert torch.allclose(got.double(), want, atol=tolerance, rtol=tolerance)
    mixed = encoded_collate()([encode(photo(80, 60, 0)), encode(photo(60, 80, 1))])
    shapes = ImageStage(30, backend=backend, device="cpu", normalize=(mean, std))  # type: ignore[arg-type]
    images = shapes.decode(mixed)
    assert [tuple(i.shape) for i in images] == [(3, 30, 40), (3, 40, 30)]
    assert all(i.dtype == torch.float32 for i in images)
    labels = on_gpu(
        [encoded_collate()([(encode(photo(20, 20)), 7)])], 16, device="cpu", normalize=(mean, std)
    )
    for images, label in labels:
        assert images.dtype == torch.float32 and label.tolist() == [7]


def test_normalize_errors() -> None:
    with pytest.raises(DecodeSpecError, match="dtype=torch.float16 needs normalize="):
        ImageStage(16, device="cpu", dtype=torch.float16)
    for bad in [
        ((0.5, 0.5), (1, 1, 1)),
        ((0, 0, 0), (1, 0, 1)),
        (0.5, 0.5),
        ((0, 0, "x"), (1, 1, 1)),
    ]:
        with pytest.raises(DecodeSpecError, match="normalize= must be"):
            ImageStage(16, device="cpu", normalize=bad)  # type: ignore[arg-type]
    with pytest.raises(DecodeSpecError, match="must be a float dtype"):
        ImageStage(16, device="cpu", normalize=((0, 0, 0), (1, 1, 1)), dtype=torch.int32)
    assert ImageStage(16, device="cpu", dtype=torch.uint8).dtype == torch.uint8
