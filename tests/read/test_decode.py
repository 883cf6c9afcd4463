"""Decoders: webdataset's conventions, exact image specs, safety and error context."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import webdataset.autodecode as wds_autodecode
from PIL import Image

from indextar.errors import DecodeError, DecodeSpecError, IndextarError, UnsafeMemberError
from indextar.read.decode import IMAGE_SPECS, BasicHandler, ImageHandler, make_decoder


def image_bytes(mode: str, fmt: str, size: tuple[int, int] = (7, 5), seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    img = Image.fromarray(pixels[:, :, 0] if channels == 1 else pixels, mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, Image.Image):
        return isinstance(b, Image.Image) and a.mode == b.mode and a.tobytes() == b.tobytes()
    if type(a).__module__.startswith("torch"):
        import torch

        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return bool(type(a) is type(b) and a == b)


IMAGES = [
    ("RGB", "PNG", "png"),
    ("L", "PNG", "png"),
    ("RGBA", "PNG", "png"),
    ("RGB", "JPEG", "jpg"),
    ("L", "PPM", "pgm"),
]


@pytest.mark.parametrize("spec", sorted(IMAGE_SPECS))
@pytest.mark.parametrize("mode,fmt,ext", IMAGES, ids=[f"{m}-{e}" for m, _, e in IMAGES])
def test_image_specs_match_webdataset_exactly(spec: str, mode: str, fmt: str, ext: str) -> None:
    data = image_bytes(mode, fmt)
    ours = make_decoder(spec)
    assert ours is not None
    theirs = wds_autodecode.Decoder([wds_autodecode.imagehandler(spec)])
    assert same(ours(ext, data), theirs.decode1(ext, data))


BASIC = {
    "txt": "héllo".encode(),
    "text": b"plain",
    "transcript": b"words",
    "cls": b"7",
    "cls2": b" 12\n",
    "index": b"3",
    "inx": b"4",
    "id": b"99",
    "json": json.dumps({"a": [1, 2]}).encode(),
    "jsn": b"[1, 2]",
    "bin": b"\x00\x01",
    "seg.png.unknown": b"raw",
}


@pytest.mark.parametrize("ext", sorted(BASIC))
@pytest.mark.parametrize("spec", ["rgb8", "pil", "l"])
def test_basic_extensions_match_webdataset(ext: str, spec: str) -> None:
    ours = make_decoder(spec)
    assert ours is not None
    theirs = wds_autodecode.Decoder([wds_autodecode.imagehandler(spec)])
    assert same(ours(ext, BASIC[ext]), theirs.decode1(ext, BASIC[ext]))


def npy_bytes(array: np.ndarray[Any, Any]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def test_npy_npz_and_gz() -> None:
    decoder = make_decoder("rgb8")
    assert decoder is not None
    array = np.arange(12, dtype=np.int16).reshape(3, 4)
    assert same(decoder("npy", npy_bytes(array)), array)
    buf = io.BytesIO()
    np.savez(buf, a=array, b=array.T)
    decoded = decoder("npz", buf.getvalue())
    assert set(decoded) == {"a", "b"} and same(decoded["b"], array.T)
    assert same(decoder("npy.gz", gzip.compress(npy_bytes(array))), array)
    assert decoder("txt.gz", gzip.compress(b"unzipped")) == "unzipped"
    assert decoder("seg.json.gz", gzip.compress(b'{"x": 1}')) == {"x": 1}
    png = image_bytes("RGB", "PNG")
    assert same(decoder("png.gz", gzip.compress(png)), make_decoder("rgb8")("png", png))  # type: ignore[misc]


def test_custom_handlers_come_first_and_pass_with_none() -> None:
    seen: list[str] = []

    def shout(key: str, data: bytes) -> Any:
        seen.append(key)
        return data.decode().upper() if key == ".txt" else None

    decoder = make_decoder([shout, "l8"])
    assert decoder is not None
    assert decoder("txt", b"abc") == "ABC"
    assert decoder("cls", b"5") == 5  # shout passed; the basic handler decoded
    assert decoder("png", image_bytes("L", "PNG")).dtype == np.uint8
    assert seen == [".txt", ".cls", ".png"]  # webdataset's keys: the extension behind a dot
    only = make_decoder(shout)
    assert only is not None and only("json", b"[1]") == [1]


@pytest.mark.parametrize(
    "ext,payload",
    [("pyd", pickle.dumps({"x": 1})), ("pickle", pickle.dumps([1])), ("pkl", pickle.dumps(2))],
)
def test_pickles_are_refused_unless_allowed(ext: str, payload: bytes) -> None:
    decoder = make_decoder("rgb8")
    assert decoder is not None
    with pytest.raises(UnsafeMemberError, match="allow_unsafe=True") as info:
        decoder.decode_member(ext, payload, shard="s.tar", key="k1")
    assert info.value.shard == "s.tar" and info.value.key == "k1" and info.value.ext == ext
    assert "'s.tar'" in str(info.value) and "'k1'" in str(info.value)
    unsafe = make_decoder("rgb8", allow_unsafe=True)
    assert unsafe is not None and unsafe(ext, payload) == pickle.loads(payload)


def test_pth_is_refused_unless_allowed() -> None:
    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.arange(3)}, buf)
    with pytest.raises(UnsafeMemberError, match="torch.load"):
        BasicHandler()(".pth", buf.getvalue())
    loaded = BasicHandler(allow_unsafe=True)(".pth", buf.getvalue())
    assert torch.equal(loaded["w"], torch.arange(3))


def test_decode_failure_names_shard_key_and_extension() -> None:
    decoder = make_decoder("rgb8")
    assert decoder is not None
    corrupt = image_bytes("RGB", "JPEG")[:40]
    with pytest.raises(DecodeError) as info:
        decoder.decode_member("jpg", corrupt, shard="data-000003.tar", key="img042")
    message = str(info.value)
    assert "data-000003.tar" in message and "img042" in message and "'jpg'" in message
    assert isinstance(info.value, IndextarError) and isinstance(info.value, ValueError)
    assert info.value.__cause__ is not None
    with pytest.raises(DecodeError, match="'cls'"):
        decoder.decode_member("cls", b"not a number", shard="s.tar", key="k")


@pytest.mark.parametrize("bad", ["rgb9", "torch8", "", ["pil", 3], 42])
def test_wrong_decode_spec_is_a_clear_error(bad: Any) -> None:
    with pytest.raises(DecodeSpecError, match="spec|callable"):
        make_decoder(bad)


def test_none_keeps_bytes_and_unknown_extensions_stay_bytes() -> None:
    assert make_decoder(None) is None
    decoder = make_decoder("pil")
    assert decoder is not None and decoder("weird", b"\x01") == b"\x01"


def test_msgpack_needs_its_package() -> None:
    decoder = make_decoder("rgb8")
    assert decoder is not None
    try:
        import msgpack
    except ImportError:
        with pytest.raises(DecodeError, match="pip install msgpack"):
            decoder.decode_member("mp", b"\x01", shard="s", key="k")
    else:
        assert decoder("mp", msgpack.packb({"a": 1})) == {"a": 1}


def test_image_handler_ignores_other_extensions() -> None:
    assert ImageHandler("rgb8")(".txt", b"hello") is None
    assert ImageHandler("rgb8")(".seg.PNG", image_bytes("RGB", "PNG")).shape == (5, 7, 3)


def test_import_and_numpy_decoding_do_not_import_torch() -> None:
    code = (
        "import sys, io, numpy as np\n"
        "from PIL import Image\n"
        "import indextar\n"
        "from indextar.read.decode import make_decoder\n"
        "buf = io.BytesIO(); Image.new('RGB', (4, 4)).save(buf, format='PNG')\n"
        "assert make_decoder('rgb8')('png', buf.getvalue()).shape == (4, 4, 3)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
