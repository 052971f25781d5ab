"""RIF retinal fundus (DoFE release), Fed-LWR protocol: optic disc rim / cup segmentation, 4 clients.

The release (one Google Drive zip, root folder ``Fundus/``) holds four domains::

    Fundus/Domain{1..4}/{train,test}/ROIs/image/<name>.png   RGB disc-centred crops
    Fundus/Domain{1..4}/{train,test}/ROIs/mask/<name>.png    grey: 0 = cup, 128 = rim, 255 = background

Domain1 = Drishti-GS (50/51 train/test), Domain2 = RIM-ONE r3 (99/60), Domain3 = REFUGE train
(320/80), Domain4 = REFUGE val (320/80). Clients are the domains; paper tables call them Site1..4.

Values between the three levels (anti-aliasing, resampling) are **thresholded**, never compared for
equality, with DoFE's class rule: grey <= 50 -> cup, 50 < grey <= 200 -> rim, grey > 200 ->
background, on any value including interpolated ones. Stored labels are
Fed-LWR's three disjoint classes, uint8 0 = background, 1 = rim, 2 = cup. That encoding is
lossless for the DoFE/FedDG disc-cup convention too: disc = label >= 1 (rim and cup), cup =
label == 2; ``disc_cup`` returns DoFE's two overlapping channels [cup, disc] from stored labels.

Resize to 384 x 384 (protocols ``fedlwr`` and ``fedlwr_bilinear_masks``):

* images: bilinear with OpenCV ``INTER_LINEAR`` semantics (half-pixel centres, 2 x 2 taps, no
  antialiasing), re-implemented in numpy (``resize_bilinear``), because that is what Fed-LWR's
  ``cv2.resize`` call does; results can differ from OpenCV by one grey level (OpenCV rounds its
  fixed-point weights);
* masks, ``fedlwr``: nearest neighbour on the class map (our choice: no new values are invented);
* masks, ``fedlwr_bilinear_masks``: the official code's behaviour. Its ``cv2.resize(mask, (384,
  384), cv2.INTER_CUBIC)`` passes INTER_CUBIC as ``dst``, so the grey mask is resized bilinearly,
  then mapped with ``2 - uint8(grey / 127)`` (grey < 127 -> cup, < 254 -> rim, else background).

File lists are sorted by name (the official loader's unsorted ``glob`` is filesystem-dependent).
Mask paths are built from path components, not by replacing the substring ``image`` (which breaks
DoFE's loader when the root path contains "image"). The official train folder is split 4:1 into
train/val per domain (first ``int(0.8 n)`` of a seeded permutation = train, as Fed-LWR's first
80 % of its list), the official test folder is the test split.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from .archive import write_zip_atomic
from .download import DownloadSpec
from .images import read_mask
from .store import atomic_write_text, client_rng, grouped_split, list_clients, open_client, staged_dir, write_client, write_split_csv

ARCHIVE = "Fundus.zip"
DRIVE_ID = "1p33nsWQaiZMAgsruDoJLyatoq5XAH-TH"
DOWNLOAD = DownloadSpec(
    name="fundus",
    url=f"gdrive:{DRIVE_ID}",
    filename=ARCHIVE,
    sha256=None,  # none published: pin the one logged at the first download
    licence=(
        "No licence stated by the DoFE release (https://github.com/emma-sjwang/Dofe). The images come from "
        "Drishti-GS, RIM-ONE r3 and REFUGE, each under its own terms (REFUGE requires registration with the "
        "challenge for its own downloads); cite those and DoFE (Wang et al., TMI 2020)."
    ),
    manual_step=(
        f"If Google Drive refuses the download (quota or virus-scan page), open "
        f"https://drive.google.com/file/d/{DRIVE_ID}/view (the link in the DoFE and Fed-LWR READMEs), download "
        "the zip by hand and set data.fundus.files.Fundus.zip.archive in config.yaml to its path."
    ),
    homepage="https://github.com/emma-sjwang/Dofe",
)
DOWNLOADS = [DOWNLOAD]

DOMAINS = ["Domain1", "Domain2", "Domain3", "Domain4"]
DOMAIN_SOURCES = {"Domain1": "Drishti-GS", "Domain2": "RIM-ONE r3", "Domain3": "REFUGE train", "Domain4": "REFUGE val"}
PROTOCOLS = {"fedlwr": DOMAINS, "fedlwr_bilinear_masks": DOMAINS}
MASK_RESAMPLE = {"fedlwr": "nearest", "fedlwr_bilinear_masks": "bilinear"}
EXPECTED_COUNTS = {"Domain1": (50, 51), "Domain2": (99, 60), "Domain3": (320, 80), "Domain4": (320, 80)}
# train/val/test of Fed-LWR (from the fork's log): int(0.8 n) of the official train folder.
FEDLWR_SPLIT_COUNTS = {"Domain1": (40, 10, 51), "Domain2": (79, 20, 60), "Domain3": (256, 64, 80), "Domain4": (256, 64, 80)}
TRAIN_FRACTION = 0.8
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


class FundusDataError(DataError):
    """The raw fundus data do not have the layout or content we expect."""


# ---------------------------------------------------------------------------
# Mask encodings
# ---------------------------------------------------------------------------


def mask_to_classes(grey: np.ndarray, cup_max: float = CUP_MAX, background_above: float = BACKGROUND_ABOVE) -> np.ndarray:
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


def list_pairs(root: str | os.PathLike, domain: str, split: str, log: Callable[[str], object] = print) -> list[tuple[str, Path, Path]]:
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
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert(mode), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise FundusDataError(f"{path}: cannot decode the image ({exc})") from exc


# Above this fraction of pixels off the three levels 0/128/255, a mask is not DoFE's grey encoding
# but e.g. a soft probability map. Real RIF masks have none; a mask drawn or resized with
# anti-aliasing has a band of them along the disc and cup edges (3-6 % on the 48 px synthetic twin,
# up to 13 % at 24 px, under 1 % at the real 384-800 px), which DoFE's thresholds classify.
# Documented in docs/data/fundus.md and docs/decisions.md.
MAX_OFF_LEVEL_FRACTION = 0.25


def check_mask_encoding(grey: np.ndarray, mask_path: Path) -> int:
    """Refuse masks that the grey-level rule would silently turn into nonsense, naming the file:
    class indices 0/1/2 (all "cup"), a mask without disc or without background, or one far from the
    three levels. Returns the number of off-level pixels."""
    if grey.max() <= 2 and len(np.unique(grey)) > 1:
        raise FundusDataError(f"{mask_path}: values {sorted(np.unique(grey).tolist())} look like class indices; expected DoFE's grey levels 0 (cup), 128 (rim), 255 (background)")
    if not (grey <= BACKGROUND_ABOVE).any():
        raise FundusDataError(f"{mask_path}: no optic disc (every pixel > {BACKGROUND_ABOVE:g}, i.e. background)")
    if not (grey > BACKGROUND_ABOVE).any():
        raise FundusDataError(f"{mask_path}: no background (no pixel > {BACKGROUND_ABOVE:g}); expected a disc-centred ROI")
    off_level = int((~np.isin(grey, (0, 128, 255))).sum())
    if off_level > MAX_OFF_LEVEL_FRACTION * grey.size:
        raise FundusDataError(f"{mask_path}: {off_level / grey.size:.1%} of pixels are not 0/128/255 (more than {MAX_OFF_LEVEL_FRACTION:.0%}); not a DoFE mask")
    return off_level


def load_pair(image_path: Path, mask_path: Path, size: int, mask_resample: str = "nearest") -> tuple[np.ndarray, np.ndarray, dict]:
    """One image (RGB, bilinear) and its class map (nearest, or Fed-LWR's bilinear + formula)."""
    # Masks through the shared reader: convert("L") would clip a 16-bit mask (rim 32896 -> 255).
    image, grey = _read(image_path, "RGB"), read_mask(mask_path, error=FundusDataError)
    if image.shape[:2] != grey.shape:
        raise FundusDataError(f"{image_path} is {image.shape[1]}x{image.shape[0]} but its mask {mask_path} is "
                              f"{grey.shape[1]}x{grey.shape[0]}")
    info = {"orig_height": grey.shape[0], "orig_width": grey.shape[1], "mask_off_level_px": check_mask_encoding(grey, mask_path)}
    if mask_resample == "nearest":
        labels = resize_nearest(mask_to_classes(grey), size)
    elif mask_resample == "bilinear":
        labels = fedlwr_code_mask_to_classes(resize_bilinear(grey, size))
    else:
        raise ValueError(f"mask_resample must be 'nearest' or 'bilinear', got {mask_resample!r}")
    return resize_bilinear(image, size), labels, info


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
                f"the fundus data in {root} do not match the DoFE release used by Fed-LWR:\n  " + "\n  ".join(problems)
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
            log(f"fundus {domain} ({DOMAIN_SOURCES[domain]}): {n_train} train + {len(meta) - n_train} test images "
                f"-> {size}x{size}, masks {mask_resample}")
        info = {
            "family": "fundus",
            "classes": list(CLASSES),
            "label_encoding": "uint8 class map: 0 background, 1 rim (disc without cup), 2 cup; DoFE disc = label >= 1, cup = label == 2",
            "mask_thresholds": (
                "grey < 127 cup, < 254 rim, else background (Fed-LWR's 2 - uint8(grey/127))"
                if mask_resample == "bilinear"
                else f"grey <= {CUP_MAX} cup, <= {BACKGROUND_ABOVE} rim, else background (DoFE)"
            ),
            "size": size,
            "image_resample": "bilinear (OpenCV INTER_LINEAR semantics)",
            "mask_resample": mask_resample,
        }
        atomic_write_text(Path(tmp_store) / "info.json", json.dumps(info, indent=2) + "\n")
    return counts


# ---------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------


def split_fedlwr(
    store_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    permutation: str = "seeded",
    seed: int = 0,
    train_fraction: float = TRAIN_FRACTION,
) -> pd.DataFrame:
    """Per domain: official train images -> train (first ``int(0.8 n)``) / val (rest), official test -> test.

    ``permutation="seeded"`` permutes the name-sorted train images with a generator seeded by
    (seed, crc32(domain)); ``"sorted"`` keeps name order (Fed-LWR's "first 80 % of the list" on a
    filesystem that lists names in order).
    """
    if permutation not in ("seeded", "sorted"):
        raise ValueError(f"permutation must be 'seeded' or 'sorted', got {permutation!r}")
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    present = list_clients(store_dir)
    missing = [d for d in DOMAINS if d not in present]
    if missing:
        raise FundusDataError(f"store {store_dir} lacks client(s) {missing} (found {present})")
    tables = []
    for domain in DOMAINS:
        meta = open_client(store_dir, domain).meta
        if "official_split" not in meta.columns:
            raise FundusDataError(f"store client {domain} has no 'official_split' column: rebuild the store")
        official = meta["official_split"].to_numpy()
        order = np.argsort(meta["name"].to_numpy(), kind="stable")
        train_rows = order[official[order] == "train"]
        test_rows = order[official[order] == "test"]
        if permutation == "seeded":
            # Whole patients to train or val (RIM-ONE has both eyes of a patient: G-1-L, G-1-R).
            rng = client_rng(seed, domain)
            groups = meta["group"].to_numpy(str)[train_rows]
            picked, names = grouped_split(groups, rng, lambda n: (int(n * train_fraction), n))
            by_split = np.argsort(names == "val", kind="stable")  # train rows first, then val
            train_rows, n_train = train_rows[picked[by_split]], int((names == "train").sum())
        else:
            n_train = int(len(train_rows) * train_fraction)
        if n_train == 0 or n_train == len(train_rows) or len(test_rows) == 0:
            raise FundusDataError(
                f"client {domain}: {len(train_rows)} train / {len(test_rows)} test images are too few for a "
                f"train/val/test split"
            )
        rows = np.concatenate([train_rows, test_rows]).astype(np.int64)
        names = ["train"] * n_train + ["val"] * (len(train_rows) - n_train) + ["test"] * len(test_rows)
        tables.append(pd.DataFrame({"client": domain, "split": names, "row": rows,
                                    "id": meta["id"].to_numpy()[rows], "group": meta["group"].to_numpy()[rows]}))
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table


# ---------------------------------------------------------------------------
# Synthetic twin
# ---------------------------------------------------------------------------

# Per-domain camera style: colour cast, gain, contrast, blur (px at the written size), noise, size factor.
_DOMAIN_STYLE = {
    "Domain1": dict(cast=(1.00, 0.85, 0.70), gain=1.00, contrast=1.00, blur=0.0, noise=3, scale=1.00),
    "Domain2": dict(cast=(0.85, 0.95, 0.95), gain=0.80, contrast=0.75, blur=1.0, noise=6, scale=1.25),
    "Domain3": dict(cast=(1.10, 0.80, 0.60), gain=1.15, contrast=1.20, blur=0.0, noise=2, scale=1.50),
    "Domain4": dict(cast=(0.95, 0.90, 1.00), gain=0.90, contrast=0.90, blur=0.6, noise=4, scale=1.50),
}


def _synthetic_names(domain: str, split: str, n: int) -> list[str]:
    offset = 0 if split == "train" else 500
    names = []
    for k in range(n):
        i = offset + k + 1
        if domain == "Domain1":
            names.append(f"{'gn'[k % 2]}drishtiGS_{i:03d}.png")
        elif domain == "Domain2":
            # the first two train images are the two eyes of one patient (one group)
            names.append(f"G-{offset + 1}-{'LR'[k]}.png" if split == "train" and k < 2 else f"{'GNS'[k % 3]}-{i}-L.png")
        elif domain == "Domain3":
            names.append(f"{'gn'[k % 2]}{i:04d}.png")
        else:
            names.append(f"V{i:04d}.png")
    return names


def _coverage(rng_center: tuple[float, float], radii: tuple[float, float], size: int, supersample: int = 4) -> np.ndarray:
    """Fraction of each pixel inside an ellipse (supersampled): anti-aliased edges."""
    s = supersample
    coords = (np.arange(size * s) + 0.5) / s
    y, x = np.meshgrid(coords, coords, indexing="ij")
    cy, cx = rng_center
    inside = ((y - cy) / radii[0]) ** 2 + ((x - cx) / radii[1]) ** 2 < 1.0
    return inside.reshape(size, s, size, s).mean(axis=(1, 3))


def _synthetic_pair(rng: np.random.Generator, domain: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image, ImageFilter

    st = _DOMAIN_STYLE[domain]
    center = (size / 2 + rng.uniform(-0.06, 0.06) * size, size / 2 + rng.uniform(-0.06, 0.06) * size)
    disc_r = (rng.uniform(0.26, 0.34) * size, rng.uniform(0.24, 0.32) * size)
    cup_ratio = rng.uniform(0.35, 0.7)  # glaucoma-like large cups and small ones
    cup_r = (disc_r[0] * cup_ratio, disc_r[1] * cup_ratio * rng.uniform(0.9, 1.1))
    disc = _coverage(center, disc_r, size)
    cup = np.minimum(_coverage(center, cup_r, size), disc)
    grey = 255.0 * (1 - disc) + 128.0 * (disc - cup)  # 255 bg, 128 rim, 0 cup, mixtures at edges
    mask = np.clip(np.floor(grey + 0.5), 0, 255).astype(np.uint8)

    y, x = np.mgrid[0:size, 0:size] / size
    base = np.stack([0.70 - 0.25 * ((y - 0.5) ** 2 + (x - 0.5) ** 2), 0.30 + 0.05 * x, 0.12 + 0.03 * y], -1)
    angle = np.arctan2(y - center[0] / size, x - center[1] / size)
    vessels = sum(np.exp(-((np.sin(angle - a) * 30) ** 2)) for a in rng.uniform(0, 2 * np.pi, 4))
    base = base * (1 - 0.35 * np.clip(vessels, 0, 1)[..., None] * (1 - cup[..., None]))
    image = base * (1 - disc[..., None]) + np.asarray([0.95, 0.80, 0.45]) * (disc - cup)[..., None] + np.asarray(
        [1.0, 0.95, 0.80]) * cup[..., None]
    image = image * 255.0 * (1 + 0.05 * rng.standard_normal(3))
    image = (image - image.mean()) * st["contrast"] + image.mean()
    image = image * np.asarray(st["cast"]) * st["gain"]
    out = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB")
    if st["blur"]:
        out = out.filter(ImageFilter.GaussianBlur(st["blur"]))
    arr = np.asarray(out, float) + st["noise"] * rng.standard_normal((size, size, 3))
    return np.clip(arr, 0, 255).astype(np.uint8), mask


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def write_synthetic(out_dir: str | os.PathLike, seed: int = 0, *, train_per_domain: int = 6, test_per_domain: int = 3,
                    size: int = 48) -> dict:
    """Write a small ``Fundus.zip`` in the DoFE layout (``Fundus/Domain{1..4}/{train,test}/ROIs/{image,mask}``).

    Real-style names per domain (``gdrishtiGS_001.png``, ``G-1-L.png``, ``g0001.png``, ``V0001.png``),
    RGB images with a per-domain colour cast, brightness, contrast, blur and noise, and a size that
    differs per domain (``size`` x 1, 1.25, 1.5, 1.5), grey masks 255 / 128 / 0 with anti-aliased
    edges. Returns the names per domain and split.
    """
    if train_per_domain < 2 or test_per_domain < 1 or size < 16:
        raise ValueError(f"need train_per_domain >= 2, test_per_domain >= 1, size >= 16; got "
                         f"{train_per_domain}, {test_per_domain}, {size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    members: list[tuple[str, bytes]] = [("Fundus/", b"")]
    info: dict[str, dict] = {}
    for d_index, domain in enumerate(DOMAINS):
        side = int(round(size * _DOMAIN_STYLE[domain]["scale"]))
        info[domain] = {"size": side}
        for s_index, (split, n) in enumerate((("train", train_per_domain), ("test", test_per_domain))):
            names = _synthetic_names(domain, split, n)
            info[domain][split] = names
            for k, name in enumerate(names):
                rng = np.random.default_rng([int(seed), d_index, s_index, k])
                image, mask = _synthetic_pair(rng, domain, side)
                base = f"Fundus/{domain}/{split}/ROIs"
                members += [(f"{base}/image/{name}", _png(image)), (f"{base}/mask/{name}", _png(mask))]
    path = out_dir / ARCHIVE
    write_zip_atomic(path, members)
    return info


# ---------------------------------------------------------------------------
# Family interface
# ---------------------------------------------------------------------------


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"fundus: unknown protocol {protocol!r}; known: {sorted(PROTOCOLS)}")


def preprocess(raw: dict, store_dir, protocol: str, *, expect_real_counts: bool = False, size: int | None = None,
               log=print) -> dict:
    """``fedlwr``: nearest-neighbour masks; ``fedlwr_bilinear_masks``: the official bilinear masks."""
    _check_protocol(protocol)
    if ARCHIVE not in raw:
        raise FundusDataError(f"raw input {ARCHIVE!r} not given (got {sorted(raw)})")
    return preprocess_fedlwr(Path(raw[ARCHIVE]), Path(store_dir), mask_resample=MASK_RESAMPLE[protocol],
                             expect_real_counts=expect_real_counts, size=size, log=log)


def split(store_dir, out_csv, protocol: str, *, permutation: str = "default", seed: int = 0) -> pd.DataFrame:
    """``permutation``: ``seeded`` (= ``default``) or ``sorted`` (name order, no shuffle)."""
    _check_protocol(protocol)
    permutation = "seeded" if permutation == "default" else permutation
    return split_fedlwr(Path(store_dir), Path(out_csv), permutation=permutation, seed=seed)
