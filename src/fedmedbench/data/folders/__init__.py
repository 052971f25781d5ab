"""Your own multi-site data on a local disk (family ``folders``): one client per site, no download.

Segmentation layout (``kind: segmentation``)::

    <root>/<site>/images/<stem>.<ext>    PNG, JPEG, BMP or TIFF images, or NIfTI volumes (.nii, .nii.gz)
    <root>/<site>/masks/<stem>.<ext>     the mask of the image with the same stem (any supported suffix);
                                         <stem><mask_suffix>.<ext> with ``mask_suffix`` (e.g. _Segmentation)

Every sub-folder of ``root`` is a site; what ``fedmedbench.data.skipped`` names (hidden names,
``__MACOSX``, the pipeline's marked results folder) is skipped here and by the listing digest alike.
Masks are read with the project's one mask reader (``images.read_mask``: real bit depth,
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
``image`` is the path from ``root`` (a path from the site folder is refused naming both paths
tried); other columns are the user's metadata, kept and ignored (one spelt like ``group`` is refused).
An image file under ``root`` that ``labels.csv`` does not list is an error (nothing is skipped).
A classification site's seeded split is stratified by class within groups (``splits``).

Images become uint8 H x W x 3: 8-bit grey is replicated to three channels, colour keeps R, G, B
(alpha dropped); 16-bit, 32-bit and float images (and NIfTI volumes, per volume) are scaled
from their own 0.5th .. 99.5th percentile to 0 .. 255 and clipped outside (one hot pixel cannot
darken the rest), and the range is kept in the store's ``meta.csv`` (columns ``intensity``,
``intensity_low``, ``intensity_high``; ``native_height``, ``native_width``: the size before any
resize) and summarised per site in the log. All images must have one size unless ``image_size``
is set (then every image is resized to a square: bilinear images, nearest-neighbour masks). One
site's images must all be grey or all colour.

A TIFF is read as a viewer shows it, through its photometric interpretation (``tiff``), at page
``tiff_page`` of a multi-page or pyramidal file (the first by default, with a warning in the log); a
palette mask is read as its indices, the label. NaN or infinite values are refused, in a float
image or a NIfTI volume alike.

2-D images and masks are turned upright by their own EXIF Orientation tag (a JPEG stored sideways
is shown upright by viewers, and its mask was drawn on that view); ``meta.csv``'s ``orientation``
keeps what was applied and the log counts the images turned per site.

Groups (the patients a split keeps whole) are by default the image stem, the NIfTI volume or the
classification ``group``; ``group_pattern`` (``re.search`` on the image's path under its site
folder, first capture group) or ``groups_csv`` (columns site, image, group) replace them, see
``groups``. ``split`` cuts each site's groups into
train/val/test with ``fractions`` (val and test get ``max(1, round(f * groups))`` groups, train the
rest) from a seeded permutation, or follows ``split_csv``: a CSV with columns site, image, split
that must name every image of the store exactly once (``image``: the path under the site folder,
e.g. ``images/01_1.png``, the path from ``root``, or an unambiguous file name or stem).

Bad data stop with one ``FoldersDataError`` naming the file or site; the store (or split file) is
only renamed into place once everything has been read, so nothing half-written is left behind.
``write_example`` writes a small deterministic three-site dataset in these layouts.

The package's parts: ``options`` (``FoldersOptions``, the layouts' names, ``FoldersDataError``),
``reading`` (finding the sites, pairs and ``labels.csv``; reading images, masks and NIfTI volumes),
``groups`` (``group_pattern``, ``groups_csv``, how a CSV names an image), ``splits`` (the seeded
cut or the user's ``split_csv``), ``example`` (``write_example``) and
``inspect`` (what ``fedmedbench check-data`` reports, also the head of the preprocessing log); this
module is the family interface (``preprocess``, ``split``) and builds the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from ..store import atomic_write_text, staged_dir, write_client
from .example import write_example
from .groups import assign_groups
from .inspect import inspect_folders
from .options import (
    META_DETAILS,
    FoldersDataError,
    FoldersOptions,
    _is_int,
)
from .reading import (
    ROBUST_PERCENTILES,
    _check_channels,
    _check_root,
    _classification_sites,
    _image_samples,
    _pool_map,
    _relative,
    _resize,
    _SizeCheck,
    _volume_samples,
    discover_sites,
    list_pairs,
    multipage_warning,
    read_image,
)
from .splits import split

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


def _segmentation_site(
    root: Path, site: str, options: FoldersOptions, size_check: _SizeCheck, groups: dict[str, str] | None
):
    pairs = list_pairs(root, site, options.mask_suffix)
    loaded = _pool_map(lambda p: (_volume_samples if p[3] == "nifti" else _image_samples)(p[1], p[2], options), pairs)
    images, labels, rows, channels, multipage = [], [], [], [], []
    for (stem, image_path, mask_path, fmt), samples in zip(pairs, loaded):
        channels.append((image_path, samples[0][2].get("channels", 1)))  # a volume is grey
        multipage += samples[0][2].get("multipage", [])
        for image, mask, info in samples:
            size_check(image, image_path)
            if options.image_size is not None:
                image, mask = _resize(image, mask, options.image_size)
            images.append(image)
            labels.append(mask)
            source = _relative(image_path, root)
            rows.append(
                {
                    "id": f"{site}/{stem}" if fmt == "image" else f"{site}/{stem}/s{info['slice']:03d}",
                    # the user's groups (group_pattern, groups_csv), else the file: a volume's slices are one group
                    "group": f"{site}/{groups[source] if groups else stem}",
                    "source": source,
                    "mask_source": _relative(mask_path, root),
                    "slice": info["slice"],
                    **{key: info[key] for key in META_DETAILS},
                }
            )
    _check_channels(site, channels)
    volumes = sum(fmt == "nifti" for *_, fmt in pairs)
    what = (
        f"{len(pairs)} files"
        if not volumes
        else f"{volumes} NIfTI volumes" + (f" and {len(pairs) - volumes} 2-D images" if volumes < len(pairs) else "")
    )
    return (
        np.stack(images),
        np.stack(labels),
        pd.DataFrame(rows),
        what,
        multipage_warning(site, multipage, root, options.tiff_page),
    )


def _classification_site(
    root: Path,
    site: str,
    table: pd.DataFrame,
    options: FoldersOptions,
    size_check: _SizeCheck,
    groups: dict[str, str] | None,
):
    loaded = _pool_map(lambda path: read_image(path, options.tiff_page), list(table["path"]))
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
    if groups:  # group_pattern or groups_csv
        table = table.assign(group=[groups[s] for s in sources])
    meta = pd.DataFrame(
        {
            "id": sources,
            # no group given: the image is its own group
            "group": [f"{site}/{g}" if g else f"{site}/{s}" for g, s in zip(table["group"], sources)],
            "source": sources,
            "label": [options.classes[k] for k in table["label_index"]],
            **{key: [scaling[key] for *_, scaling in loaded] for key in META_DETAILS if key.startswith("intensity")},
            "native_height": [h for h, _ in native],
            "native_width": [w for _, w in native],
            "orientation": [scaling["orientation"] for *_, scaling in loaded],
        }
    )
    per_class = np.bincount(table["label_index"], minlength=len(options.classes))
    what = ", ".join(f"{name} {n}" for name, n in zip(options.classes, per_class.tolist()))
    multipage = [(path, scaling["pages"]) for path, (*_, scaling) in zip(table["path"], loaded) if scaling["pages"] > 1]
    warning = multipage_warning(site, multipage, root, options.tiff_page)
    return np.stack(images), table["label_index"].to_numpy(np.int64), meta, what, warning


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
            parts.append(
                f"{n}, each scaled from its own p{ROBUST_PERCENTILES[0]:g}..p{ROBUST_PERCENTILES[1]:g} to 0..255 and "
                f"clipped outside (low {_span(rows['intensity_low'])}, high {_span(rows['intensity_high'])})"
            )
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
        hint = (
            "; check nifti_axis (the NIfTI axis the volumes are sliced along)" if nifti else "; check the site's images"
        )
        shape = f"native slices of {h}x{w} (H x W, aspect {aspect:.2f})"
        others = {s: t[2] for s, t in typical.items() if s != site}
        far = [s for s, a in others.items() if max(aspect / a, a / aspect) > ASPECT_WARNING]
        if len(far) * 2 > len(others):
            shown = ", ".join(f"{s} {others[s]:.2f}" for s in far[:3]) + (", ..." if len(far) > 3 else "")
            lines.append(
                f"folders {site}: warning: {shape} differ more than {ASPECT_WARNING:g}x in aspect from "
                f"{len(far)} of the {len(others)} other site(s) ({shown}){hint}"
            )
        elif nifti and max(aspect, 1 / aspect) > NIFTI_ELONGATED:
            lines.append(f"folders {site}: warning: {shape} are far from square{hint}")
    return lines


def preprocess(
    raw: dict,
    store_dir,
    protocol: str = "",
    *,
    options: Mapping | FoldersOptions,
    size: int | None = None,
    expect_real_counts: bool = False,
    log: Callable[[str], object] = print,
) -> dict[str, int]:
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
    for line in inspect_folders(options).lines():  # the log starts with what `fedmedbench check-data` prints
        log(line)
    root = _check_root(options.root)
    # What can be checked without decoding (layout, pairing, labels.csv) is checked before the
    # store folder is created; pairs are listed again (cheaply) when each site is read.
    sites = discover_sites(root, options.kind)
    tables = {}
    if options.kind == "segmentation":
        sources = {site: [_relative(p[1], root) for p in list_pairs(root, site, options.mask_suffix)] for site in sites}
    else:
        tables = _classification_sites(root, options)
        sources = {site: [_relative(p, root) for p in tables[site]["path"]] for site in sites}
    groups = assign_groups(root, options, sources) or {}
    size_check = _SizeCheck(options.image_size)
    counts: dict[str, int] = {}
    metas: dict[str, pd.DataFrame] = {}
    with staged_dir(store_dir) as tmp_store:
        for site in sites:
            if options.kind == "segmentation":
                images, labels, meta, what, warning = _segmentation_site(
                    root, site, options, size_check, groups.get(site)
                )
            else:
                images, labels, meta, what, warning = _classification_site(
                    root, site, tables[site], options, size_check, groups.get(site)
                )
            write_client(tmp_store, site, images, labels, meta)
            counts[site] = len(meta)
            turned = int((_per_file(meta)["orientation"] != 1).sum())
            upright = f"; {turned} image(s) turned upright by their EXIF Orientation tag" if turned else ""
            log(
                f"folders {site}: {len(meta)} images ({what}), {images.shape[2]}x{images.shape[1]}{upright}; "
                "train/val/test come with the split"
            )
            metas[site] = meta
            for line in site_notes(site, meta) + ([warning] if warning else []):
                log(line)
        for line in geometry_warnings(metas):
            log(line)
        info = {
            "family": "folders",
            "kind": options.kind,
            "root": str(root),
            "classes": list(options.classes) if options.classes else [f"class{k}" for k in range(options.num_classes)],
            "num_classes": options.num_classes,
            "mask_values": {str(k): v for k, v in sorted(options.class_of_value.items())}
            if options.kind == "segmentation"
            else None,
            "image_size": options.image_size,
            "nifti_axis": options.nifti_axis,
            "stack": options.stack,
            "mask_suffix": options.mask_suffix,
            "group_pattern": options.group_pattern,
            "counts": counts,
        }
        atomic_write_text(Path(tmp_store) / "info.json", json.dumps(info, indent=2) + "\n")
    return counts
