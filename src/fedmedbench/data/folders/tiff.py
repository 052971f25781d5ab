"""A TIFF image as an image viewer shows it: the samples of one page (image directory) read with
tifffile at their real bit depth, then turned into grey or RGB through the page's own
``PhotometricInterpretation`` and ``ExtraSamples`` tags, which the raw samples ignore:

* MinIsBlack: grey as stored; MinIsWhite: grey inverted (0 is white), ``2**bits - 1 - v``;
* RGB as stored; an associated (premultiplied) alpha divided out as Pillow does, any other alpha dropped;
* Palette: each index looked up in the colour map (16-bit entries, the high byte kept, as Pillow does);
* Separated with the CMYK ink set: ``R = (max - C) (max - K) / max`` (Pillow's conversion, rounded);
* YCbCr (uncompressed, not subsampled): the TIFF 6.0 conversion with the file's YCbCrCoefficients
  and ReferenceBlackWhite (defaults: ITU-R BT.601, full range); a JPEG-compressed page is already RGB;
* anything else (CIELab, LogLuv, CFA, a multichannel page: more samples than its photometric
  interpretation shows, beyond an alpha and one extra sample) is refused.

A multi-page or pyramidal file is read at one page (``page``, the first by default: the full
resolution of a whole-slide pyramid); the caller warns with the page count. ``tiff_header`` gives
what ``read_tiff`` will show (size, grey or colour) from the headers alone, for ``check-data``. Masks
are not read here: see ``reading.read_folders_mask``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tifffile
from tifffile import PHOTOMETRIC

from .options import FoldersDataError

# TIFF tags by number (the TIFF 6.0 specification)
ORIENTATION, INKSET, YCBCR_COEFFICIENTS, REFERENCE_BLACK_WHITE = 274, 332, 529, 532
ASSOCIATED_ALPHA = 1  # ExtraSamples value


def tiff_pages(path: str | Path) -> int:
    """The number of pages (image directories) of a TIFF file, from its headers."""
    with tifffile.TiffFile(path) as tif:
        return len(tif.pages)


def check_page(path: Path, page: int, pages: int) -> None:
    if page >= pages:
        raise FoldersDataError(
            f"{path}: tiff_page is {page}, but the file has {pages} page(s), numbered 0 .. {pages - 1}; "
            "set tiff_page to a page every TIFF file has (0: the first)"
        )


def read_tiff(path: Path, page: int = 0) -> tuple[np.ndarray, int, int]:
    """(pixels of page ``page`` as a viewer shows them, at their real bit depth: H x W grey or
    H x W x 3 RGB; the page's TIFF Orientation, 1..8; the file's page count). A file that tifffile
    cannot decode raises its own error (the caller tries Pillow); a page it decodes but that cannot
    be shown faithfully is one ``FoldersDataError`` naming the file."""
    with tifffile.TiffFile(path) as tif:
        pages = len(tif.pages)
        if not pages:
            raise ValueError("no image directory in the file")
        check_page(path, page, pages)
        ifd = tif.pages[page]
        samples = np.asarray(ifd.asarray())
        if samples.size == 0:
            raise ValueError("no pixels in the file")
        if "S" in ifd.axes:
            samples = np.moveaxis(samples, ifd.axes.index("S"), -1)  # planar configuration: samples last
        _check_axes(path, page, ifd)
        return _as_viewed(path, ifd, samples), _orientation(ifd), pages


def tiff_header(path: Path, page: int = 0) -> tuple[int, int, int, int, int]:
    """(H, W, channels: 1 grey or 3 colour, the page's TIFF Orientation, the file's page count) of
    page ``page`` as ``read_tiff`` will show it, from the headers alone (no pixel decoded), with its
    checks: the page exists, is 2-D, and its photometric interpretation and samples can be shown."""
    with tifffile.TiffFile(path) as tif:
        pages = len(tif.pages)
        if not pages:
            raise ValueError("no image directory in the file")
        check_page(path, page, pages)
        ifd = tif.pages[page]
        shape = tuple(ifd.shape)
        if "S" in ifd.axes:
            shape = tuple(n for axis, n in zip(ifd.axes, shape) if axis != "S") + (shape[ifd.axes.index("S")],)
        _check_axes(path, page, ifd)
        _shown_samples(path, ifd, shape[2] if len(shape) == 3 else 1)
        grey = ifd.photometric in (PHOTOMETRIC.MINISBLACK, PHOTOMETRIC.MINISWHITE)  # a palette shows colours
        return shape[0], shape[1], 1 if grey else 3, _orientation(ifd), pages


def _check_axes(path: Path, page: int, ifd) -> None:
    if ifd.axes.replace("S", "") + ("S" if "S" in ifd.axes else "") not in ("YX", "YXS"):
        raise FoldersDataError(f"{path}: page {page} has axes {ifd.axes} (tifffile's names); expected a 2-D image")


def _orientation(ifd) -> int:
    tag = ifd.tags.get(ORIENTATION)
    return tag.value if tag is not None and isinstance(tag.value, int) and 1 <= tag.value <= 8 else 1


def _shown_samples(path: Path, ifd, samples: int) -> int:
    """Of a page's ``samples`` samples per pixel, how many its photometric interpretation shows (1:
    grey or a palette index, 3: RGB or YCbCr, 4: CMYK), the rest being alpha or one unnamed extra
    sample; a page a viewer cannot show as one picture is refused."""
    photometric = PHOTOMETRIC(ifd.photometric)
    extra = tuple(ifd.extrasamples or ())
    colour = samples - len(extra)
    expected = {
        PHOTOMETRIC.MINISBLACK: 1,
        PHOTOMETRIC.MINISWHITE: 1,
        PHOTOMETRIC.PALETTE: 1,
        PHOTOMETRIC.RGB: 3,
        PHOTOMETRIC.SEPARATED: 4,
        PHOTOMETRIC.YCBCR: 3,
    }.get(photometric)
    if expected is None:
        raise FoldersDataError(
            f"{path}: TIFF photometric interpretation {photometric.name} is not supported; "
            "save the image as RGB or grey"
        )
    # Alpha (and one sample of unspecified meaning, as Pillow's RGBX) is dropped; more extra samples
    # of unspecified meaning are channels of a multichannel image, which no viewer shows as one picture.
    if colour != expected or sum(int(e) == 0 for e in extra) > 1:
        raise FoldersDataError(
            f"{path}: {colour + len(extra)} samples per pixel under photometric {photometric.name}, "
            f"which shows {expected} (a multichannel image); save one channel per file, or as RGB"
        )
    return expected


def _as_viewed(path: Path, ifd, samples: np.ndarray) -> np.ndarray:
    photometric = PHOTOMETRIC(ifd.photometric)
    expected = _shown_samples(path, ifd, samples.shape[-1] if samples.ndim == 3 else 1)
    pixels = samples[..., :expected] if samples.ndim == 3 else samples
    if expected == 1 and pixels.ndim == 3:
        pixels = pixels[..., 0]
    if photometric == PHOTOMETRIC.MINISBLACK:
        return pixels
    if photometric == PHOTOMETRIC.MINISWHITE:
        return _inverted(pixels, ifd.bitspersample)
    if photometric == PHOTOMETRIC.PALETTE:
        # Pillow keeps each 16-bit colour map entry's high byte: writers store 8-bit colours times 257.
        colours = (np.asarray(ifd.colormap, np.uint16) >> 8).astype(np.uint8)  # 3 x 2**bits
        return np.ascontiguousarray(colours[:, pixels.astype(np.intp)].transpose(1, 2, 0))
    if photometric == PHOTOMETRIC.RGB:
        extra = tuple(ifd.extrasamples or ())
        if extra and extra[0] == ASSOCIATED_ALPHA:
            return _unpremultiplied(pixels, samples[..., 3])
        return pixels
    if photometric == PHOTOMETRIC.SEPARATED:
        inkset = ifd.tags.get(INKSET)
        if inkset is not None and inkset.value != 1:
            raise FoldersDataError(
                f"{path}: a separated (ink) TIFF with ink set {inkset.value}, not CMYK; save it as RGB"
            )
        return _cmyk_to_rgb(path, pixels)
    if ifd.compression in (6, 7):  # JPEG: decoded to RGB already
        return pixels
    return _ycbcr_to_rgb(path, ifd, pixels)


def _inverted(grey: np.ndarray, bits) -> np.ndarray:
    """MinIsWhite grey as MinIsBlack: white (0) becomes the brightest value of the sample's depth."""
    if grey.dtype == bool:
        return ~grey
    if grey.dtype.kind == "u":
        top = (1 << int(bits)) - 1 if isinstance(bits, (int, np.integer)) else np.iinfo(grey.dtype).max
        return (top - grey.astype(np.int64)).astype(grey.dtype)
    if grey.dtype.kind == "i":
        return ~grey  # -1 - v: the order reversed without overflow
    return -grey  # float: scaled per image afterwards, so the sign alone inverts it


def _unpremultiplied(rgb: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Colours stored multiplied by their alpha, divided out (``v * max // alpha``, 0 where alpha
    is 0), what Pillow's RGBa decoding does."""
    if rgb.dtype.kind == "f":
        return np.where(alpha[..., None] > 0, rgb / np.where(alpha > 0, alpha, 1)[..., None], 0).astype(rgb.dtype)
    top = np.iinfo(rgb.dtype).max
    a = alpha.astype(np.int64)[..., None]
    out = np.where(a > 0, np.minimum(rgb.astype(np.int64) * top // np.maximum(a, 1), top), 0)
    return out.astype(rgb.dtype)


def _cmyk_to_rgb(path: Path, cmyk: np.ndarray) -> np.ndarray:
    if cmyk.dtype.kind != "u":
        raise FoldersDataError(f"{path}: a CMYK TIFF of {cmyk.dtype} samples; save it as 8- or 16-bit RGB")
    top = np.iinfo(cmyk.dtype).max
    values = cmyk.astype(np.int64)
    rest = top - values[..., 3:4]  # what black leaves
    # rest - round(C * rest / top): Pillow's cmyk2rgb for 8 bits (its MULDIV255 rounds to nearest)
    rgb = rest - (2 * values[..., :3] * rest + top) // (2 * top)
    return rgb.astype(cmyk.dtype)


def _rationals(ifd, code: int, count: int) -> list[float] | None:
    """A tag of ``count`` rational numbers (tifffile gives them as numerator, denominator pairs)."""
    tag = ifd.tags.get(code)
    if tag is None:
        return None
    values = [float(v) for v in np.ravel(tag.value)]
    if len(values) == 2 * count:
        values = [n / d if d else 0.0 for n, d in zip(values[0::2], values[1::2])]
    return values if len(values) == count else None


def _ycbcr_to_rgb(path: Path, ifd, ycbcr: np.ndarray) -> np.ndarray:
    if ycbcr.dtype != np.uint8:
        raise FoldersDataError(f"{path}: a YCbCr TIFF of {ycbcr.dtype} samples; save it as RGB")
    red, green, blue = _rationals(ifd, YCBCR_COEFFICIENTS, 3) or [0.299, 0.587, 0.114]
    ref = _rationals(ifd, REFERENCE_BLACK_WHITE, 6) or [0, 255, 128, 255, 128, 255]
    values = ycbcr.astype(np.float64)
    y = (values[..., 0] - ref[0]) * 255 / (ref[1] - ref[0])
    cb = (values[..., 1] - ref[2]) * 127 / (ref[3] - ref[2])
    cr = (values[..., 2] - ref[4]) * 127 / (ref[5] - ref[4])
    r = cr * (2 - 2 * red) + y
    b = cb * (2 - 2 * blue) + y
    g = (y - blue * b - red * r) / green
    return np.clip(np.floor(np.stack([r, g, b], axis=-1) + 0.5), 0, 255).astype(np.uint8)
