"""Reading the RIF release (ROI images and grey masks) into the canonical store: mask encodings, resizing, pairs."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from ..images import read_mask
from ..store import atomic_write_text, staged_dir, write_client
from .download import ARCHIVE
from .opencv_resize import resize_linear_u8
from .sites import DOMAIN_SOURCES, DOMAINS, EXPECTED_COUNTS, FundusDataError

MASK_RESAMPLE = {"fedlwr": "nearest", "fedlwr_bilinear_masks": "bilinear"}

DEFAULT_SIZE = 384

CLASSES = ("background", "rim", "cup")
BACKGROUND, RIM, CUP = 0, 1, 2
# DoFE's class rule (its loader): grey > 200 background, 50 < grey <= 200 rim, grey <= 50 cup. Applied
# with these exact inequalities to any value, interpolated (non-integer) ones included.
CUP_MAX = 50  # grey <= 50 -> cup
BACKGROUND_ABOVE = 200  # grey > 200 -> background; in between -> rim

OFFICIAL_SPLITS = ("train", "test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
_SEARCH_DEPTH = 3
_EYE_RE = re.compile(r"^(?P<group>.+?)[-_][LR]$")
_THREADS = max(1, min(8, os.cpu_count() or 1))


# ---------------------------------------------------------------------------
# Mask encodings
# ---------------------------------------------------------------------------


def mask_to_classes(
    grey: np.ndarray, cup_max: float = CUP_MAX, background_above: float = BACKGROUND_ABOVE
) -> np.ndarray:
    """Grey mask (0 cup / 128 rim / 255 background, any value) -> uint8 classes 0 bg, 1 rim, 2 cup,
    by DoFE's rule: grey <= cup_max cup, grey > background_above background, else rim."""
    grey = np.asarray(grey)
    if not 0 <= cup_max < background_above < 255:
        raise ValueError(f"need 0 <= cup_max < background_above < 255, got {cup_max}, {background_above}")
    out = np.full(grey.shape, RIM, np.uint8)
    out[grey <= cup_max] = CUP
    out[grey > background_above] = BACKGROUND
    return out


def fedlwr_code_mask_to_classes(grey: np.ndarray) -> np.ndarray:
    """Fed-LWR's ``2 - uint8(grey / 127)``: grey 0..126 -> cup, 127..253 -> rim, 254/255 -> background."""
    grey = np.asarray(grey, dtype=np.float64)
    return (2 - (grey / 127).astype(np.uint8)).astype(np.uint8)


def disc_cup(labels: np.ndarray) -> np.ndarray:
    """DoFE's two overlapping binary targets [cup, disc] (disc = rim + cup) from stored labels.

    ``labels`` H x W or N x H x W; the channel axis is inserted before H (2 x H x W or N x 2 x H x W).
    """
    labels = np.asarray(labels)
    return np.stack([labels == CUP, labels >= RIM], axis=-3)


# ---------------------------------------------------------------------------
# Resizing
# ---------------------------------------------------------------------------


def _linear_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Source indices and weights of OpenCV's INTER_LINEAR along one axis."""
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    i0 = np.floor(src).astype(np.int64)
    w = src - i0
    low = i0 < 0
    i0[low], w[low] = 0, 0.0
    high = i0 >= n_in - 1
    i0[high], w[high] = n_in - 1, 0.0
    return i0, np.minimum(i0 + 1, n_in - 1), w


def resize_bilinear(array: np.ndarray, size: int) -> np.ndarray:
    """``size`` x ``size`` uint8 resize with OpenCV INTER_LINEAR semantics (H x W or H x W x C)."""
    a = np.asarray(array, dtype=np.float32)
    h, w = a.shape[:2]
    if (h, w) == (size, size):
        return np.asarray(array, dtype=np.uint8).copy()
    y0, y1, wy = _linear_taps(h, size)
    x0, x1, wx = _linear_taps(w, size)
    wy = wy.astype(np.float32).reshape(-1, *([1] * (a.ndim - 1)))
    wx = wx.astype(np.float32).reshape(1, -1, *([1] * (a.ndim - 2)))
    rows = a[y0] * (1 - wy) + a[y1] * wy
    out = rows[:, x0] * (1 - wx) + rows[:, x1] * wx
    return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)


def resize_nearest(array: np.ndarray, size: int) -> np.ndarray:
    """``size`` x ``size`` nearest-neighbour resize, sampling at pixel centres (as Pillow's NEAREST)."""
    a = np.asarray(array)
    h, w = a.shape[:2]
    ys = np.minimum(((np.arange(size) + 0.5) * h / size).astype(np.int64), h - 1)
    xs = np.minimum(((np.arange(size) + 0.5) * w / size).astype(np.int64), w - 1)
    return a[ys][:, xs].copy()


# ---------------------------------------------------------------------------
# Finding the files
# ---------------------------------------------------------------------------


def find_fundus_root(extracted: str | os.PathLike) -> Path:
    """The folder holding ``Domain1..4`` (``Fundus/`` in the release), searched 3 levels deep."""
    extracted = Path(extracted)
    if not extracted.is_dir():
        raise FundusDataError(f"fundus raw folder {extracted} does not exist")
    seen, level = [], [extracted]
    for _ in range(_SEARCH_DEPTH + 1):
        next_level = []
        for folder in level:
            names = sorted(p.name for p in folder.iterdir() if p.is_dir())
            if set(DOMAINS) <= set(names):
                return folder
            seen.append(f"{folder}: {names or '(no subfolders)'}")
            next_level += [folder / n for n in names if n != "__MACOSX" and not n.startswith(".")]
        level = next_level
    listing = "\n  ".join(seen[:20]) + ("\n  ..." if len(seen) > 20 else "")
    raise FundusDataError(
        f"{extracted}: no folder containing {DOMAINS} within {_SEARCH_DEPTH} levels "
        f"(expected the DoFE layout Fundus/Domain1/train/ROIs/image/). Folders found:\n  {listing}"
    )


def list_pairs(
    root: str | os.PathLike, domain: str, split: str, log: Callable[[str], object] = print
) -> list[tuple[str, Path, Path]]:
    """``(name, image_path, mask_path)`` of one domain and official split, sorted by file name.

    The mask is ``ROIs/mask/<same name>`` (or the same stem with another image suffix). An image
    without a mask is an error; masks without an image are reported and skipped.
    """
    base = Path(root) / domain / split / "ROIs"
    image_dir, mask_dir = base / "image", base / "mask"
    for folder in (image_dir, mask_dir):
        if not folder.is_dir():
            raise FundusDataError(f"{folder} does not exist (expected <root>/{domain}/{split}/ROIs/{{image,mask}}/)")

    def files(folder: Path) -> dict[str, Path]:
        return {
            p.name: p
            for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
        }

    images, masks = files(image_dir), files(mask_dir)
    by_stem = {Path(n).stem: p for n, p in masks.items()}
    pairs, unpaired = [], []
    for name in sorted(images):
        mask = masks.get(name) or by_stem.get(Path(name).stem)
        if mask is None:
            unpaired.append(name)
        else:
            pairs.append((name, images[name], mask))
    if unpaired:
        raise FundusDataError(f"{image_dir}: {len(unpaired)} image(s) have no mask in {mask_dir}, e.g. {unpaired[:3]}")
    orphans = sorted({p.name for p in masks.values()} - {m.name for _, _, m in pairs})
    if orphans:
        log(f"fundus {domain}/{split}: {len(orphans)} mask(s) without an image skipped, e.g. {orphans[:3]}")
    if not pairs:
        raise FundusDataError(f"{image_dir}: no images found")
    return pairs


def group_of(domain: str, name: str) -> str:
    """Patient-level group: the stem without a trailing eye marker ``-L``/``-R`` (RIM-ONE's ``G-1-L``)."""
    stem = Path(name).stem
    match = _EYE_RE.match(stem)
    return f"{domain}/{match['group'] if match else stem}"


def _read(path: Path, mode: str) -> np.ndarray:
    try:
        with Image.open(path) as img:
            return np.asarray(img.convert(mode), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise FundusDataError(f"{path}: cannot decode the image ({exc})") from exc


# Above this fraction of pixels off the three levels 0/128/255, a mask is not DoFE's grey encoding
# but e.g. a soft probability map. Real RIF masks have none; a mask drawn or resized with
# anti-aliasing has a band of them along the disc and cup edges (3-6 % on the 48 px synthetic twin,
# up to 13 % at 24 px, under 1 % at the real 384-800 px), which DoFE's thresholds classify.
# Documented in docs/data/fundus.md and docs/reviewers/fedlwr.md.
MAX_OFF_LEVEL_FRACTION = 0.25


def check_mask_encoding(grey: np.ndarray, mask_path: Path) -> int:
    """Refuse masks that the grey-level rule would silently turn into nonsense, naming the file:
    class indices 0/1/2 (all "cup"), a mask without disc or without background, or one far from the
    three levels. Returns the number of off-level pixels."""
    if grey.max() <= 2 and len(np.unique(grey)) > 1:
        raise FundusDataError(
            f"{mask_path}: values {sorted(np.unique(grey).tolist())} look like class indices; expected DoFE's grey levels 0 (cup), 128 (rim), 255 (background)"
        )
    if not (grey <= BACKGROUND_ABOVE).any():
        raise FundusDataError(f"{mask_path}: no optic disc (every pixel > {BACKGROUND_ABOVE:g}, i.e. background)")
    if not (grey > BACKGROUND_ABOVE).any():
        raise FundusDataError(
            f"{mask_path}: no background (no pixel > {BACKGROUND_ABOVE:g}); expected a disc-centred ROI"
        )
    off_level = int((~np.isin(grey, (0, 128, 255))).sum())
    if off_level > MAX_OFF_LEVEL_FRACTION * grey.size:
        raise FundusDataError(
            f"{mask_path}: {off_level / grey.size:.1%} of pixels are not 0/128/255 (more than {MAX_OFF_LEVEL_FRACTION:.0%}); not a DoFE mask"
        )
    return off_level


def load_pair(
    image_path: Path, mask_path: Path, size: int, mask_resample: str = "nearest"
) -> tuple[np.ndarray, np.ndarray, dict]:
    """One image (RGB, bilinear) and its class map: ``nearest`` = DoFE's classes resized by nearest
    neighbour; ``bilinear`` = Fed-LWR's code exactly (classes by its formula, then OpenCV's bilinear resize
    of the class map and of the image, bit for bit)."""
    # Masks through the shared reader: convert("L") would clip a 16-bit mask (rim 32896 -> 255).
    image, grey = _read(image_path, "RGB"), read_mask(mask_path, error=FundusDataError)
    if image.shape[:2] != grey.shape:
        raise FundusDataError(
            f"{image_path} is {image.shape[1]}x{image.shape[0]} but its mask {mask_path} is "
            f"{grey.shape[1]}x{grey.shape[0]}"
        )
    info = {
        "orig_height": grey.shape[0],
        "orig_width": grey.shape[1],
        "mask_off_level_px": check_mask_encoding(grey, mask_path),
    }
    if mask_resample == "nearest":
        return resize_bilinear(image, size), resize_nearest(mask_to_classes(grey), size), info
    if mask_resample == "bilinear":
        # Fed-LWR's preproces_rif.py, line for line: the grey mask mapped to classes first, then the class
        # map and the image through cv2.resize, whose third positional argument is `dst`: INTER_LINEAR.
        labels = resize_linear_u8(fedlwr_code_mask_to_classes(grey), size, size)
        return resize_linear_u8(image, size, size), labels, info
    raise ValueError(f"mask_resample must be 'nearest' or 'bilinear', got {mask_resample!r}")


# ---------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------


def preprocess_fedlwr(
    raw_root: str | os.PathLike,
    store_dir: str | os.PathLike,
    *,
    mask_resample: str = "nearest",
    expect_real_counts: bool = False,
    size: int | None = None,
    log: Callable[[str], object] = print,
) -> dict[str, int]:
    """One store client per domain (official train then test images, each sorted by name).

    With ``expect_real_counts`` the per-domain train/test counts must be 50/51, 99/60, 320/80,
    320/80; a mismatch stops before any image is decoded. Returns the images per client.
    """
    size = DEFAULT_SIZE if size is None else size
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    raw_root = Path(raw_root)
    root = find_fundus_root(raw_root)
    listing = {(d, s): list_pairs(root, d, s, log) for d in DOMAINS for s in OFFICIAL_SPLITS}
    if expect_real_counts:
        problems = [
            f"{d}: train/test = {len(listing[d, 'train'])}/{len(listing[d, 'test'])}, expected {EXPECTED_COUNTS[d][0]}/{EXPECTED_COUNTS[d][1]}"
            for d in DOMAINS
            if (len(listing[d, "train"]), len(listing[d, "test"])) != EXPECTED_COUNTS[d]
        ]
        if problems:
            raise FundusDataError(
                f"the fundus data in {root} do not match the DoFE release used by Fed-LWR:\n  "
                + "\n  ".join(problems)
                + "\n(for other or synthetic data set expect_real_counts to false)"
            )
    counts: dict[str, int] = {}
    with staged_dir(store_dir) as tmp_store:
        for domain in DOMAINS:
            entries = [(s, *pair) for s in OFFICIAL_SPLITS for pair in listing[domain, s]]
            with ThreadPoolExecutor(_THREADS) as pool:
                loaded = list(pool.map(lambda e: load_pair(e[2], e[3], size, mask_resample), entries))
            meta = pd.DataFrame(
                [
                    {
                        "id": f"{domain}/{s}/{Path(name).stem}",
                        "group": group_of(domain, name),
                        "source": f"{ARCHIVE}/{img.relative_to(raw_root).as_posix()}",
                        "official_split": s,
                        "name": name,
                        "mask_source": f"{ARCHIVE}/{mask.relative_to(raw_root).as_posix()}",
                        **info,
                    }
                    for (s, name, img, mask), (_, _, info) in zip(entries, loaded)
                ]
            )
            images = np.stack([x for x, _, _ in loaded])
            labels = np.stack([y for _, y, _ in loaded])
            write_client(tmp_store, domain, images, labels, meta)
            counts[domain] = len(meta)
            n_train = int((meta["official_split"] == "train").sum())
            log(
                f"fundus {domain} ({DOMAIN_SOURCES[domain]}): {n_train} train + {len(meta) - n_train} test images "
                f"-> {size}x{size}, masks {mask_resample}"
            )
        info = {
            "family": "fundus",
            "classes": list(CLASSES),
            "label_encoding": "uint8 class map: 0 background, 1 rim (disc without cup), 2 cup; DoFE disc = label >= 1, cup = label == 2",
            "mask_thresholds": (
                "grey < 127 cup, < 254 rim, else background (Fed-LWR's 2 - uint8(grey/127)), on the original "
                "mask, before the class map is resized bilinearly"
                if mask_resample == "bilinear"
                else f"grey <= {CUP_MAX} cup, <= {BACKGROUND_ABOVE} rim, else background (DoFE)"
            ),
            "size": size,
            "image_resample": (
                "cv2.resize INTER_LINEAR, OpenCV's 8-bit fixed point (bit-exact)"
                if mask_resample == "bilinear"
                else "bilinear (OpenCV INTER_LINEAR semantics)"
            ),
            "mask_resample": mask_resample,
        }
        atomic_write_text(Path(tmp_store) / "info.json", json.dumps(info, indent=2) + "\n")
    return counts
