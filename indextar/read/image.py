"""``image_decoder``: images decoded straight to the size a model trains on.

A JPEG is decoded by libjpeg-turbo (through Pillow's ``Image.draft``) at the smallest
of the scales 1/8, 1/4, 1/2 and 1 that still covers the target, inside the DCT, so the
pixels a resize would throw away are never made; one exact resize with a named filter
then gives the target size. Other formats (PNG, WebP, ...) are decoded, then resized.

The result differs from a full decode followed by the same resize only by what the
DCT-domain downscale rounds differently: the tests hold it to a PSNR of at least 30 dB
on photo-like images (about 45-47 dB in practice).

With ``simplejpeg`` installed (``backend="auto"``, the default) a JPEG in RGB or
greyscale is decoded by it instead of by Pillow: the same libjpeg-turbo, at any of its
scales in eighths (3/8 where Pillow's ``draft`` has only 1/2), without Pillow's decoder
set-up; the resize after it is Pillow's. ``backend="pillow"`` gives the same pixels
whatever is installed.

Sizes follow ``torchvision.transforms.Resize``: ``size=256`` makes the shorter side 256
and the longer ``int(256 * long / short)``; ``size=(h, w)`` gives exactly ``h`` x ``w``,
filled by a centred crop (``fit="crop"``, torchvision's ``Resize`` then ``CenterCrop``
in one resample) or the whole image centred on a zero border (``fit="pad"``).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import DecodeSpecError
from .decode import IMAGE_EXTENSIONS, IMAGE_SPECS, image_value

if TYPE_CHECKING:
    import PIL.Image

__all__ = ["ImageDecoder", "image_decoder", "Backend", "FILTERS", "Fit", "target_geometry"]

Fit = Literal["crop", "pad"]
Backend = Literal["auto", "pillow", "simplejpeg"]
BACKENDS = ("auto", "pillow", "simplejpeg")

FILTERS = ("nearest", "box", "bilinear", "hamming", "bicubic", "lanczos")
"""Resize filters by name, as Pillow's ``Image.Resampling`` members (antialiased when
shrinking, as ``torchvision.transforms.Resize`` on PIL images)."""

_ORIENTATION_TAG = 0x0112
# EXIF orientation -> the PIL transpose that shows the image upright (as ImageOps.exif_transpose).
_TRANSPOSE = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE"}
_TRANSPOSE.update({6: "ROTATE_270", 7: "TRANSVERSE", 8: "ROTATE_90"})
# Conversions from these modes commute with a resize (linear, or channel copies), so they
# run on the smaller, resized image; any other mode (P, CMYK, I;16, LA, ...) first.
_CONVERT_AFTER = frozenset({"L", "RGB", "RGBA"})

Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class Geometry:
    """Where a decoded image goes, in the upright frame: resample ``box`` of the source
    to ``content`` pixels, placed at ``offset`` on a canvas of ``canvas`` pixels."""

    box: Box
    content: tuple[int, int]
    canvas: tuple[int, int]
    offset: tuple[int, int]


def target_geometry(width: int, height: int, size: int | tuple[int, int], fit: Fit) -> Geometry:
    """The :class:`Geometry` of an upright ``width`` x ``height`` image for ``size``/``fit``."""
    full: Box = (0.0, 0.0, float(width), float(height))
    if isinstance(size, int):
        # torchvision's rule: the shorter side is ``size``, the longer one truncated.
        if width <= height:
            content = (size, max(1, int(size * height / width)))
        else:
            content = (max(1, int(size * width / height)), size)
        return Geometry(full, content, content, (0, 0))
    out_h, out_w = size
    if fit == "crop":
        scale = max(out_w / width, out_h / height)
        box_w, box_h = out_w / scale, out_h / scale
        left, top = (width - box_w) / 2, (height - box_h) / 2
        return Geometry(
            (left, top, left + box_w, top + box_h), (out_w, out_h), (out_w, out_h), (0, 0)
        )
    scale = min(out_w / width, out_h / height)
    content = (max(1, min(out_w, round(width * scale))), max(1, min(out_h, round(height * scale))))
    offset = ((out_w - content[0]) // 2, (out_h - content[1]) // 2)
    return Geometry(full, content, (out_w, out_h), offset)


@dataclass(frozen=True, slots=True)
class ImageDecoder:
    """A ``decode=`` handler that decodes images at training size; see :func:`image_decoder`.

    Called as ``decoder(key, data)`` with ``key`` the member's extension behind a dot
    (``".jpg"``); returns ``None`` for members that are not images, so that the next
    handler (or the basic ones: ``cls``, ``json``, ...) takes them.
    """

    mode: str = "rgb8"
    size: int | tuple[int, int] | None = 256
    fit: Fit = "crop"
    resample: str = "bilinear"
    orient: bool = True
    extensions: frozenset[str] = IMAGE_EXTENSIONS
    backend: Backend = "auto"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise DecodeSpecError(
                f"image_decoder backend= must be one of {', '.join(BACKENDS)}; got {self.backend!r}"
            )
        if self.backend == "simplejpeg" and _simplejpeg() is None:
            raise DecodeSpecError(
                "image_decoder(backend='simplejpeg') needs simplejpeg: "
                "pip install 'indextar[jpeg]' (or pip install simplejpeg)"
            )
        if self.mode not in IMAGE_SPECS:
            raise DecodeSpecError(
                f"unknown image_decoder mode {self.mode!r}; "
                f"expected one of {', '.join(IMAGE_SPECS)}"
            )
        size = self.size
        valid = (
            size is None
            or (type(size) is int and size > 0)
            or (
                isinstance(size, tuple)
                and len(size) == 2
                and all(type(side) is int and side > 0 for side in size)
            )
        )
        if not valid:
            raise DecodeSpecError(
                f"image_decoder size= must be a positive int (the shorter side), a tuple "
                f"(height, width) of positive ints, or None (no resize); got {size!r}"
            )
        if self.fit not in ("crop", "pad"):
            raise DecodeSpecError(f"image_decoder fit= must be 'crop' or 'pad'; got {self.fit!r}")
        if self.resample not in FILTERS:
            raise DecodeSpecError(
                f"image_decoder resample= must be one of {', '.join(FILTERS)}; "
                f"got {self.resample!r}"
            )
        import PIL.Image

        PIL.Image.preinit()  # as ImageHandler: forked workers inherit the plugins

    def __call__(self, key: str, data: bytes) -> Any:
        if key.rpartition(".")[2].lower() not in self.extensions:
            return None
        # Writable: a few microseconds at training size, and collate takes it silently.
        return image_value(self.decode_pil(data), self.mode, writable=True)

    def decode_pil(self, data: bytes) -> PIL.Image.Image:
        """``data`` decoded, upright and resized, as a PIL image in this decoder's mode."""
        import PIL.Image

        want = IMAGE_SPECS[self.mode][2].upper()
        with io.BytesIO(data) as stream:
            img: PIL.Image.Image = PIL.Image.open(stream)
            orientation = _orientation(img) if self.orient else 1
            swapped = orientation >= 5  # 5-8 turn the image a quarter: width and height swap
            width, height = img.size[::-1] if swapped else img.size
            geometry = None
            if self.size is not None:
                geometry = target_geometry(width, height, self.size, self.fit)
            scale = 1.0
            turbo = _jpeg_module(self.backend)
            decoded = None
            if img.format == "JPEG" and turbo is not None and img.mode in ("RGB", "L"):
                decoded = _decode_simplejpeg(turbo, data, img, want, geometry, swapped)
            if decoded is not None:
                img, scale = decoded
            else:
                if img.format == "JPEG":
                    scale = _draft(img, want, geometry, swapped)
                img.load()
        if orientation in _TRANSPOSE:
            img = img.transpose(getattr(PIL.Image.Transpose, _TRANSPOSE[orientation]))
        if img.mode not in _CONVERT_AFTER:
            img = img.convert(want)
        if geometry is not None:
            img = self._resize(img, geometry, scale)
        if img.mode != want:
            img = img.convert(want)
        return img

    def _resize(self, img: PIL.Image.Image, geometry: Geometry, scale: float) -> PIL.Image.Image:
        import PIL.Image

        # A drafted image holds the source at ``scale`` (1/2, 1/4, 1/8); the box follows.
        box = tuple(edge * scale for edge in geometry.box)
        if geometry.content != img.size or box != (0.0, 0.0, *map(float, img.size)):
            resample = PIL.Image.Resampling[self.resample.upper()]
            img = img.resize(geometry.content, resample, box)  # type: ignore[arg-type]
        if geometry.canvas == geometry.content:
            return img
        canvas = PIL.Image.new(img.mode, geometry.canvas)
        canvas.paste(img, geometry.offset)
        return canvas


def _orientation(img: PIL.Image.Image) -> int:
    """The EXIF orientation (1-8) of an opened image; 1 when it has none or a bad one."""
    if img.format == "JPEG" and "exif" not in img.info:
        return 1  # the common case: no APP1 block, nothing to parse
    try:
        value = img.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a broken EXIF block does not make the pixels unreadable
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _request(
    size: tuple[int, int], geometry: Geometry | None, swapped: bool
) -> tuple[int, int] | None:
    """The smallest decoded size (stored orientation) that keeps at least one source
    pixel per output pixel across the geometry's box; ``None``: full size."""
    if geometry is None:
        return None
    left, top, right, bottom = geometry.box
    scale = min((right - left) / geometry.content[0], (bottom - top) / geometry.content[1])
    width, height = size[::-1] if swapped else size
    request = (max(1, int(width / scale)), max(1, int(height / scale)))
    return request[::-1] if swapped else request


def _draft(img: Any, want: str, geometry: Geometry | None, swapped: bool) -> float:
    """Ask libjpeg-turbo to decode at the smallest DCT scale that still covers the target
    (and only the luma plane when the result is greyscale); the scale it chose."""
    request = _request(img.size, geometry, swapped)
    stored_width = img.size[0]
    drafted = img.draft("L" if want == "L" else "RGB", request)
    if drafted is None:  # Pillow declined (more than one tile): a full-size decode
        return 1.0
    # Pillow returns the source's extent in decoded pixels, (0, 0, w/s, h/s): 1/s.
    return float(drafted[1][2] / stored_width)


def _simplejpeg() -> Any:
    """The simplejpeg module, or ``None`` where it is not installed."""
    global _SIMPLEJPEG
    if _SIMPLEJPEG is False:
        try:
            import simplejpeg
        except ImportError:
            simplejpeg = None
        _SIMPLEJPEG = simplejpeg
    return _SIMPLEJPEG


_SIMPLEJPEG: Any = False  # not looked for yet
AUTO_SIMPLEJPEG = True
"""Whether ``backend="auto"`` uses simplejpeg where it is installed (tests turn it off)."""


def _jpeg_module(backend: Backend) -> Any:
    """The simplejpeg module if ``backend`` decodes JPEGs with it here, else ``None``."""
    if backend == "pillow" or (backend == "auto" and not AUTO_SIMPLEJPEG):
        return None
    return _simplejpeg()


def _decode_simplejpeg(
    turbo: Any, data: bytes, img: Any, want: str, geometry: Geometry | None, swapped: bool
) -> tuple[PIL.Image.Image, float] | None:
    """``data`` decoded by simplejpeg at the smallest scale covering the target, as a
    PIL image, and that scale; ``None`` if it refuses (Pillow then decodes, and decides
    what a damaged file gives)."""
    import PIL.Image

    request = _request(img.size, geometry, swapped) or (0, 0)
    grey = want == "L" or img.mode == "L"
    try:
        pixels = turbo.decode_jpeg(
            data,
            colorspace="GRAY" if grey else "RGB",
            min_width=request[0],
            min_height=request[1],
        )
    except ValueError:
        return None
    if grey:
        pixels = pixels[:, :, 0]
    return PIL.Image.fromarray(pixels), pixels.shape[1] / img.size[0]


def image_decoder(
    mode: str = "rgb8",
    size: int | tuple[int, int] | None = 256,
    *,
    fit: Fit = "crop",
    resample: str = "bilinear",
    orient: bool = True,
    extensions: frozenset[str] | None = None,
    backend: Backend = "auto",
) -> ImageDecoder:
    """A ``decode=`` handler that decodes images straight to training size.

    Use it alone (``decode=image_decoder(size=256)``) or in a list with other handlers
    and spec strings (``decode=[image_decoder(size=224), "torchrgb"]``). JPEGs are
    decoded at a reduced DCT scale and resized once; other formats are decoded, then
    resized.

    Parameters
    ----------
    mode
        A webdataset image spec: ``rgb8``, ``l8``, ``rgba8`` (uint8 HWC numpy), ``rgb``,
        ``l``, ``rgba`` (float32 in [0, 1]), ``torchrgb8``, ``torchrgb``, ... (CHW torch
        tensors), ``pil``, ``pill``, ``pilrgba`` (PIL images).
    size
        An int: the shorter side, aspect kept (the longer side truncated, as
        ``torchvision.transforms.Resize``). A tuple ``(height, width)``: exactly that,
        filled as ``fit`` says. ``None``: no resize (orientation and mode only).
    fit
        For a tuple ``size``: ``"crop"`` scales the image to cover it and keeps the
        centre; ``"pad"`` scales the whole image to fit inside and centres it on zeros.
    resample
        The resize filter: ``nearest``, ``box``, ``bilinear`` (the default, as
        torchvision), ``hamming``, ``bicubic`` or ``lanczos``.
    orient
        Turn images upright by their EXIF orientation (webdataset's spec strings do not).
    extensions
        The member extensions decoded as images; default every image format PIL opens.
    backend
        Who decodes JPEGs: ``"simplejpeg"`` (libjpeg-turbo at any scale in eighths;
        ``pip install 'indextar[jpeg]'``), ``"pillow"`` (``Image.draft``: 1/2, 1/4,
        1/8), or ``"auto"``: simplejpeg where it is installed. Both keep to the same PSNR
        bound; only ``"pillow"`` gives the same pixels on every machine. Other formats,
        CMYK JPEGs and files simplejpeg refuses are Pillow's either way.

    Raises
    ------
    DecodeSpecError
        If ``mode``, ``size``, ``fit`` or ``resample`` is not one of the above.
    """
    return ImageDecoder(
        mode.lower(),
        size,
        fit,
        resample,
        orient,
        IMAGE_EXTENSIONS if extensions is None else frozenset(extensions),
        backend,
    )
