"""The one reader of label masks (fundus, nuclei): a uint8 H x W grey mask, read at its real bit depth.

``Image.convert("L")`` clips a 16-bit mask (32896 -> 255: every rim pixel becomes background) and
Pillow silently keeps only the high byte of 16-bit colour samples, so masks are never converted
blindly. What is accepted, and how:

* 8-bit grey (``L``), bilevel (``1``, as 0/255, what ``convert("L")`` gives): as stored;
* 16-bit grey (``I;16*``): only when every value is an 8-bit level scaled to 16 bits (a multiple of
  257: 0, 32896, 65535), mapped exactly with ``value // 257``; anything else has no exact 8-bit
  equivalent and is refused;
* 8-bit RGB/RGBA, grey+alpha, palette (looked up through the palette, which is lossless): the grey
  value when the colour channels are equal (real RIF masks are grey saved as RGB); alpha is ignored,
  as before. Colour masks are refused unless the caller asks for ``colour="max"`` (nuclei: any
  non-zero channel is foreground). With ``palette="index"`` (a user's own data) a palette mask is
  its indices instead: the index is the label, whatever colour the palette shows it in;
* a MinIsWhite TIFF (0 is white) as a viewer shows it, inverted (Pillow does so for 1 and 8 bits,
  this module for 16);
* everything else (float, 32-bit or signed integers, 16-bit colour, CMYK, ...) is refused.

Every refusal is one ``DataError`` (the caller's subclass) naming the file and what was found; so is
an image too large for Pillow to decode safely (``open_image``).

``upright=True`` turns the mask upright as a viewer shows it, by its own EXIF Orientation tag
(``exif_orientation``, ``apply_orientation``: what ``PIL.ImageOps.exif_transpose`` does), as the user's own
data (``folders``) reads images and masks alike; the papers' families read their masks as stored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..errors import DataError

__all__ = ["read_mask", "deep_rawmode", "exif_orientation", "open_image", "apply_orientation"]

_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_COLOUR = ("RGB", "RGBA", "LA", "P", "PA")
# Pillow decodes 16-bit RGB / grey+alpha PNGs and TIFFs into 8-bit modes through a raw mode such
# as "RGB;16B", dropping the low byte; the raw mode is only visible before the pixels are loaded.
_DEEP_RAWMODE = re.compile(r";(16|32)")


def _rawmodes(img) -> list[str]:
    modes = []
    for tile in getattr(img, "tile", None) or []:
        args = tile[3] if len(tile) > 3 else None
        raw = (
            args
            if isinstance(args, str)
            else (args[0] if isinstance(args, tuple) and args and isinstance(args[0], str) else "")
        )
        modes.append(raw)
    return modes


def deep_rawmode(img) -> str:
    """For an opened, not yet loaded Pillow image: the raw mode (e.g. ``RGB;16B``) under which Pillow
    decodes 16- or 32-bit samples into an 8-bit mode, dropping their low bytes; ``""`` if none."""
    return next((r for r in _rawmodes(img) if _DEEP_RAWMODE.search(r)), "")


EXIF_ORIENTATION = 0x0112  # the EXIF tag: 1 upright, 2..8 mirrored and/or rotated (TIFF tag 274 alike)


def open_image(path: Path, error: type[DataError] = DataError):
    """``Image.open`` (lazy: the header only), with Pillow's guard against decompression bombs told in
    one line naming the file: an image of more than twice ``Image.MAX_IMAGE_PIXELS`` pixels (about
    179 million) is refused before any pixel is decoded."""
    try:
        return Image.open(path)
    except Image.DecompressionBombError as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        pixels = f"{int(found.group(1)) / 1e6:.0f} million pixels" if found else "too many pixels"
        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0) / 1e6
        raise error(
            f"{path}: {pixels}, more than the {limit:.0f} million that Pillow decodes safely (a decompression "
            "bomb guard); downscale the image or cut it into tiles before using it"
        ) from None


def exif_orientation(img) -> int:
    """The EXIF Orientation (1..8) of an opened Pillow image, 1 when it has none. Only the EXIF
    block the header holds is read: a PNG whose eXIf chunk comes after its pixels counts as
    upright until its pixels are loaded."""
    if "exif" not in img.info and img.format == "PNG":
        return 1  # Pillow's PNG getexif() would decode the whole image to look further
    try:
        value = img.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 (a damaged EXIF block: the pixels are read as stored)
        return 1
    return int(value) if isinstance(value, int) and 1 <= value <= 8 else 1


def apply_orientation(array: np.ndarray, orientation: int) -> np.ndarray:
    """``array`` (H x W or H x W x C, as stored) as a viewer shows it under an EXIF Orientation: the
    transposition ``PIL.ImageOps.exif_transpose`` applies (checked against it in the tests)."""
    turned = {
        2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 4: lambda a: a[::-1],
        5: lambda a: a.swapaxes(0, 1), 6: lambda a: np.rot90(a, -1), 7: lambda a: np.rot90(a, 2).swapaxes(0, 1),
        8: lambda a: np.rot90(a, 1),
    }.get(orientation)  # fmt: skip
    return array if turned is None else np.ascontiguousarray(turned(array))


def _values(array: np.ndarray, limit: int = 6) -> str:
    found = np.unique(array)
    shown = ", ".join(str(v) for v in found[:limit].tolist())
    return f"{shown}, ... ({len(found)} distinct)" if len(found) > limit else shown


def read_mask(
    path: str | os.PathLike,
    *,
    error: type[DataError] = DataError,
    colour: str = "refuse",
    upright: bool = False,
    page: int = 0,
    palette: str = "colours",
) -> np.ndarray:
    """The mask at ``path`` as a uint8 H x W array of grey values, never clipped or rounded.

    ``colour="refuse"``: a mask whose colour channels differ is an error (a grey mask is expected);
    ``colour="max"``: the largest of R, G, B per pixel (for masks read as "any value > 0").
    ``upright``: turned upright by the file's EXIF Orientation tag, if it has one.
    ``page``: the page (frame) of a multi-page file to read; the caller checks that it exists.
    ``palette="colours"``: a palette mask is read through its palette (the colours a viewer shows);
    ``palette="index"``: as its indices (the index is the label, whatever colour shows it).
    """
    grey, orientation = _read_grey(Path(path), error, colour, page, palette)
    return apply_orientation(grey, orientation) if upright else grey


def _read_grey(
    path: Path, error: type[DataError], colour: str, page: int = 0, palette: str = "colours"
) -> tuple[np.ndarray, int]:
    """The mask's grey values as stored, and its EXIF Orientation."""
    if colour not in ("refuse", "max"):
        raise ValueError(f"colour must be 'refuse' or 'max', got {colour!r}")
    if palette not in ("colours", "index"):
        raise ValueError(f"palette must be 'colours' or 'index', got {palette!r}")
    try:
        with open_image(path, error) as img:
            if page:
                img.seek(page)
            rawmodes = _rawmodes(img)
            img.load()
            orientation = exif_orientation(img)
            mode = img.mode
            white = img.format == "TIFF" and img.tag_v2.get(262) == 0  # MinIsWhite
            bits = img.tag_v2.get(258, (16,))[0] if img.format == "TIFF" else 16
            if mode in ("P", "PA") and palette == "index":
                return np.ascontiguousarray(
                    np.asarray(img)[..., 0] if mode == "PA" else np.asarray(img), np.uint8
                ), orientation
            if mode in ("P", "PA"):
                img = img.convert("RGBA")  # the palette entries, exactly
            array = np.asarray(img)
    except error:
        raise  # open_image's own line
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise error(f"{path}: cannot decode the mask ({exc})") from exc

    deep = [r for r in rawmodes if _DEEP_RAWMODE.search(r)]
    if mode == "L" and not deep:
        return np.ascontiguousarray(array, dtype=np.uint8), orientation
    if mode == "1":
        return array.astype(np.uint8) * 255, orientation
    if mode in _SIXTEEN_BIT:
        array = array.astype(np.uint16)
        if white:  # Pillow inverts 1- and 8-bit MinIsWhite TIFFs (as a viewer shows them), not 16-bit ones
            array = ((1 << int(bits)) - 1 - array.astype(np.int64)).astype(np.uint16)
        if (array % 257).any():
            raise error(
                f"{path}: 16-bit mask with values that are not 8-bit levels scaled by 257 (found {_values(array)}); "
                "it cannot be read without changing its classes: save it as 8-bit grey"
            )
        return (array // 257).astype(np.uint8), orientation
    if mode in _COLOUR and not deep and array.dtype == np.uint8:
        if mode == "LA":
            return np.ascontiguousarray(array[..., 0]), orientation
        rgb = array[..., :3]  # alpha ignored
        if (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all():
            return np.ascontiguousarray(rgb[..., 0]), orientation
        if colour == "max":
            return rgb.max(axis=-1), orientation
        differ = int(((rgb[..., 0] != rgb[..., 1]) | (rgb[..., 1] != rgb[..., 2])).sum())
        raise error(
            f"{path}: colour mask ({mode}, R/G/B differ at {differ} of {rgb.shape[0] * rgb.shape[1]} pixels) "
            "where a grey mask is expected"
        )
    stored = f" stored as {deep[0]}" if deep else ""  # e.g. RGB;16B: Pillow already dropped the low bytes
    raise error(
        f"{path}: cannot read Pillow mode {mode}{stored} as a mask without changing its values; "
        "expected 8-bit grey, or 16-bit grey with levels scaled by 257"
    )
