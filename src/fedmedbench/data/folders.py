"""Your own multi-site data on a local disk (family ``folders``): one client per site, no download.

Segmentation layout (``kind: segmentation``)::

    <root>/<site>/images/<stem>.<ext>    PNG, JPEG, BMP or TIFF images, or NIfTI volumes (.nii, .nii.gz)
    <root>/<site>/masks/<stem>.<ext>     the mask of the image with the same stem (any supported suffix)

Every non-hidden sub-folder of ``root`` is a site (``__MACOSX`` and names starting with ``.`` are
skipped). Masks are read with the project's one mask reader (``images.read_mask``: real bit depth,
never clipped) or, for NIfTI, with SimpleITK, then every pixel value is mapped to a class index with
``mask_values`` (its class indices must be exactly 0 .. n-1, no gaps); a value that is not in it
stops preprocessing, naming the value and the file. Without ``mask_values`` the masks must already hold class indices ``0 .. num_classes - 1``
(``num_classes``: the number of ``classes``, or 2). A NIfTI volume is cut into 2-D slices along
``nifti_axis`` (NIfTI voxel axes: 0 = i, 1 = j, 2 = k, usually axial; every slice is kept, empty
ones too) and its slices are one group, so a volume never spans two splits; ``stack: 3`` gives each
slice its neighbours as channels [i-1, i, i+1] (2.5-D, edge slices repeated). A NIfTI mask must
lie on its image's voxel grid (direction, origin and spacing, within 1e-3), not only have its shape.
The log gives each site's native slice size (H x W) and warns when a site's aspect ratio is far from
the others' (a wrong ``nifti_axis`` shows there).

Classification layout (``kind: classification``)::

    <root>/labels.csv                     columns site, image, label and optionally group (e.g. patient)
    <root>/<the path in the image column>

``label`` is one of ``classes`` (or its index); images without a ``group`` are their own group.
An image file under ``root`` that ``labels.csv`` does not list is an error (nothing is skipped).

Images become uint8 H x W x 3: 8-bit grey is replicated to three channels, colour keeps R, G, B
(alpha dropped); 16-bit, 32-bit and float images (and NIfTI volumes, per volume) are scaled
from their own 0.5th .. 99.5th percentile to 0 .. 255 and clipped outside (one hot pixel cannot
darken the rest), and the range is kept in the store's ``meta.csv`` (columns ``intensity``,
``intensity_low``, ``intensity_high``; ``native_height``, ``native_width``: the size before any
resize) and summarised per site in the log. All images must have one size unless ``image_size``
is set (then every image is resized to a square: bilinear images, nearest-neighbour masks). One
site's images must all be grey or all colour.

``split`` cuts each site's groups (image stem, NIfTI volume, classification ``group``) into
train/val/test with ``fractions`` (val and test get ``max(1, round(f * groups))`` groups, train the
rest) from a seeded permutation, or follows ``split_csv``: a CSV with columns site, image, split
that must name every image of the store exactly once (``image``: the path relative to ``root`` as in
the store's ``source`` column, or relative to the site folder).

Bad data stop with one ``FoldersDataError`` naming the file or site; the store (or split file) is
only renamed into place once everything has been read, so nothing half-written is left behind.
``write_example`` writes a small deterministic three-site dataset in these layouts.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError, DataError, closest, unknown_key
from .images import deep_rawmode, read_mask
from .store import (
    SPLITS,
    atomic_write_text,
    client_rng,
    grouped_split,
    list_clients,
    open_client,
    split_groups,
    staged_dir,
    write_client,
    write_split_csv,
)

__all__ = [
    "DOWNLOADS",
    "PROTOCOLS",
    "FoldersDataError",
    "FoldersOptions",
    "discover_sites",
    "preprocess",
    "split",
    "write_example",
    "read_image",
]

DOWNLOADS: list = []  # the data are already on the user's disk
PROTOCOLS: dict[str, list[str]] = {}  # the sites are found on disk (discover_sites), not fixed by a paper

KINDS = ("segmentation", "classification")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
NIFTI_SUFFIXES = (".nii.gz", ".nii")
LABELS_FILE = "labels.csv"
LABEL_COLUMNS = ("site", "image", "label")
OPTIONAL_LABEL_COLUMNS = ("group",)
SPLIT_CSV_COLUMNS = ("site", "image", "split")
DEFAULT_FRACTIONS = (0.6, 0.2, 0.2)
_IGNORED_FILES = {"thumbs.db", "desktop.ini"}  # written by file browsers, never data
_SEGMENTATION_ONLY = ("mask_values", "nifti_axis", "stack")
_THREADS = max(1, min(8, os.cpu_count() or 1))
# Per-row columns of meta.csv besides the ids: how the intensities were scaled (see _to_uint8) and
# the native size of the image or NIfTI slice before any resize (the log summarises both per site).
META_DETAILS = ("intensity", "intensity_low", "intensity_high", "native_height", "native_width")


class FoldersDataError(DataError):
    """The user's own data do not have the layout or content we expect."""


# ---------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class FoldersOptions:
    """What the user says about their data (``data.folders`` in the config); see the module docstring."""

    root: str
    kind: str = "segmentation"
    mask_values: dict[int, int] | None = None  # None: masks hold class indices 0 .. num_classes - 1
    classes: tuple[str, ...] | None = None  # required for classification
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
    split_csv: str | None = None
    seed: int = 0
    nifti_axis: int = 2
    stack: int = 1
    image_size: int | None = None

    @property
    def num_classes(self) -> int:
        if self.classes is not None:
            return len(self.classes)
        if self.mask_values:
            return max(self.mask_values.values()) + 1
        return 2

    @property
    def class_of_value(self) -> dict[int, int]:
        """The mask value -> class index map in effect (identity on 0 .. num_classes - 1 by default)."""
        if self.mask_values is not None:
            return dict(self.mask_values)
        return {v: v for v in range(self.num_classes)}

    @classmethod
    def from_dict(cls, d: Mapping | FoldersOptions, where: str = "folders") -> FoldersOptions:
        """Options from a config mapping: unknown keys (with the closest spelling), types and ranges
        are checked here, each failure one ``ConfigError`` naming ``where.<key>``."""
        if isinstance(d, FoldersOptions):
            return d
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: expected a mapping of options, got {type(d).__name__}")
        valid = [f.name for f in fields(cls)]
        for key in d:
            if key not in valid:
                raise unknown_key(where, str(key), valid)

        def bad(key: str, expected: str) -> ConfigError:
            return ConfigError(f"{where}.{key}: expected {expected}, got {d[key]!r}")

        if "root" not in d:
            raise ConfigError(f"{where}: 'root' is required (the folder holding the site folders or labels.csv)")
        root = d["root"]
        if not isinstance(root, (str, os.PathLike)) or not os.fspath(root):
            raise bad("root", "a folder path")
        kind = d.get("kind", "segmentation")
        if kind not in KINDS:
            raise ConfigError(f"{where}.kind: {kind!r} is not one of {list(KINDS)}{closest(str(kind), KINDS)}")
        if kind == "classification":
            for key in _SEGMENTATION_ONLY:
                if key in d:
                    raise ConfigError(f"{where}.{key}: only for kind segmentation (kind is classification)")

        classes = d.get("classes")
        if classes is not None:
            if (
                not isinstance(classes, (list, tuple))
                or len(classes) < 2
                or not all(isinstance(c, str) and c.strip() for c in classes)
            ):
                raise bad("classes", "a list of at least two class names")
            if len(set(classes)) != len(classes):
                raise bad("classes", "distinct class names")
            classes = tuple(classes)
        elif kind == "classification":
            raise ConfigError(f"{where}.classes: required for kind classification (the names the labels use)")

        mask_values = d.get("mask_values")
        if mask_values is not None:
            if not isinstance(mask_values, Mapping) or not mask_values:
                raise bad("mask_values", "a mapping {pixel value: class index}")
            parsed = {}
            for value, index in mask_values.items():
                # JSON keys are strings: "255" is accepted as 255.
                key = int(value) if isinstance(value, str) and value.strip().isdigit() else value
                if not _is_int(key) or key < 0:
                    raise ConfigError(f"{where}.mask_values: key {value!r} is not a non-negative integer pixel value")
                if not _is_int(index) or not 0 <= index <= 255:
                    raise ConfigError(f"{where}.mask_values: class index {index!r} of pixel value {value!r} "
                                      "must be an integer 0..255")
                parsed[int(key)] = int(index)
            if classes is not None and max(parsed.values()) >= len(classes):
                raise ConfigError(f"{where}.mask_values: class index {max(parsed.values())} is out of range for "
                                  f"{len(classes)} classes {list(classes)}")
            # Class indices are the model's outputs 0 .. n-1: a gap is a class no pixel can have (an
            # output trained only towards 0, a per-class score of nothing), usually a typo.
            n_classes = len(classes) if classes is not None else max(parsed.values()) + 1
            unused = sorted(set(range(n_classes)) - set(parsed.values()))
            if unused:
                name = f" ({classes[unused[0]]!r} of classes {list(classes)})" if classes is not None else ""
                raise ConfigError(f"{where}.mask_values: no pixel value maps to class index {unused[0]}{name}; the class "
                                  f"indices must be exactly 0 .. {n_classes - 1} without gaps, got {dict(sorted(parsed.items()))}")
            mask_values = parsed

        fractions = d.get("fractions", DEFAULT_FRACTIONS)
        if (
            not isinstance(fractions, (list, tuple))
            or len(fractions) != 3
            or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in fractions)
            or abs(sum(fractions) - 1) > 1e-6
        ):
            raise bad("fractions", "three positive numbers train, val, test summing to 1")
        split_csv = d.get("split_csv")
        if split_csv is not None and (not isinstance(split_csv, (str, os.PathLike)) or not os.fspath(split_csv)):
            raise bad("split_csv", "a CSV file path or null")
        seed = d.get("seed", 0)
        if not _is_int(seed) or seed < 0:
            raise bad("seed", "a non-negative integer")
        nifti_axis = d.get("nifti_axis", 2)
        if not _is_int(nifti_axis) or nifti_axis not in (0, 1, 2):
            raise bad("nifti_axis", "0, 1 or 2 (the NIfTI voxel axis i, j or k to slice along)")
        stack = d.get("stack", 1)
        if not _is_int(stack) or stack not in (1, 3):
            raise bad("stack", "1 (one slice, replicated to 3 channels) or 3 (slices i-1, i, i+1)")
        image_size = d.get("image_size")
        if image_size is not None and (not _is_int(image_size) or image_size < 1):
            raise bad("image_size", "a positive integer or null")
        return cls(
            root=os.fspath(root), kind=kind, mask_values=mask_values, classes=classes,
            fractions=tuple(float(f) for f in fractions), split_csv=None if split_csv is None else os.fspath(split_csv),
            seed=int(seed), nifti_axis=int(nifti_axis), stack=int(stack),
            image_size=None if image_size is None else int(image_size),
        )


# ---------------------------------------------------------------------------
# Finding the files
# ---------------------------------------------------------------------------


def _check_root(root: str | os.PathLike) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise FoldersDataError(f"{root}: the data root does not exist or is not a folder")
    return root


def _check_site_name(site: str, where: str) -> None:
    if not site or site in (".", "..") or site.startswith(".") or "/" in site or "\\" in site:
        raise FoldersDataError(f"{where}: site name {site!r} must be a plain folder name (no '/', not starting with '.')")


def _stem_and_format(path: Path) -> tuple[str, str] | None:
    """(stem, "nifti" | "image") of a supported file name, else None."""
    name = path.name.lower()
    for suffix in NIFTI_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return path.name[: -len(suffix)], "nifti"
    if path.suffix.lower() in IMAGE_SUFFIXES and path.stem:
        return path.stem, "image"
    return None


def _files_by_stem(folder: Path) -> dict[str, Path]:
    """The supported files of one images/ or masks/ folder by stem; anything else is an error, so no
    file the user meant as data is skipped silently."""
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name.lower() in _IGNORED_FILES:
            continue  # .DS_Store, macOS ._ files, Thumbs.db
        parsed = _stem_and_format(path) if path.is_file() else None
        if parsed is None:
            raise FoldersDataError(f"{path}: not a supported file (expected {', '.join(IMAGE_SUFFIXES + NIFTI_SUFFIXES)})")
        stem = parsed[0]
        if stem in found:
            raise FoldersDataError(f"{path}: two files with the stem {stem!r} ({found[stem].name} and {path.name})")
        found[stem] = path
    return found


def discover_sites(root: str | os.PathLike, kind: str | None = None) -> list[str]:
    """Sorted site names: the site folders (segmentation) or the ``site`` column of ``labels.csv``
    (classification; ``kind=None``: classification when ``<root>/labels.csv`` exists). Cheap: only
    folder names and the CSV are read."""
    root = _check_root(root)
    if kind is None:
        kind = "classification" if (root / LABELS_FILE).is_file() else "segmentation"
    if kind == "classification":
        return sorted(set(_read_labels_csv(root)["site"]))
    if kind != "segmentation":
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    sites = []
    for path in sorted(root.iterdir()):
        if not path.is_dir() or path.name.startswith(".") or path.name == "__MACOSX":
            continue
        # Every folder is a site: a folder without images/ (a typo such as Images/) is an error, not skipped.
        if not (path / "images").is_dir():
            raise FoldersDataError(f"{path}: site folder without an images/ folder (expected {path}/images/ and "
                                   f"{path}/masks/; start the folder name with '.' to skip it)")
        sites.append(path.name)
    if not sites:
        raise FoldersDataError(f"{root}: no site folders (expected <root>/<site>/images/ and <root>/<site>/masks/)")
    return sites


def _header_size(path: Path, nifti_axis: int) -> tuple[int, int]:
    """(H, W) of a 2-D image or of a NIfTI volume's slices along ``nifti_axis``, from the header only."""
    if _stem_and_format(path)[1] == "nifti":
        import SimpleITK as sitk

        reader = sitk.ImageFileReader()
        reader.SetFileName(str(path))
        reader.ReadImageInformation()
        i, j, k = reader.GetSize()
        shape = [k, j, i]  # array order, as _read_volume slices it
        del shape[2 - nifti_axis]
        return shape[0], shape[1]
    from PIL import Image

    with Image.open(path) as img:  # lazy: reads the header, decodes no pixel
        return img.height, img.width


def native_size(options: Mapping | FoldersOptions) -> tuple[int, int, Path] | None:
    """(H, W, file) of the first image of the data (the first site's first pair, or labels.csv's
    first row), from its header: cheap enough for DAG time, where a model's size limits are checked
    when ``image_size`` is not set (preprocessing then requires one size for all images). None when
    the layout or the header cannot be read: preprocessing names that problem in its own words."""
    options = FoldersOptions.from_dict(options)
    try:
        root = _check_root(options.root)
        if options.kind == "classification":
            path = root / os.path.normpath(_read_labels_csv(root)["image"].iloc[0])
        else:
            path = list_pairs(root, discover_sites(root, "segmentation")[0])[0][1]
        return (*_header_size(path, options.nifti_axis), path)
    except Exception:  # noqa: BLE001 (any reader error: a hint is skipped, preprocessing reports the error)
        return None


def list_pairs(root: Path, site: str) -> list[tuple[str, Path, Path, str]]:
    """``(stem, image, mask, format)`` of one site, sorted by stem; every image needs its mask and
    every mask its image."""
    image_dir, mask_dir = root / site / "images", root / site / "masks"
    if not mask_dir.is_dir():
        raise FoldersDataError(f"{mask_dir} does not exist (site {site} needs images/ and masks/)")
    images, masks = _files_by_stem(image_dir), _files_by_stem(mask_dir)
    if not images:
        raise FoldersDataError(f"{image_dir}: no images in site {site}")
    for stem, path in images.items():
        if stem not in masks:
            raise FoldersDataError(f"{path}: image without a mask (expected {mask_dir}/{stem}.<ext>)")
    for stem, path in masks.items():
        if stem not in images:
            raise FoldersDataError(f"{path}: mask without an image (expected {image_dir}/{stem}.<ext>)")
    pairs = []
    for stem in sorted(images):
        kind_i, kind_m = _stem_and_format(images[stem])[1], _stem_and_format(masks[stem])[1]
        if kind_i != kind_m:
            raise FoldersDataError(f"{masks[stem]}: a {kind_m} mask for the {kind_i} image {images[stem].name}; "
                                   "NIfTI volumes need NIfTI masks, 2-D images 2-D masks")
        pairs.append((stem, images[stem], masks[stem], kind_i))
    return pairs


def _line(index: int) -> int:
    return index + 2  # header is line 1


def _read_labels_csv(root: Path) -> pd.DataFrame:
    """``labels.csv`` checked row by row (columns, empty values, site names, duplicates); paths as written."""
    path = root / LABELS_FILE
    if not path.is_file():
        raise FoldersDataError(f"{path} does not exist (kind classification needs it, with columns site, image, label)")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise FoldersDataError(f"{path}: not a readable CSV ({str(exc).strip()})") from exc
    table.columns = [str(c).strip() for c in table.columns]
    known = LABEL_COLUMNS + OPTIONAL_LABEL_COLUMNS
    for column in table.columns:
        if column not in known:
            raise FoldersDataError(f"{path}: unknown column {column!r}{closest(column, known)}; "
                                   f"expected site, image, label and optionally group")
    missing = [c for c in LABEL_COLUMNS if c not in table.columns]
    if missing:
        raise FoldersDataError(f"{path}: missing column(s) {missing}; expected site, image, label and optionally group")
    if table.empty:
        raise FoldersDataError(f"{path}: no rows")
    for column in table.columns:
        table[column] = table[column].str.strip()
        empty = np.flatnonzero(table[column].to_numpy() == "")
        if len(empty) and column != "group":  # an empty group: the image is its own group
            raise FoldersDataError(f"{path} line {_line(empty[0])}: empty {column}")
    for i, site in enumerate(table["site"]):
        _check_site_name(site, f"{path} line {_line(i)}")
    table["image"] = table["image"].str.replace("\\", "/", regex=False)
    duplicated = np.flatnonzero(table["image"].duplicated().to_numpy())
    if len(duplicated):
        i = duplicated[0]
        first = int(np.flatnonzero(table["image"].to_numpy() == table["image"].iloc[i])[0])
        raise FoldersDataError(f"{path} line {_line(i)}: image {table['image'].iloc[i]} is listed twice "
                               f"(lines {_line(first)} and {_line(i)})")
    return table


# ---------------------------------------------------------------------------
# Reading images, masks and volumes
# ---------------------------------------------------------------------------


# Images deeper than 8 bits are scaled from these percentiles of their own pixels (per image, per
# NIfTI volume) and clipped outside them: one hot pixel at 65535 must not turn the rest of a 12-bit
# image black, as a min .. max scaling did (docs/decisions.md).
ROBUST_PERCENTILES = (0.5, 99.5)


def _to_uint8(array: np.ndarray, path: Path) -> tuple[np.ndarray, dict]:
    """uint8 pixels and how they were obtained (the store's ``intensity`` columns): 8-bit as stored,
    anything deeper scaled from its 0.5th .. 99.5th percentile to 0 .. 255 and clipped outside (a
    fixed 0..65535 range would turn a 12-bit image nearly black, its min .. max would let one hot
    pixel do the same). A nearly constant image whose percentiles coincide falls back to min .. max."""
    if array.dtype == np.uint8:
        return array, {"intensity": "uint8", "intensity_low": np.nan, "intensity_high": np.nan}
    if array.dtype == bool:
        return array.astype(np.uint8) * 255, {"intensity": "bool", "intensity_low": 0.0, "intensity_high": 1.0}
    if array.dtype.kind not in "iuf":
        raise FoldersDataError(f"{path}: unsupported pixel type {array.dtype}")
    values = array.astype(np.float64)
    if not np.isfinite(values).all():
        raise FoldersDataError(f"{path}: the image holds NaN or infinite values")
    real_low, real_high = float(values.min()), float(values.max())
    low, high = (float(v) for v in np.percentile(values, ROBUST_PERCENTILES))
    how = f"p{ROBUST_PERCENTILES[0]:g}..p{ROBUST_PERCENTILES[1]:g}"
    if high <= low:
        low, high, how = real_low, real_high, "min..max"
    if high <= low:
        note = f"{array.dtype} constant {low:g}"
        return np.zeros(array.shape, np.uint8), {"intensity": note, "intensity_low": low, "intensity_high": high}
    scaled = np.floor((np.clip(values, low, high) - low) / (high - low) * 255 + 0.5).astype(np.uint8)
    note = f"{array.dtype} {low:g}..{high:g} ({how} of {real_low:g}..{real_high:g}) scaled to 0..255, clipped outside"
    return scaled, {"intensity": note, "intensity_low": low, "intensity_high": high}


def _decode(path: Path) -> np.ndarray:
    """The pixels of a 2-D image file at their real bit depth: H x W, or H x W x C (C = 2, 3 or 4)."""
    from PIL import Image, UnidentifiedImageError

    errors = []
    if path.suffix.lower() in (".tif", ".tiff"):
        # tifffile reads 16-bit colour and float TIFFs that Pillow cannot (or reads truncated to 8 bits).
        try:
            import tifffile

            array = np.asarray(tifffile.imread(path))
            if array.ndim == 3 and array.shape[0] in (3, 4) and array.shape[-1] not in (3, 4):
                array = np.moveaxis(array, 0, -1)  # planar configuration
            return array
        except Exception as exc:  # tifffile raises many types (codec missing, bad tags, truncated strips)
            errors.append(f"tifffile: {exc}")
    try:
        with Image.open(path) as img:
            deep = deep_rawmode(img)
            img.load()
            mode = img.mode
            if deep and mode in ("L", "LA", "RGB", "RGBA"):
                # Pillow has kept only the high byte of each 16-bit sample: refuse rather than lose bits.
                raise FoldersDataError(f"{path}: {deep} samples, which Pillow reads as 8-bit; save it as 8-bit "
                                       "or as a TIFF")
            if mode in ("P", "PA"):
                img = img.convert("RGBA")  # the palette colours, exactly
            elif mode in ("CMYK", "YCbCr", "LAB", "HSV"):
                img = img.convert("RGB")
            elif mode not in ("1", "L", "LA", "RGB", "RGBA", "I", "F") and not mode.startswith("I;16"):
                raise FoldersDataError(f"{path}: unsupported Pillow mode {mode}")
            return np.asarray(img)
    except FoldersDataError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        errors.append(f"{exc}" if not errors else f"Pillow: {exc}")
    raise FoldersDataError(f"{path}: cannot read the image ({'; '.join(errors)})")


def read_image(path: str | os.PathLike) -> tuple[np.ndarray, int, dict]:
    """A 2-D image as (uint8 H x W x 3, its colour channels: 1 grey or 3 colour, its scaling: the
    store's ``intensity`` columns, see ``_to_uint8``)."""
    path = Path(path)
    array = _decode(path)
    if array.ndim == 3 and array.shape[-1] in (1, 2):
        array = array[..., 0]  # grey (+ alpha)
    if array.ndim == 3 and array.shape[-1] in (3, 4):
        channels, array = 3, array[..., :3]  # alpha dropped
    elif array.ndim == 2:
        channels = 1
    else:
        raise FoldersDataError(f"{path}: expected a grey or colour 2-D image, got array shape {array.shape}")
    pixels, scaling = _to_uint8(array, path)
    if channels == 1:
        pixels = np.repeat(pixels[..., None], 3, axis=-1)
    return np.ascontiguousarray(pixels), channels, scaling


def _map_mask(values: np.ndarray, mapping: dict[int, int], path: Path) -> np.ndarray:
    """Pixel values -> uint8 class indices; a value missing from ``mapping`` is an error naming it and
    the file (a JPEG mask or an anti-aliased edge shows up here instead of becoming a wrong class)."""
    found, inverse = np.unique(values, return_inverse=True)
    missing = [v for v in found.tolist() if v not in mapping]
    if missing:
        shown = ", ".join(f"{v:g}" for v in missing[:6]) + (f", ... ({len(missing)} values)" if len(missing) > 6 else "")
        hint = "; JPEG compression changes mask values: save masks as PNG" if path.suffix.lower() in (".jpg", ".jpeg") else ""
        raise FoldersDataError(f"{path}: mask value(s) {shown} not in mask_values {dict(sorted(mapping.items()))} "
                               f"(map every pixel value of the masks to a class index, e.g. {{0: 0, 255: 1}}){hint}")
    lut = np.array([mapping[v] for v in found.tolist()], np.uint8)
    return lut[inverse].reshape(values.shape)


# A NIfTI mask must lie on its image's voxel grid. Headers store spacing and the affine as float32
# and converters round them differently, so equal means: direction cosines within 1e-3, spacings
# within 1e-3 relative, origins within 1e-3 of a voxel.
GEOMETRY_TOLERANCE = 1e-3


def _read_volume(path: Path, nifti_axis: int) -> tuple[np.ndarray, dict]:
    """A NIfTI volume as (slices, H, W) along the NIfTI voxel axis ``nifti_axis``, in its own dtype,
    and its geometry (SimpleITK's direction, origin and spacing, in (i, j, k) order)."""
    import SimpleITK as sitk  # imported here: only preprocessing needs it

    from .nifti import check_nifti_complete

    check_nifti_complete(path, FoldersDataError)  # SimpleITK reads a cut-short .nii.gz as zeros without complaint
    try:
        image = sitk.ReadImage(str(path))
        array = sitk.GetArrayFromImage(image)
    except RuntimeError as exc:
        raise FoldersDataError(f"{path}: cannot read as NIfTI ({str(exc).strip().splitlines()[-1]})") from exc
    if array.ndim != 3:
        raise FoldersDataError(f"{path}: expected a 3-D volume, got array shape {array.shape}")
    geometry = {"direction": image.GetDirection(), "origin": image.GetOrigin(), "spacing": image.GetSpacing()}
    # SimpleITK's array order is (k, j, i): NIfTI axis a is array axis 2 - a.
    return np.moveaxis(array, 2 - nifti_axis, 0), geometry


def _geometry_difference(image: dict, mask: dict) -> str | None:
    """What differs between an image's and its mask's voxel grid (None: the same grid, within
    ``GEOMETRY_TOLERANCE``)."""
    a, b = np.asarray(image["spacing"], np.float64), np.asarray(mask["spacing"], np.float64)
    checks = {
        "direction": GEOMETRY_TOLERANCE,
        "spacing": GEOMETRY_TOLERANCE * np.maximum(np.abs(a), np.abs(b)),
        "origin": GEOMETRY_TOLERANCE * float(np.max(np.abs(a))),
    }
    for key, tolerance in checks.items():
        x, y = np.asarray(image[key], np.float64), np.asarray(mask[key], np.float64)
        if x.shape != y.shape or (np.abs(x - y) > tolerance).any():
            shown = [", ".join(f"{v:.6g}" for v in values) for values in (x, y)]
            return f"{key} ({shown[0]}) vs ({shown[1]})"
    return None


def _volume_samples(image_path: Path, mask_path: Path, options: FoldersOptions) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    """One (image H x W x 3, class map, meta) per slice of a volume pair."""
    (volume, grid), (mask, mask_grid) = _read_volume(image_path, options.nifti_axis), _read_volume(mask_path, options.nifti_axis)
    if volume.shape != mask.shape:
        raise FoldersDataError(f"{image_path} has shape {volume.shape} (slices, H, W) but its mask {mask_path} "
                               f"has {mask.shape}")
    # Same array shape is not enough: a mask written with a flipped direction would be scored in
    # another orientation. Refused, not resampled (docs/decisions.md).
    differs = _geometry_difference(grid, mask_grid)
    if differs is not None:
        raise FoldersDataError(f"{image_path} and its mask {mask_path} are not on one voxel grid: {differs} "
                               "(image vs mask); resample the mask onto its image (nearest neighbour) or fix its header")
    if mask.dtype.kind == "f" and (not np.isfinite(mask).all() or not np.array_equal(mask, np.round(mask))):
        raise FoldersDataError(f"{mask_path}: a mask must hold integer values; found non-integer {mask.dtype} values")
    classes = _map_mask(mask.astype(np.int64), options.class_of_value, mask_path)
    norm, scaling = _to_uint8(volume, image_path)  # one intensity range per volume: slices stay comparable
    last = volume.shape[0] - 1
    native = {"native_height": volume.shape[1], "native_width": volume.shape[2]}
    samples = []
    for i in range(volume.shape[0]):
        picks = (max(i - 1, 0), i, min(i + 1, last)) if options.stack == 3 else (i, i, i)
        samples.append((np.stack([norm[j] for j in picks], axis=-1), classes[i], {"slice": i, **scaling, **native}))
    return samples


def _image_samples(image_path: Path, mask_path: Path, options: FoldersOptions) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    image, channels, scaling = read_image(image_path)
    grey = read_mask(mask_path, error=FoldersDataError)
    if grey.shape != image.shape[:2]:
        raise FoldersDataError(f"{image_path} is {image.shape[1]}x{image.shape[0]} but its mask {mask_path} is "
                               f"{grey.shape[1]}x{grey.shape[0]}")
    info = {"slice": -1, **scaling, "native_height": image.shape[0], "native_width": image.shape[1], "channels": channels}
    return [(image, _map_mask(grey, options.class_of_value, mask_path), info)]


def _resize(image: np.ndarray, mask: np.ndarray | None, size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Square resize: bilinear (with Pillow's antialiasing when shrinking) images, nearest masks (no new classes)."""
    from PIL import Image

    if image.shape[:2] == (size, size):
        return image, mask
    image = np.asarray(Image.fromarray(image, "RGB").resize((size, size), Image.Resampling.BILINEAR))
    if mask is not None:
        mask = np.asarray(Image.fromarray(mask, "L").resize((size, size), Image.Resampling.NEAREST))
    return image, mask


class _SizeCheck:
    """All images must share one size unless they are resized: remembers the first one seen."""

    def __init__(self, image_size: int | None):
        self.image_size, self.first = image_size, None

    def __call__(self, image: np.ndarray, path: Path) -> None:
        if self.image_size is not None:
            return
        if self.first is None:
            self.first = (image.shape[:2], path)
        elif image.shape[:2] != self.first[0]:
            (h, w), first = self.first
            raise FoldersDataError(f"{path}: {image.shape[1]}x{image.shape[0]} differs from {w}x{h} of {first}; "
                                   "set image_size to resize every image to one square size")


def _check_channels(site: str, loaded: list[tuple[Path, int]]) -> None:
    kinds = {c: p for p, c in reversed(loaded)}  # the first file of each channel count
    if len(kinds) > 1:
        raise FoldersDataError(f"site {site}: mixed channel counts: {kinds[1]} is grey but {kinds[3]} is colour; "
                               "convert the site's images to one kind")


def _pool_map(fn, items: list) -> list:
    with ThreadPoolExecutor(_THREADS) as pool:  # Pillow and zlib release the GIL while decoding
        return list(pool.map(fn, items))


# ---------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _segmentation_site(root: Path, site: str, options: FoldersOptions, size_check: _SizeCheck):
    pairs = list_pairs(root, site)
    loaded = _pool_map(lambda p: (_volume_samples if p[3] == "nifti" else _image_samples)(p[1], p[2], options), pairs)
    images, labels, rows, channels = [], [], [], []
    for (stem, image_path, mask_path, fmt), samples in zip(pairs, loaded):
        channels.append((image_path, samples[0][2].get("channels", 1)))  # a volume is grey
        for image, mask, info in samples:
            size_check(image, image_path)
            if options.image_size is not None:
                image, mask = _resize(image, mask, options.image_size)
            images.append(image)
            labels.append(mask)
            rows.append({
                "id": f"{site}/{stem}" if fmt == "image" else f"{site}/{stem}/s{info['slice']:03d}",
                "group": f"{site}/{stem}",  # a volume's slices are one group
                "source": _relative(image_path, root),
                "mask_source": _relative(mask_path, root),
                "slice": info["slice"],
                **{key: info[key] for key in META_DETAILS},
            })
    _check_channels(site, channels)
    volumes = sum(fmt == "nifti" for *_, fmt in pairs)
    what = f"{len(pairs)} files" if not volumes else f"{volumes} NIfTI volumes" + (
        f" and {len(pairs) - volumes} 2-D images" if volumes < len(pairs) else "")
    return np.stack(images), np.stack(labels), pd.DataFrame(rows), what


def _label_index(label: str, classes: tuple[str, ...], where: str) -> int:
    if label in classes:
        return classes.index(label)
    if label.isdigit() and int(label) < len(classes):
        return int(label)
    raise FoldersDataError(f"{where}: label {label!r} is not one of the classes {list(classes)}{closest(label, classes)}")


def _unlisted_images(root: Path, listed: set[str]) -> list[str]:
    """Image files under ``root`` (a supported suffix, not hidden, not in ``__MACOSX``) whose path
    relative to the root is not in ``listed``, sorted."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__MACOSX")
        for name in sorted(files):
            if name.startswith(".") or Path(name).suffix.lower() not in IMAGE_SUFFIXES:
                continue
            relative = Path(folder, name).relative_to(root).as_posix()
            if relative not in listed:
                found.append(relative)
    return found


def _classification_sites(root: Path, options: FoldersOptions) -> dict[str, pd.DataFrame]:
    """labels.csv checked completely (labels, files) before any image is decoded; rows per site.
    An image on disk that labels.csv does not list is an error, as an image without a mask is for
    segmentation: nothing the user put under the root is skipped silently."""
    table = _labelled_images(root, options)
    message = _unlisted_message(root, table)
    if message:
        raise FoldersDataError(message)
    return {site: rows.reset_index(drop=True) for site, rows in table.groupby("site", sort=True)}


def _unlisted_message(root: Path, table: pd.DataFrame) -> str | None:
    """The error for image files under ``root`` that ``table`` (of ``_labelled_images``) does not list."""
    unlisted = _unlisted_images(root, {p.relative_to(root).as_posix() for p in table["path"]})
    if not unlisted:
        return None
    return (f"{root}: {len(unlisted)} image(s) under the data root are not in {LABELS_FILE}, e.g. "
            f"{unlisted[0]}; list them in {LABELS_FILE} or move them out of the data root")


def _labelled_images(root: Path, options: FoldersOptions) -> pd.DataFrame:
    """labels.csv with each row's ``label_index``, image ``path`` and ``group`` ("" when none),
    checked row by row (labels, files inside the root and present)."""
    table = _read_labels_csv(root)
    csv_path = root / LABELS_FILE
    indices, paths = [], []
    for i, row in enumerate(table.itertuples(index=False)):
        where = f"{csv_path} line {_line(i)}"
        indices.append(_label_index(row.label, options.classes, where))
        relative = os.path.normpath(row.image)  # by name: a symlink to images elsewhere is fine
        if os.path.isabs(relative) or relative == ".." or relative.startswith("../"):
            raise FoldersDataError(f"{where}: image {row.image} is outside the data root {root}")
        path = root / relative
        if not path.is_file():
            raise FoldersDataError(f"{where}: image {path} does not exist")
        paths.append(path)
    table["label_index"], table["path"] = indices, paths
    if "group" not in table.columns:
        table["group"] = ""
    return table


def _classification_site(root: Path, site: str, table: pd.DataFrame, options: FoldersOptions, size_check: _SizeCheck):
    loaded = _pool_map(read_image, list(table["path"]))
    images, channels, native = [], [], []
    for path, (image, n_channels, _) in zip(table["path"], loaded):
        size_check(image, path)
        native.append(image.shape[:2])
        channels.append((path, n_channels))
        if options.image_size is not None:
            image, _ = _resize(image, None, options.image_size)
        images.append(image)
    _check_channels(site, channels)
    sources = [_relative(p, root) for p in table["path"]]
    meta = pd.DataFrame({
        "id": sources,
        # no group given: the image is its own group
        "group": [f"{site}/{g}" if g else f"{site}/{s}" for g, s in zip(table["group"], sources)],
        "source": sources,
        "label": [options.classes[k] for k in table["label_index"]],
        **{key: [scaling[key] for *_, scaling in loaded] for key in META_DETAILS if key.startswith("intensity")},
        "native_height": [h for h, _ in native],
        "native_width": [w for _, w in native],
    })
    per_class = np.bincount(table["label_index"], minlength=len(options.classes))
    what = ", ".join(f"{name} {n}" for name, n in zip(options.classes, per_class.tolist()))
    return np.stack(images), table["label_index"].to_numpy(np.int64), meta, what


def _span(values) -> str:
    low, high = float(np.min(values)), float(np.max(values))
    return f"{low:g}" if low == high else f"{low:g}..{high:g}"


def _per_file(meta: pd.DataFrame) -> pd.DataFrame:
    """One row per image or NIfTI volume (a volume's slices share its size and scaling), with
    ``unit`` = image | volume."""
    files = meta.drop_duplicates("source").reset_index(drop=True)
    nifti = files["slice"] >= 0 if "slice" in files.columns else pd.Series(False, index=files.index)
    return files.assign(unit=np.where(nifti, "volume", "image"))


def site_notes(site: str, meta: pd.DataFrame) -> list[str]:
    """Two lines of the preprocessing log about one site from its ``meta.csv``: the native size
    (H x W) of its images or NIfTI slices before any resize, each size with its count and first
    file where they vary (a wrong ``nifti_axis`` shows here), and how the intensities were scaled."""
    files = _per_file(meta)
    unit = "volume" if (files["unit"] == "volume").all() else "image"
    what = "slice size" if unit == "volume" else "size"
    sizes = files.groupby(["native_height", "native_width"], sort=True)["source"].agg(["count", "first"])
    if len(sizes) == 1:
        (h, w), count = sizes.index[0], int(sizes["count"].iloc[0])
        lines = [f"folders {site}: native {what} {h}x{w} (H x W) in all {count} {unit}(s)"]
    else:
        shown = [f"{h}x{w} in {n} {unit}(s) (e.g. {first})" for (h, w), (n, first) in sizes.head(6).iterrows()]
        more = f"; ... ({len(sizes)} sizes)" if len(sizes) > 6 else ""
        lines = [f"folders {site}: native {what}s (H x W) vary: " + "; ".join(shown) + more]
    parts = []
    for (dtype, kind), rows in files.groupby([files["intensity"].str.split().str[0], "unit"], sort=True):
        n = f"{len(rows)} {dtype} {kind}(s)"
        if dtype == "uint8":
            parts.append(f"{n} as stored")
        elif dtype == "bool":
            parts.append(f"{n} 0/1 to 0/255")
        else:
            parts.append(f"{n}, each scaled from its own p{ROBUST_PERCENTILES[0]:g}..p{ROBUST_PERCENTILES[1]:g} to 0..255 and "
                         f"clipped outside (low {_span(rows['intensity_low'])}, high {_span(rows['intensity_high'])})")
    lines.append(f"folders {site}: intensity: " + "; ".join(parts))
    return lines


# A site whose typical slice aspect (H / W) differs by more than this factor from most other sites'
# (from more than half of them: with two sites, from the other, and both are named), or NIfTI
# slices more elongated than NIFTI_ELONGATED, are warned about: the usual cause is a wrong
# nifti_axis (sagittal slices of an axial scan) or a site of other images.
ASPECT_WARNING = 2.0
NIFTI_ELONGATED = 4.0


def geometry_warnings(metas: Mapping[str, pd.DataFrame]) -> list[str]:
    """Warning lines (one per site at most) about native aspect ratios, from the sites' meta tables."""
    typical = {}
    for site, meta in metas.items():
        files = _per_file(meta)
        (h, w), _ = max(files.groupby(["native_height", "native_width"]).size().items(), key=lambda kv: kv[1])
        aspect = float(np.median(files["native_height"] / files["native_width"]))
        typical[site] = (int(h), int(w), aspect, bool((files["unit"] == "volume").any()))
    lines = []
    for site, (h, w, aspect, nifti) in typical.items():
        hint = "; check nifti_axis (the NIfTI axis the volumes are sliced along)" if nifti else "; check the site's images"
        shape = f"native slices of {h}x{w} (H x W, aspect {aspect:.2f})"
        others = {s: t[2] for s, t in typical.items() if s != site}
        far = [s for s, a in others.items() if max(aspect / a, a / aspect) > ASPECT_WARNING]
        if len(far) * 2 > len(others):
            shown = ", ".join(f"{s} {others[s]:.2f}" for s in far[:3]) + (", ..." if len(far) > 3 else "")
            lines.append(f"folders {site}: warning: {shape} differ more than {ASPECT_WARNING:g}x in aspect from "
                         f"{len(far)} of the {len(others)} other site(s) ({shown}){hint}")
        elif nifti and max(aspect, 1 / aspect) > NIFTI_ELONGATED:
            lines.append(f"folders {site}: warning: {shape} are far from square{hint}")
    return lines


def preprocess(raw: dict, store_dir, protocol: str = "", *, options: Mapping | FoldersOptions, size: int | None = None,
               expect_real_counts: bool = False, log: Callable[[str], object] = print) -> dict[str, int]:
    """Read the user's data and write the canonical store, one client per site; returns the samples per site.

    ``raw`` and ``protocol`` are unused (nothing is downloaded, the sites come from disk) and
    ``expect_real_counts`` has nothing to compare with. ``size`` (the pipeline's size) is used when
    ``options.image_size`` is not set. The whole store is built in a temporary folder and renamed at
    the end: any error leaves no store and no temporary behind.
    """
    options = FoldersOptions.from_dict(options)
    if options.image_size is None and size is not None:
        if not _is_int(size) or size < 1:
            raise ValueError(f"size must be a positive integer or None, got {size!r}")
        options = replace(options, image_size=int(size))
    from .inspect import inspect_folders  # imported here: inspect reads the data through this module

    for line in inspect_folders(options).lines():  # the log starts with what `fedmedbench check-data` prints
        log(line)
    root = _check_root(options.root)
    # What can be checked without decoding (layout, pairing, labels.csv) is checked before the
    # store folder is created; pairs are listed again (cheaply) when each site is read.
    sites = discover_sites(root, options.kind)
    tables = {}
    if options.kind == "segmentation":
        for site in sites:
            list_pairs(root, site)
    else:
        tables = _classification_sites(root, options)
    size_check = _SizeCheck(options.image_size)
    counts: dict[str, int] = {}
    metas: dict[str, pd.DataFrame] = {}
    with staged_dir(store_dir) as tmp_store:
        for site in sites:
            if options.kind == "segmentation":
                images, labels, meta, what = _segmentation_site(root, site, options, size_check)
            else:
                images, labels, meta, what = _classification_site(root, site, tables[site], options, size_check)
            write_client(tmp_store, site, images, labels, meta)
            counts[site] = len(meta)
            log(f"folders {site}: {len(meta)} images ({what}), {images.shape[2]}x{images.shape[1]}; "
                "train/val/test come with the split")
            metas[site] = meta
            for line in site_notes(site, meta):
                log(line)
        for line in geometry_warnings(metas):
            log(line)
        info = {
            "family": "folders",
            "kind": options.kind,
            "root": str(root),
            "classes": list(options.classes) if options.classes else [f"class{k}" for k in range(options.num_classes)],
            "num_classes": options.num_classes,
            "mask_values": {str(k): v for k, v in sorted(options.class_of_value.items())} if options.kind == "segmentation" else None,
            "image_size": options.image_size,
            "nifti_axis": options.nifti_axis,
            "stack": options.stack,
            "counts": counts,
        }
        atomic_write_text(Path(tmp_store) / "info.json", json.dumps(info, indent=2) + "\n")
    return counts


# ---------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------


def _cut(site: str, fractions: Sequence[float], n_rows: int) -> Callable[[int], tuple[int, int]]:
    """(end of train, end of val) in groups: val and test get max(1, round(f * n)), train the rest."""

    def cut(n_groups: int) -> tuple[int, int]:
        n_val = max(1, int(np.floor(fractions[1] * n_groups + 0.5)))
        n_test = max(1, int(np.floor(fractions[2] * n_groups + 0.5)))
        n_train = n_groups - n_val - n_test
        if n_train < 1:
            shown = "/".join(f"{f:g}" for f in fractions)
            raise FoldersDataError(
                f"site {site}: {n_groups} group(s) ({n_rows} images) are too few for fractions {shown}: "
                f"train/val/test would get {max(n_train, 0)}/{n_val}/{n_test} groups, each needs at least one (need 3 groups)"
            )
        return n_train, n_train + n_val

    return cut


def _seeded_split(site: str, meta: pd.DataFrame, options: FoldersOptions, permutation: str, seed: int):
    groups = meta["group"].to_numpy(str)
    cut = _cut(site, options.fractions, len(meta))
    if permutation == "seeded":
        return grouped_split(groups, client_rng(seed, site), cut)
    names = split_groups(groups, None, cut)  # sorted groups, rows in store order
    rank = {name: k for k, name in enumerate(SPLITS)}
    rows = np.argsort([rank[n] for n in names], kind="stable").astype(np.int64)
    return rows, names[rows]


def _normalise_image(value: str) -> str:
    value = value.strip().replace("\\", "/")
    while value.startswith("./"):
        value = value[2:]
    return value


def _read_user_split(path: Path, metas: dict[str, pd.DataFrame], log) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(rows, split names) per site from the user's CSV, in the CSV's order; it must name every image
    of the store once and only images of the store."""
    if not path.is_file():
        raise FoldersDataError(f"{path}: split_csv does not exist")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise FoldersDataError(f"{path}: not a readable CSV ({str(exc).strip()})") from exc
    table.columns = [str(c).strip() for c in table.columns]
    missing = [c for c in SPLIT_CSV_COLUMNS if c not in table.columns]
    if missing:
        raise FoldersDataError(f"{path}: missing column(s) {missing}; expected site, image, split")
    # Store rows by source path (a NIfTI volume has many), relative to the root or to the site folder;
    # the path relative to the root wins when both could match.
    by_source: dict[tuple[str, str], list[int]] = {}
    in_site: dict[tuple[str, str], list[int]] = {}
    for site, meta in metas.items():
        for row, source in enumerate(meta["source"]):
            by_source.setdefault((site, source), []).append(row)
            if source.startswith(f"{site}/"):
                in_site.setdefault((site, source[len(site) + 1:]), []).append(row)
    picked: dict[str, list[tuple[int, str]]] = {site: [] for site in metas}
    seen: dict[tuple[str, str], int] = {}
    unknown = []
    for i, row in enumerate(table.itertuples(index=False)):
        site, image, name = str(row.site).strip(), _normalise_image(str(row.image)), str(row.split).strip()
        where = f"{path} line {_line(i)}"
        if site not in metas:
            raise FoldersDataError(f"{where}: site {site!r} is not in the data{closest(site, metas)} (sites: {sorted(metas)})")
        if name not in SPLITS:
            raise FoldersDataError(f"{where}: split {name!r} is not one of {list(SPLITS)}{closest(name, SPLITS)}")
        rows = by_source.get((site, image)) or in_site.get((site, image))
        if rows is None:
            unknown.append((where, site, image))
            continue
        key = (site, rows[0])
        if key in seen:
            raise FoldersDataError(f"{where}: image {image} of site {site} is listed twice (lines {seen[key]} and {_line(i)})")
        seen[key] = _line(i)
        picked[site] += [(r, name) for r in rows]
    if unknown:
        where, site, image = unknown[0]
        more = f" (and {len(unknown) - 1} more row(s))" if len(unknown) > 1 else ""
        raise FoldersDataError(f"{where}: image {image} is not an image of site {site} in the data{more}")
    out = {}
    for site, meta in metas.items():
        covered = {r for r, _ in picked[site]}
        left = [meta["source"].iloc[r] for r in range(len(meta)) if r not in covered]
        if left:
            raise FoldersDataError(f"{path}: {len(set(left))} image(s) of site {site} are in no split, e.g. {left[0]}; "
                                   "every image needs a row (remove images you do not want from the data folder)")
        rows = np.array([r for r, _ in picked[site]], np.int64)
        names = np.array([n for _, n in picked[site]])
        counts = [int((names == s).sum()) for s in SPLITS]
        if min(counts) == 0:
            raise FoldersDataError(f"{path}: site {site} has train/val/test = {counts[0]}/{counts[1]}/{counts[2]} images; "
                                   "each split needs at least one")
        per_group = pd.DataFrame({"group": meta["group"].to_numpy(str)[rows], "split": names}).groupby("group")["split"].nunique()
        spanning = sorted(per_group.index[per_group > 1])
        if spanning:
            log(f"folders {site}: warning: {len(spanning)} group(s) of {path.name} are in more than one split "
                f"(e.g. {spanning[0]}); kept as given")
        out[site] = (rows, names)
    return out


def split(store_dir, out_csv, protocol: str = "", *, options: Mapping | FoldersOptions, permutation: str = "default",
          seed: int | None = None, log: Callable[[str], object] = print) -> pd.DataFrame:
    """The split of record of every site, written to ``out_csv``.

    With ``options.split_csv``: the user's split. Otherwise groups are cut with ``options.fractions``
    after a permutation: ``seeded`` (= ``default``; generator seeded with (seed, crc32(site)), rows in
    random order inside a split) or ``sorted`` (sorted groups, store order). ``seed``: the pipeline's
    split seed; ``None`` uses ``options.seed``.
    """
    options = FoldersOptions.from_dict(options)
    permutation = "seeded" if permutation == "default" else permutation
    if permutation not in ("seeded", "sorted"):
        raise ValueError(f"permutation must be 'default', 'seeded' or 'sorted', got {permutation!r}")
    seed = options.seed if seed is None else seed
    sites = list_clients(store_dir)
    if not sites:
        raise FoldersDataError(f"store {store_dir} holds no site (run the preprocessing step first)")
    metas = {site: open_client(store_dir, site).meta for site in sites}
    if options.split_csv is not None:
        chosen = _read_user_split(Path(options.split_csv), metas, log)
    else:
        chosen = {site: _seeded_split(site, metas[site], options, permutation, seed) for site in sites}
    tables = []
    for site in sites:
        rows, names = chosen[site]
        meta = metas[site]
        tables.append(pd.DataFrame({"client": site, "split": names, "row": rows,
                                    "id": meta["id"].to_numpy()[rows], "group": meta["group"].to_numpy()[rows]}))
        counts = "/".join(str(int((names == s).sum())) for s in SPLITS)
        source = Path(options.split_csv).name if options.split_csv else f"{permutation} seed {seed}"
        log(f"folders {site}: train/val/test = {counts} images, {meta['group'].nunique()} groups ({source})")
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table


# ---------------------------------------------------------------------------
# A small example dataset
# ---------------------------------------------------------------------------

EXAMPLE_CLASSES = {2: ("background", "lesion"), 3: ("background", "ring", "core")}
EXAMPLE_MASK_VALUES = {2: {0: 0, 255: 1}, 3: {0: 0, 128: 1, 255: 2}}
EXAMPLE_LABELS = ("benign", "malignant", "normal")


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _blob(rng: np.random.Generator, shape: tuple[int, ...], n_classes: int) -> np.ndarray:
    """A class map: background 0, an ellipse of class 1, and (3 classes) a smaller class-2 core inside it."""
    h, w = shape
    y, x = np.mgrid[0:h, 0:w]
    cy, cx = rng.uniform(0.35, 0.65) * h, rng.uniform(0.35, 0.65) * w
    ry, rx = rng.uniform(0.15, 0.3) * h, rng.uniform(0.15, 0.3) * w
    r = ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2
    classes = (r < 1).astype(np.uint8)
    if n_classes == 3:
        classes[r < 0.3] = 2
    return classes


def _example_image(rng: np.random.Generator, classes: np.ndarray, site_index: int, grey: bool) -> np.ndarray:
    """Texture plus brighter structures; every site has its own brightness and colour cast."""
    base = 40 + 25 * site_index + 12 * rng.standard_normal(classes.shape)
    base = base + 70 * (classes >= 1) + 50 * (classes == 2)
    if grey:
        return np.clip(base, 0, 255).astype(np.uint8)
    cast = np.array([1.0, 0.85 - 0.1 * site_index, 0.7])
    return np.clip(base[..., None] * cast, 0, 255).astype(np.uint8)


def write_example(out_dir: str | os.PathLike, kind: str = "segmentation", sites: Sequence[str] = ("siteA", "siteB", "siteC"),
                  seed: int = 0, *, n_classes: int = 3, counts: Sequence[int] = (6, 8, 10), size: int = 32,
                  image_format: str = "png", depth: int = 5) -> dict:
    """Write a tiny deterministic multi-site dataset in this family's layout; ``out_dir`` must not exist
    or be empty (it is written in a temporary folder and renamed: never half written).

    ``kind="segmentation"``, ``image_format="png"``: ``counts[k]`` PNG images per site (the first
    site grey, the others colour) with masks of pixel values 0/255 (``n_classes=2``) or 0/128/255 (3).
    ``image_format="nifti"``: ``counts[k]`` int16 volumes per site of NIfTI shape (size, size + 4,
    depth) (i, j, k), masks holding the class indices 0 .. n_classes-1 themselves.
    ``kind="classification"``: ``counts[k]`` PNG images per site in ``<site>/``, two per patient group,
    labels from ``EXAMPLE_LABELS``, listed in ``labels.csv``.

    Returns ``options`` (to pass to ``preprocess``), ``counts`` (samples per site: images or
    slices along k), ``class_pixels`` (segmentation: pixels per class and site) or ``class_counts``
    (classification: images per class and site), and ``files`` (stems or paths per site).
    """
    if kind not in KINDS or image_format not in ("png", "nifti") or n_classes not in (2, 3):
        raise ValueError(f"kind {kind!r}, image_format {image_format!r}, n_classes {n_classes!r}: "
                         f"expected one of {KINDS}, png/nifti, 2/3")
    if len(counts) < len(sites) or size < 8 or depth < 1:
        raise ValueError(f"need one count per site, size >= 8, depth >= 1; got {counts}, {size}, {depth}")
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} exists and is not empty; write_example only writes into a new folder")
    result: dict = {"counts": {}, "files": {}}
    with staged_dir(out_dir) as tmp:
        if kind == "classification":
            result.update(_write_classification_example(tmp, sites, counts, seed, size, result))
        elif image_format == "png":
            result.update(_write_png_example(tmp, sites, counts, seed, size, n_classes, result))
        else:
            result.update(_write_nifti_example(tmp, sites, counts, seed, size, n_classes, depth, result))
    result["options"]["root"] = str(out_dir)
    return result


def _write_png_example(tmp: Path, sites, counts, seed, size, n_classes, result) -> dict:
    levels = sorted(EXAMPLE_MASK_VALUES[n_classes])  # class k is drawn with the k-th level
    pixels = {}
    for s, site in enumerate(sites):
        (tmp / site / "images").mkdir(parents=True)
        (tmp / site / "masks").mkdir()
        pixels[site] = np.zeros(n_classes, np.int64)
        result["files"][site] = []
        for k in range(counts[s]):
            rng = np.random.default_rng([int(seed), s, k])
            classes = _blob(rng, (size, size), n_classes)
            stem = f"{site}_{k:03d}"
            (tmp / site / "images" / f"{stem}.png").write_bytes(_png(_example_image(rng, classes, s, grey=s == 0)))
            (tmp / site / "masks" / f"{stem}.png").write_bytes(_png(np.asarray(levels, np.uint8)[classes]))
            pixels[site] += np.bincount(classes.ravel(), minlength=n_classes)
            result["files"][site].append(stem)
        result["counts"][site] = counts[s]
    return {
        "class_pixels": {site: p.tolist() for site, p in pixels.items()},
        "options": {"kind": "segmentation", "mask_values": dict(EXAMPLE_MASK_VALUES[n_classes]),
                    "classes": list(EXAMPLE_CLASSES[n_classes])},
    }


def _write_nifti_example(tmp: Path, sites, counts, seed, size, n_classes, depth, result) -> dict:
    import SimpleITK as sitk

    pixels = {}
    for s, site in enumerate(sites):
        (tmp / site / "images").mkdir(parents=True)
        (tmp / site / "masks").mkdir()
        pixels[site] = np.zeros(n_classes, np.int64)
        result["files"][site] = []
        for k in range(counts[s]):
            rng = np.random.default_rng([int(seed), s, k])
            # SimpleITK arrays are (k, j, i): NIfTI shape (size, size + 4, depth).
            classes = np.stack([_blob(rng, (size + 4, size), n_classes) * (0 < z < depth - 1 or depth < 3)
                                for z in range(depth)]).astype(np.uint8)
            volume = (-200.0 + 300 * s + 150 * classes.astype(np.float64) + 40 * rng.standard_normal(classes.shape)
                      + 20 * np.arange(depth)[:, None, None]).astype(np.int16)  # intensity changes with the slice
            stem = f"vol{k:02d}"
            for array, sub in ((volume, "images"), (classes, "masks")):
                sitk.WriteImage(sitk.GetImageFromArray(array), str(tmp / site / sub / f"{stem}.nii.gz"), True)
            pixels[site] += np.bincount(classes.ravel(), minlength=n_classes)
            result["files"][site].append(stem)
        result["counts"][site] = counts[s] * depth
    return {
        "class_pixels": {site: p.tolist() for site, p in pixels.items()},
        "volumes": {site: counts[s] for s, site in enumerate(sites)},
        "options": {"kind": "segmentation", "classes": list(EXAMPLE_CLASSES[n_classes])},
    }


def _write_classification_example(tmp: Path, sites, counts, seed, size, result) -> dict:
    rows, per_class = [], {}
    for s, site in enumerate(sites):
        (tmp / site).mkdir()
        per_class[site] = np.zeros(len(EXAMPLE_LABELS), np.int64)
        result["files"][site] = []
        for k in range(counts[s]):
            rng = np.random.default_rng([int(seed), s, k])
            label = (k // 2 + s) % len(EXAMPLE_LABELS)  # both images of a patient share the label
            classes = _blob(rng, (size, size), 3) * (label > 0)
            image = _example_image(rng, classes.astype(np.uint8), s, grey=False)
            path = f"{site}/img_{k:03d}.png"
            (tmp / path).write_bytes(_png(image))
            rows.append({"site": site, "image": path, "label": EXAMPLE_LABELS[label], "group": f"patient{k // 2:02d}"})
            per_class[site][label] += 1
            result["files"][site].append(path)
        result["counts"][site] = counts[s]
    pd.DataFrame(rows).to_csv(tmp / LABELS_FILE, index=False, lineterminator="\n")
    return {
        "class_counts": {site: c.tolist() for site, c in per_class.items()},
        "options": {"kind": "classification", "classes": list(EXAMPLE_LABELS)},
    }


# The digest Snakemake keys preprocessing on (symlinked site folders followed, with a loop guard)
# lives in .digest; it stays importable from here.
from .digest import listing_digest as listing_digest  # noqa: E402
