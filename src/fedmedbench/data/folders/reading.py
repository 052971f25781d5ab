"""Finding the user's files (sites, image/mask pairs, ``labels.csv``) and reading them: images, masks
and NIfTI volumes with their geometry, as preprocessing and ``check-data`` (``.inspect``) see them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from ...errors import closest
from ..images import apply_orientation, deep_rawmode, exif_orientation, open_image, read_mask
from ..nifti import check_nifti_complete, non_finite_message
from ..skipped import skipped
from .options import (
    _THREADS,
    IMAGE_SUFFIXES,
    KINDS,
    LABEL_COLUMNS,
    LABELS_FILE,
    NIFTI_SUFFIXES,
    OPTIONAL_LABEL_COLUMNS,
    FoldersDataError,
    FoldersOptions,
)
from .tiff import check_page, read_tiff


def _check_root(root: str | os.PathLike) -> Path:
    root = Path(root)
    if not root.is_dir():
        raise FoldersDataError(f"{root}: the data root does not exist or is not a folder")
    return root


def shown_path(path: str | os.PathLike) -> str:
    """A path as it can be printed and written to a CSV: bytes that are not valid UTF-8 (kept by
    ``os.fsdecode`` as surrogates, which no UTF-8 log or CSV accepts) shown as ``\\xff`` escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def check_name(path: Path) -> None:
    """Refuse a file or folder name that is not valid UTF-8 (written on another system, or copied
    from an old archive): the store, its CSVs and the logs are UTF-8 text. One line naming it, escaped."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        raise FoldersDataError(
            f"{shown_path(path)}: the name is not valid UTF-8 text (the bytes shown as \\x..); "
            "rename it with UTF-8 characters only"
        ) from None


def _check_site_name(site: str, where: str) -> None:
    if not site or site in (".", "..") or site.startswith(".") or "/" in site or "\\" in site:
        raise FoldersDataError(
            f"{where}: site name {site!r} must be a plain folder name (no '/', not starting with '.')"
        )


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
        if skipped(path):
            continue  # .DS_Store, macOS ._ files, Thumbs.db (the listing digest skips them too)
        check_name(path)
        parsed = _stem_and_format(path) if path.is_file() else None
        if parsed is None:
            raise FoldersDataError(
                f"{path}: not a supported file (expected {', '.join(IMAGE_SUFFIXES + NIFTI_SUFFIXES)})"
            )
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
        if not path.is_dir() or skipped(path):
            continue  # hidden folders, __MACOSX, the pipeline's own results (the listing digest skips them too)
        check_name(path)
        # Every folder is a site: a folder without images/ (a typo such as Images/) is an error, not skipped.
        if not (path / "images").is_dir():
            raise FoldersDataError(
                f"{path}: site folder without an images/ folder (expected {path}/images/ and "
                f"{path}/masks/; start the folder name with '.' to skip it)"
            )
        sites.append(path.name)
    if not sites:
        raise FoldersDataError(f"{root}: no site folders (expected <root>/<site>/images/ and <root>/<site>/masks/)")
    return sites


def _header_size(path: Path, nifti_axis: int) -> tuple[int, int]:
    """(H, W) of a 2-D image or of a NIfTI volume's slices along ``nifti_axis``, from the header only."""
    if _stem_and_format(path)[1] == "nifti":
        import SimpleITK as sitk  # noqa: PLC0415  (SimpleITK costs ~70 ms; only 3-D volumes need it, and the DAG loads this module)

        reader = sitk.ImageFileReader()
        reader.SetFileName(str(path))
        reader.ReadImageInformation()
        i, j, k = reader.GetSize()
        shape = [k, j, i]  # array order, as _read_volume slices it
        del shape[2 - nifti_axis]
        return shape[0], shape[1]
    with open_image(path, FoldersDataError) as img:  # lazy: reads the header, decodes no pixel
        turned = exif_orientation(img) >= 5  # orientations 5..8 swap H and W
        return (img.width, img.height) if turned else (img.height, img.width)


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
            path = list_pairs(root, discover_sites(root, "segmentation")[0], options.mask_suffix)[0][1]
        return (*_header_size(path, options.nifti_axis), path)
    except Exception:  # noqa: BLE001 (any reader error: a hint is skipped, preprocessing reports the error)
        return None


def list_pairs(root: Path, site: str, mask_suffix: str = "") -> list[tuple[str, Path, Path, str]]:
    """``(stem, image, mask, format)`` of one site, sorted by stem; every image needs its mask and
    every mask its image. The mask of ``images/<stem>.<ext>`` is ``masks/<stem><mask_suffix>.<ext>``."""
    image_dir, mask_dir = root / site / "images", root / site / "masks"
    if not mask_dir.is_dir():
        raise FoldersDataError(f"{mask_dir} does not exist (site {site} needs images/ and masks/)")
    images, by_mask_stem = _files_by_stem(image_dir), _files_by_stem(mask_dir)
    if not images:
        raise FoldersDataError(f"{image_dir}: no images in site {site}")
    masks = {}
    for stem, path in by_mask_stem.items():
        if not stem.endswith(mask_suffix) or stem == mask_suffix:
            raise FoldersDataError(
                f"{path}: mask name does not end with mask_suffix {mask_suffix!r} "
                f"(expected masks/<image stem>{mask_suffix}.<ext>)"
            )
        masks[stem[: len(stem) - len(mask_suffix)]] = path
    for stem, path in images.items():
        if stem not in masks:
            raise FoldersDataError(f"{path}: image without a mask (expected {mask_dir}/{stem}{mask_suffix}.<ext>)")
    for stem, path in masks.items():
        if stem not in images:
            raise FoldersDataError(f"{path}: mask without an image (expected {image_dir}/{stem}.<ext>)")
    pairs = []
    for stem in sorted(images):
        kind_i, kind_m = _stem_and_format(images[stem])[1], _stem_and_format(masks[stem])[1]
        if kind_i != kind_m:
            raise FoldersDataError(
                f"{masks[stem]}: a {kind_m} mask for the {kind_i} image {images[stem].name}; "
                "NIfTI volumes need NIfTI masks, 2-D images 2-D masks"
            )
        pairs.append((stem, images[stem], masks[stem], kind_i))
    return pairs


def _line(index: int) -> int:
    return index + 2  # header is line 1


def read_user_csv(path: Path) -> pd.DataFrame:
    """A CSV the user wrote (labels.csv, a split file): every value a string as written, column names
    stripped; an unreadable file is refused in one line naming it."""
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise FoldersDataError(f"{path}: not a readable CSV ({str(exc).strip()})") from exc
    table.columns = [str(c).strip() for c in table.columns]
    return table


def read_option_csv(path: Path, option: str, columns: tuple[str, ...], note: str = "") -> pd.DataFrame:
    """The CSV an option names (``split_csv``, ``groups_csv``): it must exist and hold ``columns``."""
    if not path.is_file():
        raise FoldersDataError(f"{path}: {option} does not exist")
    table = read_user_csv(path)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise FoldersDataError(f"{path}: missing column(s) {missing}; expected {', '.join(columns)}{note}")
    return table


def _read_labels_csv(root: Path) -> pd.DataFrame:
    """``labels.csv`` checked row by row (columns, empty values, site names, duplicates); paths as written."""
    path = root / LABELS_FILE
    if not path.is_file():
        raise FoldersDataError(f"{path} does not exist (kind classification needs it, with columns site, image, label)")
    table = read_user_csv(path)
    known = LABEL_COLUMNS + OPTIONAL_LABEL_COLUMNS
    for column in table.columns:
        # Other columns are the user's metadata, kept and ignored; one spelt like group is a typo
        # (a misspelt site, image or label is a missing column below), in any case: GROUP ignored
        # would let a patient's images into two splits without a word.
        if column not in known and closest(column.lower(), OPTIONAL_LABEL_COLUMNS):
            raise FoldersDataError(
                f"{path}: unknown column {column!r}{closest(column.lower(), known)}; "
                f"expected site, image, label and optionally group"
            )
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
        raise FoldersDataError(
            f"{path} line {_line(i)}: image {table['image'].iloc[i]} is listed twice "
            f"(lines {_line(first)} and {_line(i)})"
        )
    return table


# Images deeper than 8 bits are scaled from these percentiles of their own pixels (per image, per
# NIfTI volume) and clipped outside them: one hot pixel at 65535 must not turn the rest of a 12-bit
# image black, as a min .. max scaling did (docs/engineering.md).
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
    not_finite = int(np.count_nonzero(~np.isfinite(values)))
    if not_finite:  # the same rule as a NIfTI volume's (check_nifti_complete)
        raise FoldersDataError(non_finite_message(path, not_finite, values.size, "pixel"))
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


# What to do about a file that cannot be decoded, the usual causes being an interrupted copy or download.
DAMAGED_HINT = "if it is cut short or damaged, copy it again from its source, or remove it (and its mask)"


def is_tiff(path: Path) -> bool:
    return path.suffix.lower() in (".tif", ".tiff")


def _decode(path: Path, page: int = 0) -> tuple[np.ndarray, int, int]:
    """The pixels of a 2-D image file as a viewer shows them, at their real bit depth (H x W, or
    H x W x C with C = 2, 3 or 4), the file's EXIF (TIFF) Orientation: 1 upright, 2..8 to be
    applied, and its page count (a TIFF is read at ``page``; other formats have one)."""
    errors = []
    if is_tiff(path):
        # tifffile reads 16-bit colour and float TIFFs that Pillow cannot (or reads truncated to 8 bits);
        # the samples are then shown through the page's photometric interpretation (.tiff).
        try:
            return read_tiff(path, page)
        except FoldersDataError:
            raise
        except Exception as exc:  # tifffile raises many types (codec missing, bad tags, truncated strips)
            errors.append(f"tifffile: {exc}")
    try:
        with open_image(path, FoldersDataError) as img:
            pages = getattr(img, "n_frames", 1) if is_tiff(path) else 1
            if page and is_tiff(path):
                check_page(path, page, pages)
                img.seek(page)
            deep = deep_rawmode(img)
            img.load()
            orientation = exif_orientation(img)
            mode = img.mode
            if deep and mode in ("L", "LA", "RGB", "RGBA"):
                # Pillow has kept only the high byte of each 16-bit sample: refuse rather than lose bits.
                raise FoldersDataError(
                    f"{path}: {deep} samples, which Pillow reads as 8-bit; save it as 8-bit or as a TIFF"
                )
            if mode in ("P", "PA"):
                img = img.convert("RGBA")  # the palette colours, exactly
            elif mode in ("CMYK", "YCbCr", "LAB", "HSV"):
                img = img.convert("RGB")
            elif mode not in ("1", "L", "LA", "RGB", "RGBA", "I", "F") and not mode.startswith("I;16"):
                raise FoldersDataError(f"{path}: unsupported Pillow mode {mode}")
            return np.asarray(img), orientation, pages
    except FoldersDataError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        errors.append(f"{exc}" if not errors else f"Pillow: {exc}")
    raise FoldersDataError(f"{path}: cannot read the image ({'; '.join(errors)}); {DAMAGED_HINT}")


def read_image(path: str | os.PathLike, page: int = 0) -> tuple[np.ndarray, int, dict]:
    """A 2-D image as (uint8 H x W x 3 upright as a viewer shows it, its colour channels: 1 grey or
    3 colour, its scaling: the store's ``intensity`` columns, see ``_to_uint8``, ``orientation``,
    the EXIF Orientation applied, 1 for none, and ``pages``, the file's page count: a multi-page
    TIFF is read at ``page``, the option ``tiff_page``)."""
    path = Path(path)
    array, orientation, pages = _decode(path, page)
    array = apply_orientation(array, orientation)  # the masks are drawn on the upright view
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
    return np.ascontiguousarray(pixels), channels, {**scaling, "orientation": orientation, "pages": pages}


def multipage_warning(site: str, files: list[tuple[Path, int]], root: Path, page: int) -> str | None:
    """The log's one warning line about a site's multi-page TIFF files (``files``: path, page count),
    read at page ``page``; None without any."""
    if not files:
        return None
    shown = ", ".join(f"{_relative(p, root)} ({n} pages)" for p, n in files[:3]) + (", ..." if len(files) > 3 else "")
    which = "the first, the full resolution of a pyramid" if page == 0 else f"tiff_page {page}"
    return (
        f"folders {site}: warning: {len(files)} multi-page TIFF file(s) read at page {page} ({which}): {shown}; "
        "set tiff_page to read another page"
    )


def _map_mask(values: np.ndarray, mapping: dict[int, int], path: Path) -> np.ndarray:
    """Pixel values -> uint8 class indices; a value missing from ``mapping`` is an error naming it and
    the file (a JPEG mask or an anti-aliased edge shows up here instead of becoming a wrong class)."""
    found, inverse = np.unique(values, return_inverse=True)
    missing = [v for v in found.tolist() if v not in mapping]
    if missing:
        shown = ", ".join(f"{v:g}" for v in missing[:6]) + (
            f", ... ({len(missing)} values)" if len(missing) > 6 else ""
        )
        hint = (
            "; JPEG compression changes mask values: save masks as PNG"
            if path.suffix.lower() in (".jpg", ".jpeg")
            else ""
        )
        raise FoldersDataError(
            f"{path}: mask value(s) {shown} not in mask_values {dict(sorted(mapping.items()))} "
            f"(map every pixel value of the masks to a class index, e.g. {{0: 0, 255: 1}}){hint}"
        )
    lut = np.array([mapping[v] for v in found.tolist()], np.uint8)
    return lut[inverse].reshape(values.shape)


# A NIfTI mask must lie on its image's voxel grid. Headers store spacing and the affine as float32
# and converters round them differently, so equal means: direction cosines within 1e-3, spacings
# within 1e-3 relative, origins within 1e-3 of a voxel.
GEOMETRY_TOLERANCE = 1e-3


def _read_volume(path: Path, nifti_axis: int) -> tuple[np.ndarray, dict]:
    """A NIfTI volume as (slices, H, W) along the NIfTI voxel axis ``nifti_axis``, in its own dtype,
    and its geometry (SimpleITK's direction, origin and spacing, in (i, j, k) order)."""
    import SimpleITK as sitk  # noqa: PLC0415  (SimpleITK costs ~70 ms; only 3-D volumes need it, and the DAG loads this module)

    # SimpleITK reads a cut-short .nii.gz, and NaN or infinite voxels, as zeros without complaint
    check_nifti_complete(path, FoldersDataError, finite=True)
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


def _volume_samples(
    image_path: Path, mask_path: Path, options: FoldersOptions
) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    """One (image H x W x 3, class map, meta) per slice of a volume pair."""
    (volume, grid), (mask, mask_grid) = (
        _read_volume(image_path, options.nifti_axis),
        _read_volume(mask_path, options.nifti_axis),
    )
    if volume.shape != mask.shape:
        raise FoldersDataError(
            f"{image_path} has shape {volume.shape} (slices, H, W) but its mask {mask_path} has {mask.shape}"
        )
    # Same array shape is not enough: a mask written with a flipped direction would be scored in
    # another orientation. Refused, not resampled (docs/engineering.md).
    differs = _geometry_difference(grid, mask_grid)
    if differs is not None:
        raise FoldersDataError(
            f"{image_path} and its mask {mask_path} are not on one voxel grid: {differs} "
            "(image vs mask); resample the mask onto its image (nearest neighbour) or fix its header"
        )
    if mask.dtype.kind == "f" and (not np.isfinite(mask).all() or not np.array_equal(mask, np.round(mask))):
        raise FoldersDataError(f"{mask_path}: a mask must hold integer values; found non-integer {mask.dtype} values")
    classes = _map_mask(mask.astype(np.int64), options.class_of_value, mask_path)
    norm, scaling = _to_uint8(volume, image_path)  # one intensity range per volume: slices stay comparable
    last = volume.shape[0] - 1
    native = {"native_height": volume.shape[1], "native_width": volume.shape[2]}
    samples = []
    for i in range(volume.shape[0]):
        picks = (max(i - 1, 0), i, min(i + 1, last)) if options.stack == 3 else (i, i, i)
        info = {"slice": i, **scaling, **native, "orientation": 1}  # NIfTI: the header's direction, no EXIF
        samples.append((np.stack([norm[j] for j in picks], axis=-1), classes[i], info))
    return samples


def read_folders_mask(path: Path, page: int = 0) -> tuple[np.ndarray, int]:
    """A user's 2-D mask as (uint8 H x W values, the file's page count), through the project's one
    mask reader (``images.read_mask``: real bit depth, never clipped), upright by its EXIF
    Orientation. A palette mask gives its indices: the index is the label, whatever colour the
    palette shows it in. A multi-page TIFF is read at ``page`` (``tiff_page``), as its image is."""
    pages = 1
    if is_tiff(path):
        try:
            with open_image(path, FoldersDataError) as img:
                pages = getattr(img, "n_frames", 1)
        except Exception:  # noqa: BLE001 (read_mask names what is wrong with the file)
            pages = 1
        check_page(path, page, pages)
    mask = read_mask(path, error=FoldersDataError, upright=True, page=page if is_tiff(path) else 0, palette="index")
    return mask, pages


def _image_samples(
    image_path: Path, mask_path: Path, options: FoldersOptions
) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    image, channels, scaling = read_image(image_path, options.tiff_page)
    grey, mask_pages = read_folders_mask(mask_path, options.tiff_page)
    if grey.shape != image.shape[:2]:
        raise FoldersDataError(
            f"{image_path} is {image.shape[1]}x{image.shape[0]} but its mask {mask_path} is "
            f"{grey.shape[1]}x{grey.shape[0]}"
        )
    multipage = [(p, n) for p, n in ((image_path, scaling.pop("pages")), (mask_path, mask_pages)) if n > 1]
    info = {
        "slice": -1,
        **scaling,
        "native_height": image.shape[0],
        "native_width": image.shape[1],
        "channels": channels,
        "multipage": multipage,
    }
    return [(image, _map_mask(grey, options.class_of_value, mask_path), info)]


def _resize(image: np.ndarray, mask: np.ndarray | None, size: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Square resize: bilinear (with Pillow's antialiasing when shrinking) images, nearest masks (no new classes)."""
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
            raise FoldersDataError(
                f"{path}: {image.shape[1]}x{image.shape[0]} differs from {w}x{h} of {first}; "
                "set image_size to resize every image to one square size"
            )


def _check_channels(site: str, loaded: list[tuple[Path, int]]) -> None:
    kinds = {c: p for p, c in reversed(loaded)}  # the first file of each channel count
    if len(kinds) > 1:
        raise FoldersDataError(
            f"site {site}: mixed channel counts: {kinds[1]} is grey but {kinds[3]} is colour; "
            "convert the site's images to one kind"
        )


def _pool_map(fn, items: list) -> list:
    with ThreadPoolExecutor(_THREADS) as pool:  # Pillow and zlib release the GIL while decoding
        return list(pool.map(fn, items))


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _label_index(label: str, classes: tuple[str, ...], where: str) -> int:
    if label in classes:
        return classes.index(label)
    if label.isdigit() and int(label) < len(classes):
        return int(label)
    raise FoldersDataError(
        f"{where}: label {label!r} is not one of the classes {list(classes)}{closest(label, classes)}"
    )


def _unlisted_images(root: Path, listed: set[str]) -> list[str]:
    """Image files under ``root`` (a supported suffix, not ``skipped``: not hidden, not in
    ``__MACOSX`` or the pipeline's results) whose path relative to the root is not in ``listed``, sorted."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not skipped(os.path.join(folder, d)))
        for name in sorted(files):
            if skipped(name) or Path(name).suffix.lower() not in IMAGE_SUFFIXES:
                continue
            check_name(Path(folder, name))
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
    return (
        f"{root}: {len(unlisted)} image(s) under the data root are not in {LABELS_FILE}, e.g. "
        f"{unlisted[0]}; list them in {LABELS_FILE} or move them out of the data root"
    )


def _parents(path: Path, root: Path) -> list[Path]:
    """``path`` and each folder between it and ``root`` (``root`` excluded), by name."""
    found = [path]
    while found[-1].parent != root and found[-1].parent != found[-1]:
        found.append(found[-1].parent)
    return found


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
            in_site = root / row.site / relative
            if in_site.is_file():
                raise FoldersDataError(
                    f"{where}: image {row.image} is not under the data root ({path} does not exist) but "
                    f"under site {row.site}'s folder ({in_site}); {LABELS_FILE} takes paths from the data "
                    f"root: write {row.site}/{Path(relative).as_posix()}"
                )
            raise FoldersDataError(
                f"{where}: image {row.image} does not exist: neither {path} (the path from the data root, "
                f"as {LABELS_FILE} takes it) nor {in_site} (from the site folder) is a file"
            )
        hidden = next((part for part in _parents(path, root) if skipped(part)), None)
        if hidden is not None:  # the listing digest leaves it out: an edit of it would re-run nothing
            raise FoldersDataError(
                f"{where}: image {row.image} lies in {_relative(hidden, root)}, which fedmedbench "
                "skips (a hidden name, __MACOSX or the pipeline's results); move it to a plain folder"
            )
        paths.append(path)
    table["label_index"], table["path"] = indices, paths
    if "group" not in table.columns:
        table["group"] = ""
    option = (
        "group_pattern"
        if options.group_pattern is not None
        else "groups_csv"
        if options.groups_csv is not None
        else None
    )
    if option and (table["group"] != "").any():
        raise FoldersDataError(
            f"{csv_path}: has a group column and {option} is set; give the groups one way "
            f"(remove the column or {option})"
        )
    return table
