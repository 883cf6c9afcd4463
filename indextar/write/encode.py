"""Encode sample values to member bytes: the inverse of the default decoders.

The extension picks the encoder, as in webdataset's ``TarWriter``, whose output
these encoders reproduce byte for byte:

==========================================  =========================================
value                                       extensions
==========================================  =========================================
``bytes``, ``bytearray``, ``memoryview``    any: written as given
``str``                                     any: UTF-8
``int``                                     ``cls cls2 class count index inx id``: decimal
``dict``, ``list`` (anything JSON can dump) ``json jsn``
``numpy.ndarray``                           ``npy``; ``npz`` takes a dict of arrays
PIL image or uint8 ``HxW``/``HxWxC`` array  ``jpg jpeg png ppm pgm pbm bmp tif tiff webp``
==========================================  =========================================

A non-bytes value under ``<ext>.gz`` is encoded by ``<ext>`` and gzipped (with a zero
timestamp, so the output is reproducible). Anything else is an
:class:`~indextar.errors.EncodeError`; encode such values yourself and pass bytes.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import EncodeError

__all__ = ["encode_value", "ENCODED_EXTENSIONS"]

_INT = frozenset("cls cls2 class count index inx id".split())
_JSON = frozenset({"json", "jsn"})
# PIL format of each image extension.
_IMAGE_FORMATS = {
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "png": "PNG",
    "ppm": "PPM",
    "pgm": "PPM",
    "pbm": "PPM",
    "bmp": "BMP",
    "tif": "TIFF",
    "tiff": "TIFF",
    "webp": "WEBP",
}
#: Extensions with an encoder for values other than bytes and str.
ENCODED_EXTENSIONS = frozenset({*_INT, *_JSON, "npy", "npz", *_IMAGE_FORMATS})


def _encode_int(value: Any) -> bytes:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"expected an int, got {type(value).__name__}")
    return str(int(value)).encode("ascii")


def _encode_json(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")


def _encode_npy(value: Any) -> bytes:
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"expected a numpy array, got {type(value).__name__}")
    stream = io.BytesIO()
    np.lib.format.write_array(stream, np.asanyarray(value))
    return stream.getvalue()


def _encode_npz(value: Any) -> bytes:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in value.items()
    ):
        raise TypeError("expected a dict of str to numpy arrays")
    stream = io.BytesIO()
    np.savez_compressed(stream, **value)
    return stream.getvalue()


def _encode_image(value: Any, fmt: str) -> bytes:
    import PIL.Image

    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8:
            raise TypeError(
                f"image arrays must be uint8, got {value.dtype}; convert first, for example "
                "(x * 255).round().astype(np.uint8)"
            )
        if value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (1, 3, 4)):
            raise TypeError(
                f"image arrays must be HxW or HxWxC with C in 1, 3, 4; got {value.shape}"
            )
        value = PIL.Image.fromarray(
            value[:, :, 0] if value.ndim == 3 and value.shape[2] == 1 else value
        )
    if not isinstance(value, PIL.Image.Image):
        raise TypeError(f"expected a PIL image or a uint8 array, got {type(value).__name__}")
    options = {"quality": 100} if fmt in ("JPEG", "TIFF") else {}  # as webdataset
    with io.BytesIO() as stream:
        value.save(stream, format=fmt, **options)
        return stream.getvalue()


def _encoder_for(ext: str) -> Callable[[Any], bytes] | None:
    if ext in _INT:
        return _encode_int
    if ext in _JSON:
        return _encode_json
    if ext == "npy":
        return _encode_npy
    if ext == "npz":
        return _encode_npz
    fmt = _IMAGE_FORMATS.get(ext)
    if fmt is not None:
        return lambda value: _encode_image(value, fmt)
    return None


def encode_value(
    ext: str, value: Any, *, shard: str | None = None, key: str | None = None
) -> bytes | bytearray | memoryview:
    """Encode one member's ``value`` by its extension ``ext`` (``"jpg"``, ``"seg.png"``).

    ``shard`` and ``key`` only name the member in errors.

    Raises
    ------
    EncodeError
        If no encoder takes this value for this extension.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    if isinstance(value, str):
        encoded = value.encode("utf-8")
        return gzip.compress(encoded, mtime=0) if ext.endswith(".gz") else encoded
    compress = ext.endswith(".gz")
    last = (ext[:-3] if compress else ext).rpartition(".")[2].lower()
    encoder = _encoder_for(last)
    if encoder is None:
        raise EncodeError(
            f"no encoder for a {type(value).__name__} under extension {last!r}; "
            f"encoders exist for {', '.join(sorted(ENCODED_EXTENSIONS))} (and str, bytes "
            "under any extension): encode it yourself and pass bytes",
            shard=shard,
            key=key,
            ext=ext,
        )
    try:
        result = encoder(value)
    except (TypeError, ValueError, OSError) as e:
        raise EncodeError(
            f"cannot encode {type(value).__name__} as {last!r}: {e}", shard=shard, key=key, ext=ext
        ) from e
    return gzip.compress(result, mtime=0) if compress else result
