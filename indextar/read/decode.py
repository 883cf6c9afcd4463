"""Member decoders by extension and webdataset's spec strings.

A :class:`Decoder` turns one member's bytes into a value, following webdataset 1.0's
``autodecode`` conventions, which are the reference where in doubt:

* handlers are called as ``handler(key, data)`` with ``key`` the member's extension
  behind a dot (``".jpg"``, ``".seg.png"``), exactly what webdataset passes; the first
  one that returns something other than ``None`` wins, and a member no handler
  takes stays ``bytes``;
* ``*.gz`` members are gunzipped first, then decoded by the rest of their extension;
* a spec string (``"rgb8"``, ``"torchrgb"``, ...) is an image handler for the image
  extensions; after the user's handlers come the basic ones (``txt``, ``cls``,
  ``json``, ``npy``, ``npz``, ``mp``);
* unlike webdataset, ``pyd``/``pickle``/``pkl``/``pth`` members are refused unless
  ``allow_unsafe=True``: decoding them runs code stored in the shard.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DecodeError, DecodeSpecError, UnsafeMemberError

__all__ = [
    "Handler",
    "DecodeArg",
    "Decoder",
    "ImageHandler",
    "BasicHandler",
    "IMAGE_SPECS",
    "IMAGE_EXTENSIONS",
    "image_value",
    "make_decoder",
]

Handler = Callable[[str, bytes], Any]
"""``handler(key, data)``: a decoded value, or ``None`` to let the next handler try."""

DecodeArg = str | Handler | Sequence[str | Handler] | None
"""What ``decode=`` accepts: ``None`` (bytes), a spec string, a handler, or a list of them."""

# (array type, element type, mode), as webdataset's ``autodecode.imagespecs``.
IMAGE_SPECS: dict[str, tuple[str, str | None, str]] = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}

# webdataset's ``autodecode.IMAGE_EXTENSIONS``: what PIL can open.
IMAGE_EXTENSIONS = frozenset(
    "blp bmp dib bufr cur pcx dcx dds ps eps fit fits fli flc ftc ftu gbr gif grib h5 hdf "
    "png apng jp2 j2k jpc jpf jpx j2c icns ico im iim tif tiff jfif jpe jpg jpeg mpg mpeg "
    "msp pcd pxr pbm pgm ppm pnm psd bw rgb rgba sgi ras tga icb vda vst webp wmf emf xbm "
    "xpm".split()
)

_UNSAFE = {"pkl": "unpickling", "pickle": "unpickling", "pyd": "unpickling", "pth": "torch.load"}
_TEXT = frozenset({"txt", "text", "transcript"})
_INT = frozenset({"cls", "cls2", "index", "inx", "id"})
_JSON = frozenset({"json", "jsn"})
_MSGPACK = frozenset({"mp", "msg", "msgpack"})


def _last_extension(key: str) -> str:
    return key.rpartition(".")[2]


@dataclass(frozen=True, slots=True)
class ImageHandler:
    """Decode image members by a webdataset spec string (``"rgb8"``, ``"torchrgb"``, ...).

    Produces exactly what webdataset's ``autodecode.ImageHandler`` does: PIL images for
    ``pil*``, HWC numpy arrays for ``l8``/``rgb8``/``l``/``rgb``/..., CHW torch tensors for
    ``torch*`` (torch is imported only then). Float specs scale to ``[0, 1]``.
    """

    spec: str
    extensions: frozenset[str] = IMAGE_EXTENSIONS

    def __post_init__(self) -> None:
        if self.spec not in IMAGE_SPECS:
            raise DecodeSpecError(
                f"unknown decode spec {self.spec!r}; expected one of {', '.join(IMAGE_SPECS)}, "
                "or a callable handler(key, data)"
            )
        # PIL and its common format plugins load here, in the process that makes the
        # dataset: forked DataLoader workers inherit them instead of each importing them
        # during its first batch (0.1-0.2 s per worker).
        import PIL.Image

        PIL.Image.preinit()

    def __call__(self, key: str, data: bytes) -> Any:
        if _last_extension(key).lower() not in self.extensions:
            return None
        import PIL.Image

        mode = IMAGE_SPECS[self.spec][2]
        with io.BytesIO(data) as stream:
            opened = PIL.Image.open(stream)
            opened.load()
            img = opened.convert(mode.upper())
        return image_value(img, self.spec)


def image_value(img: Any, spec: str, *, writable: bool = False) -> Any:
    """A PIL image already in ``spec``'s mode (``"RGB"`` for ``rgb8``) as ``spec`` wants it:
    the image itself, a HWC numpy array, or a CHW torch tensor; float specs in [0, 1].

    Shared by :class:`ImageHandler` and :class:`~indextar.read.image.ImageDecoder`.
    ``np.asarray`` of a PIL image is read-only, as webdataset gives it; ``writable=True``
    copies it, which the DataLoader's collate wants (it warns on read-only arrays).
    """
    atype, etype, mode = IMAGE_SPECS[spec]
    if atype == "pil":
        return img
    result: np.ndarray[Any, Any] = np.array(img) if writable else np.asarray(img)
    if etype == "float":
        result = result.astype(np.float32) / 255.0
    # After convert(mode) these reshapes never trigger; kept to mirror webdataset.
    if mode == "l" and result.ndim == 3:
        result = np.mean(result[:, :, :3], axis=2)
    elif mode == "rgb" and result.ndim == 2:
        result = np.repeat(result[:, :, np.newaxis], 3, axis=2)
    if atype == "numpy":
        return result
    import torch

    if result.ndim == 3:
        return torch.from_numpy(result.transpose(2, 0, 1).copy())
    return torch.from_numpy(result.copy())


@dataclass(frozen=True, slots=True)
class BasicHandler:
    """The non-image extensions: text, ints, JSON, npy, npz, msgpack; pickles if allowed."""

    allow_unsafe: bool = False

    def __call__(self, key: str, data: bytes) -> Any:
        ext = _last_extension(key)
        if ext in _TEXT:
            return data.decode("utf-8")
        if ext in _INT:
            return int(data)
        if ext in _JSON:
            return json.loads(data)
        if ext == "npy":
            return np.lib.format.read_array(io.BytesIO(data))
        if ext == "npz":
            with np.load(io.BytesIO(data)) as archive:
                return dict(archive)
        if ext in _MSGPACK:
            return _msgpack_loads(data)
        if ext in _UNSAFE:
            return self._unsafe(ext, data)
        return None

    def _unsafe(self, ext: str, data: bytes) -> Any:
        if not self.allow_unsafe:
            raise UnsafeMemberError(
                f"refusing {_UNSAFE[ext]} a {ext!r} member: it can run arbitrary code from the "
                "shard; pass allow_unsafe=True if you trust the data, or select other "
                "members with keys="
            )
        if ext == "pth":
            import torch

            return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")
        import pickle

        return pickle.loads(data)  # noqa: S301 - allowed explicitly by allow_unsafe=True


def _msgpack_loads(data: bytes) -> Any:
    try:
        import msgpack
    except ImportError as e:
        raise ImportError(
            "decoding msgpack members needs the msgpack package (pip install msgpack)"
        ) from e
    return msgpack.unpackb(data)


@dataclass(frozen=True, slots=True)
class Decoder:
    """Decode members with a chain of handlers: user handlers, then :class:`BasicHandler`.

    Call as ``decoder(ext, data)`` with ``ext`` the member's extension without a dot.
    """

    handlers: tuple[Handler, ...]

    def __call__(self, ext: str, data: bytes) -> Any:
        key = "." + ext
        if key.endswith(".gz"):  # once, as webdataset's gzfilter
            data = gzip.decompress(data)
            key = key[:-3]
        for handler in self.handlers:
            result = handler(key, data)
            if result is not None:
                return result
        return data

    def decode_member(self, ext: str, data: bytes, *, shard: str, key: str) -> Any:
        """Decode one member; a failure raises :class:`DecodeError` naming shard, key, extension."""
        try:
            return self(ext, data)
        except UnsafeMemberError as e:
            raise UnsafeMemberError(str(e), shard=shard, key=key, ext=ext) from None
        except Exception as e:
            raise DecodeError(
                f"cannot decode {len(data)} bytes ({type(e).__name__}: {e})",
                shard=shard,
                key=key,
                ext=ext,
            ) from e


def make_decoder(decode: DecodeArg, *, allow_unsafe: bool = False) -> Decoder | None:
    """The :class:`Decoder` for a ``decode=`` argument; ``None`` keeps bytes.

    Parameters
    ----------
    decode
        ``None`` for raw bytes; a spec string such as ``"rgb8"``; a handler
        ``fn(key, data)``; or a list of those, tried in order.
    allow_unsafe
        Decode ``pyd``/``pickle``/``pkl``/``pth`` members (which runs code from the shard).

    Raises
    ------
    DecodeSpecError
        If a spec string is unknown or an entry is neither a string nor callable.
    """
    if decode is None:
        return None
    if isinstance(decode, str) or callable(decode):
        items: Sequence[str | Handler] = [decode]
    elif isinstance(decode, (list, tuple)):
        items = decode
    else:
        raise DecodeSpecError(
            f"decode= must be a spec string, a callable or a list of them; got {decode!r}"
        )
    handlers: list[Handler] = []
    for item in items:
        if isinstance(item, str):
            handlers.append(ImageHandler(item.lower()))
        elif callable(item):
            handlers.append(item)
        else:
            raise DecodeSpecError(
                "decode= entries must be spec strings or callables handler(key, data); "
                f"got {item!r}"
            )
    handlers.append(BasicHandler(allow_unsafe=allow_unsafe))
    return Decoder(tuple(handlers))
