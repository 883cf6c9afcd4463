"""image_decoder (issue 19): images decoded at training size match a full decode
followed by the same resize, in every mode, upright, from any colour model and format."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
import torch
from conftest import tar_bytes
from photos import encode, photo, psnr
from PIL import Image, ImageOps

from indextar import DecodeError, DecodeSpecError, IndexedTarDataset, image_decoder
from indextar.read import image
from indextar.read.image import _draft, target_geometry

MIN_PSNR = 30.0  # the stated tolerance (docs/dataset.md); measured 45-48 dB


@pytest.fixture(autouse=True, params=["pillow", "simplejpeg"])
def jpeg_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with each JPEG decoder behind ``backend="auto"``."""
    import simplejpeg  # noqa: F401  a test dependency: both paths are proven here

    monkeypatch.setattr(image, "AUTO_SIMPLEJPEG", request.param == "simplejpeg")
    return str(request.param)


def reference(
    data: bytes, size: int | tuple[int, int], mode: str = "RGB", fit: str = "crop"
) -> Image.Image:
    """A full decode, upright, then the resize torchvision would do: Resize(size) for an
    int; for (h, w), Resize to cover then CenterCrop, or Resize to fit then pad."""
    img = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert(mode)
    w, h = img.size
    if isinstance(size, int):
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(size * long / short)
        return img.resize((size, new_long) if w <= h else (new_long, size), Image.BILINEAR)
    out_h, out_w = size
    if fit == "crop":
        scale = max(out_w / w, out_h / h)
        img = img.resize((max(out_w, round(w * scale)), max(out_h, round(h * scale))))
        left, top = (img.width - out_w) // 2, (img.height - out_h) // 2
        return img.crop((left, top, left + out_w, top + out_h))
    scale = min(out_w / w, out_h / h)
    img = img.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
    canvas = Image.new(mode, (out_w, out_h))
    canvas.paste(img, ((out_w - img.width) // 2, (out_h - img.height) // 2))
    return canvas


JPEGS = [encode(photo(640, 480, seed)) for seed in range(3)]


@pytest.mark.parametrize("size", [224, 128, 64, 30, (224, 224), (100, 200)])
@pytest.mark.parametrize("seed", range(3))
def test_psnr_against_full_decode_and_the_same_resize(
    size: int | tuple[int, int], seed: int
) -> None:
    got = image_decoder("rgb8", size)(".jpg", JPEGS[seed])
    want = np.asarray(reference(JPEGS[seed], size))
    assert got.dtype == np.uint8 and got.shape == want.shape
    assert psnr(got, want) >= MIN_PSNR


@pytest.mark.parametrize(("size", "scale"), [(400, 1.0), (224, 0.5), (100, 0.25), (50, 0.125)])
def test_jpeg_is_decoded_at_the_smallest_dct_scale_covering_the_target(
    size: int, scale: float
) -> None:
    img = Image.open(io.BytesIO(JPEGS[0]))
    geometry = target_geometry(*img.size, size, "crop")
    assert _draft(img, "RGB", geometry, swapped=False) == scale
    img.load()
    assert min(img.size) >= size  # never below the target: the resize only shrinks


@pytest.mark.parametrize(
    ("mode", "kind", "shape"),
    [
        ("rgb8", np.ndarray, (240, 320, 3)),
        ("rgb", np.ndarray, (240, 320, 3)),
        ("l8", np.ndarray, (240, 320)),
        ("rgba8", np.ndarray, (240, 320, 4)),
        ("torchrgb8", torch.Tensor, (3, 240, 320)),
        ("torchrgb", torch.Tensor, (3, 240, 320)),
        ("torchl8", torch.Tensor, (240, 320)),
        ("pil", Image.Image, (320, 240)),
        ("pill", Image.Image, (320, 240)),
    ],
)
def test_modes(mode: str, kind: type, shape: tuple[int, ...]) -> None:
    value = image_decoder(mode, 240)(".jpg", JPEGS[1])
    assert isinstance(value, kind)
    assert tuple(value.size if kind is Image.Image else value.shape) == shape
    rgb8 = image_decoder("rgb8", 240)(".jpg", JPEGS[1])
    if mode == "rgb":
        assert value.dtype == np.float32 and np.allclose(value * 255, rgb8, atol=1e-3)
    elif mode == "torchrgb8":
        assert value.dtype == torch.uint8 and np.array_equal(value.numpy().transpose(1, 2, 0), rgb8)
    elif mode == "torchrgb":
        assert value.dtype == torch.float32
        assert np.allclose(value.numpy().transpose(1, 2, 0) * 255, rgb8, atol=1e-3)
    elif mode == "pil":
        assert value.mode == "RGB" and np.array_equal(np.asarray(value), rgb8)
    elif mode in ("l8", "torchl8", "pill"):
        want = np.asarray(reference(JPEGS[1], 240, "L"))
        assert psnr(np.asarray(value), want) >= MIN_PSNR  # luma decoded alone, as JPEG's Y
    elif mode == "rgba8":
        assert (value[..., 3] == 255).all() and np.array_equal(value[..., :3], rgb8)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation: int) -> None:
    upright = photo(320, 200, seed=orientation)
    # What a camera stores: the upright image turned back, with the tag that undoes it.
    undo = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE"}
    undo.update({6: "ROTATE_90", 7: "TRANSVERSE", 8: "ROTATE_270"})
    stored = upright.transpose(Image.Transpose[undo[orientation]]) if orientation > 1 else upright
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(stored, exif=exif.tobytes())
    got = image_decoder("rgb8", 100)(".jpg", data)
    want = np.asarray(upright.resize((160, 100), Image.BILINEAR))
    assert got.shape == (100, 160, 3) and psnr(got, want) >= MIN_PSNR
    exact = image_decoder("rgb8", (80, 120))(".jpg", data)
    assert psnr(exact, np.asarray(reference(data, (80, 120)))) >= MIN_PSNR
    as_stored = image_decoder("rgb8", 100, orient=False)(".jpg", data)
    assert as_stored.shape[:2] == ((160, 100) if orientation >= 5 else (100, 160))


def test_greyscale_jpeg() -> None:
    data = encode(photo(400, 300, 4).convert("L"))
    rgb = image_decoder("rgb8", 150)(".jpg", data)
    assert rgb.shape == (150, 200, 3)
    assert (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all()
    grey = image_decoder("l8", 150)(".jpg", data)
    assert grey.shape == (150, 200) and psnr(grey, np.asarray(reference(data, 150, "L"))) >= 30


def test_cmyk_jpeg() -> None:
    data = encode(photo(400, 300, 5).convert("CMYK"))
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    got = image_decoder("rgb8", 150)(".jpg", data)
    assert got.shape == (150, 200, 3)
    assert psnr(got, np.asarray(reference(data, 150))) >= MIN_PSNR


@pytest.mark.parametrize(
    ("fmt", "pil_mode", "options"),
    [
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {}),
        ("PNG", "P", {}),
        ("PNG", "L", {}),
        ("PNG", "I;16", {}),
        ("WEBP", "RGB", {"quality": 90}),
        ("WEBP", "RGB", {"lossless": True}),
    ],
)
def test_other_formats_are_decoded_then_resized(
    fmt: str, pil_mode: str, options: dict[str, object]
) -> None:
    img = photo(300, 200, 6)
    img = img.convert(pil_mode) if pil_mode != "P" else img.quantize(64)
    data = encode(img, fmt, **options)
    for mode, pil_target in (("rgb8", "RGB"), ("l8", "L")):
        got = image_decoder(mode, 100)(f".{fmt.lower()}", data)
        want = np.asarray(reference(data, 100, pil_target))
        assert psnr(got, want) >= 40  # same pixels, same resize: equal up to rounding


def test_pad_keeps_the_whole_image_on_a_zero_border() -> None:
    got = image_decoder("rgb8", (200, 200), fit="pad")(".jpg", JPEGS[2])
    assert got.shape == (200, 200, 3)
    assert (got[:25] == 0).all() and (got[-25:] == 0).all()  # 640x480 -> 200x150, centred
    assert psnr(got, np.asarray(reference(JPEGS[2], (200, 200), fit="pad"))) >= MIN_PSNR


def test_small_images_are_enlarged_and_size_none_only_orients() -> None:
    data = encode(photo(40, 30, 7))
    assert image_decoder("rgb8", 60)(".jpg", data).shape == (60, 80, 3)
    assert image_decoder("rgb8", None)(".jpg", JPEGS[0]).shape == (480, 640, 3)


@pytest.mark.parametrize(
    "resample", ["nearest", "box", "bilinear", "hamming", "bicubic", "lanczos"]
)
def test_named_filters(resample: str) -> None:
    got = image_decoder("rgb8", 128, resample=resample)(".jpg", JPEGS[0])
    assert got.shape == (128, 170, 3)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "rgb9"},
        {"size": 0},
        {"size": -3},
        {"size": 2.5},
        {"size": (224,)},
        {"size": (224, 0)},
        {"fit": "stretch"},
        {"resample": "cubic"},
        {"backend": "libjpeg"},
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(DecodeSpecError, match="image_decoder"):
        image_decoder(**kwargs)  # type: ignore[arg-type]


def test_in_a_dataset_alone_and_in_a_list(make_tar) -> None:  # type: ignore[no-untyped-def]
    members: dict[str, bytes] = {}
    for i in range(4):
        members[f"s{i}.jpg"] = encode(photo(200, 100, i))
        members[f"s{i}.png"] = encode(photo(60, 40, i), "PNG")
        members[f"s{i}.cls"] = str(i).encode()
        members[f"s{i}.json"] = json.dumps({"i": i}).encode()
    shard = make_tar(members)
    ds = IndexedTarDataset(shard, decode=image_decoder(size=50))
    sample = ds[3]
    assert sample["jpg"].shape == (50, 100, 3) and sample["png"].shape == (50, 75, 3)
    assert sample["cls"] == 3 and sample["json"] == {"i": 3}  # the basic handlers follow
    only_jpg = image_decoder("torchrgb8", 50, extensions=frozenset({"jpg"}))
    ds = IndexedTarDataset(shard, decode=[only_jpg, "rgb8"], keys=("jpg", "png", "cls"))
    jpg, png, cls = ds[1]
    assert tuple(jpg.shape) == (3, 50, 100) and png.shape == (40, 60, 3) and cls == 1
    assert [s[2] for s in ds.__getitems__([3, 0])] == [3, 0]


def test_a_broken_image_names_shard_sample_and_member(make_tar) -> None:  # type: ignore[no-untyped-def]
    shard = make_tar({"good.jpg": JPEGS[0], "bad.jpg": JPEGS[0][:500] + b"\0" * 10})
    ds = IndexedTarDataset(shard, decode=image_decoder(size=32))
    with pytest.raises(DecodeError, match=r"sample 'bad', member 'jpg'"):
        ds[1]


def test_decoders_pickle_for_spawned_workers() -> None:
    decoder = image_decoder("torchrgb", (64, 32), fit="pad", resample="bicubic")
    assert pickle.loads(pickle.dumps(decoder)) == decoder


def test_tar_bytes_helper_round_trips_images() -> None:
    # The shards above carry images byte for byte (no text mode, no padding mix-ups).
    data = tar_bytes({"x.jpg": JPEGS[0]})
    assert JPEGS[0] in data


def test_the_backend_decides_who_decodes_jpegs(
    jpeg_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import simplejpeg

    calls: list[tuple[int, int]] = []
    decode_jpeg = simplejpeg.decode_jpeg

    def spy(data: bytes, **options: object) -> np.ndarray:
        calls.append((options["min_width"], options["min_height"]))  # type: ignore[arg-type]
        return decode_jpeg(data, **options)  # type: ignore[no-any-return]

    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy)
    auto = image_decoder("rgb8", 150)(".jpg", JPEGS[0])
    assert calls == ([(200, 150)] if jpeg_backend == "simplejpeg" else [])
    pillow = image_decoder("rgb8", 150, backend="pillow")(".jpg", JPEGS[0])
    chosen = image_decoder("rgb8", 150, backend="simplejpeg")(".jpg", JPEGS[0])
    assert len(calls) == (2 if jpeg_backend == "simplejpeg" else 1)  # pillow: never
    assert auto.shape == pillow.shape == chosen.shape == (150, 200, 3)
    assert psnr(pillow, chosen) >= 40  # the same libjpeg-turbo, scales apart
    # CMYK, PNG and files simplejpeg refuses are Pillow's.
    image_decoder("rgb8", 150, backend="simplejpeg")(".jpg", encode(photo(60, 40).convert("CMYK")))
    image_decoder("rgb8", 20, backend="simplejpeg")(".png", encode(photo(60, 40), "PNG"))
    assert len(calls) == (2 if jpeg_backend == "simplejpeg" else 1)


def test_simplejpeg_backend_needs_simplejpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "_SIMPLEJPEG", None)
    with pytest.raises(DecodeSpecError, match=r"pip install 'indextar\[jpeg\]'"):
        image_decoder(backend="simplejpeg")
