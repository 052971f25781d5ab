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
  non-zero channel is foreground);
* everything else (float, 32-bit or signed integers, 16-bit colour, CMYK, ...) is refused.

Every refusal is one ``DataError`` (the caller's subclass) naming the file and what was found.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from ..errors import DataError

__all__ = ["read_mask", "deep_rawmode"]

_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_COLOUR = ("RGB", "RGBA", "LA", "P", "PA")
# Pillow decodes 16-bit RGB / grey+alpha PNGs and TIFFs into 8-bit modes through a raw mode such
# as "RGB;16B", dropping the low byte; the raw mode is only visible before the pixels are loaded.
_DEEP_RAWMODE = re.compile(r";(16|32)")


def _rawmodes(img) -> list[str]:
    modes = []
    for tile in getattr(img, "tile", None) or []:
        args = tile[3] if len(tile) > 3 else None
        raw = args if isinstance(args, str) else (args[0] if isinstance(args, tuple) and args and isinstance(args[0], str) else "")
        modes.append(raw)
    return modes


def deep_rawmode(img) -> str:
    """For an opened, not yet loaded Pillow image: the raw mode (e.g. ``RGB;16B``) under which Pillow
    decodes 16- or 32-bit samples into an 8-bit mode, dropping their low bytes; ``""`` if none."""
    return next((r for r in _rawmodes(img) if _DEEP_RAWMODE.search(r)), "")


def _values(array: np.ndarray, limit: int = 6) -> str:
    found = np.unique(array)
    shown = ", ".join(str(v) for v in found[:limit].tolist())
    return f"{shown}, ... ({len(found)} distinct)" if len(found) > limit else shown


def read_mask(path: str | os.PathLike, *, error: type[DataError] = DataError, colour: str = "refuse") -> np.ndarray:
    """The mask at ``path`` as a uint8 H x W array of grey values, never clipped or rounded.

    ``colour="refuse"``: a mask whose colour channels differ is an error (a grey mask is expected);
    ``colour="max"``: the largest of R, G, B per pixel (for masks read as "any value > 0").
    """
    from PIL import Image, UnidentifiedImageError

    if colour not in ("refuse", "max"):
        raise ValueError(f"colour must be 'refuse' or 'max', got {colour!r}")
    path = Path(path)
    try:
        with Image.open(path) as img:
            rawmodes = _rawmodes(img)
            img.load()
            mode = img.mode
            if mode in ("P", "PA"):
                img = img.convert("RGBA")  # the palette entries, exactly
            array = np.asarray(img)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise error(f"{path}: cannot decode the mask ({exc})") from exc

    deep = [r for r in rawmodes if _DEEP_RAWMODE.search(r)]
    if mode == "L" and not deep:
        return np.ascontiguousarray(array, dtype=np.uint8)
    if mode == "1":
        return array.astype(np.uint8) * 255
    if mode in _SIXTEEN_BIT:
        array = array.astype(np.uint16)
        if (array % 257).any():
            raise error(
                f"{path}: 16-bit mask with values that are not 8-bit levels scaled by 257 (found {_values(array)}); "
                "it cannot be read without changing its classes: save it as 8-bit grey"
            )
        return (array // 257).astype(np.uint8)
    if mode in _COLOUR and not deep and array.dtype == np.uint8:
        if mode == "LA":
            return np.ascontiguousarray(array[..., 0])
        rgb = array[..., :3]  # alpha ignored
        if (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all():
            return np.ascontiguousarray(rgb[..., 0])
        if colour == "max":
            return rgb.max(axis=-1)
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
