"""What the pipeline will understand of a user's own data (family ``folders``), before anything trains.

``inspect_folders`` reports, per site: the images (NIfTI: slices) of each split the pipeline would
make (folders' seeded cut of the groups, or the user's ``split_csv``), the image sizes and channels,
the number of groups, for segmentation every mask value found with the class it maps to and its
share of the pixels, for classification the images per class; then the problems, one line each
(``DataReport.problems``: preprocessing or training would fail, or a number would mean nothing) and
the warnings (``DataReport.warnings``: legal, but worth knowing). ``python -m fedmedbench check-data``
prints it, and folders' preprocessing logs it first.

It is fast on hundreds of images because images are read only for their header (Pillow's lazy
open, the TIFF page ``tiff_page`` names through its photometric interpretation, SimpleITK's header);
masks are read fully (their values are the point), with the readers preprocessing uses
(``reading.read_folders_mask``: a palette mask as its indices, ``reading._read_volume``), and the layout,
``labels.csv`` and the split are checked by folders' own functions, so what is reported is what
preprocessing will see. Nothing here imports torch: the data layer knows nothing of training (the
caller passes its model's size rule).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import UnidentifiedImageError

from ..images import exif_orientation, open_image
from ..store import SPLITS
from .groups import (
    assign_groups,
    groups_source,
    prefix_warning,
    repeated_stem_warning,
    shared_group_warning,
    subject_column_warning,
)
from .options import LABEL_COLUMNS, LABELS_FILE, OPTIONAL_LABEL_COLUMNS, FoldersDataError, FoldersOptions
from .reading import (
    DAMAGED_HINT,
    _check_root,
    _geometry_difference,
    _labelled_images,
    _map_mask,
    _read_volume,
    _relative,
    _unlisted_message,
    discover_sites,
    is_tiff,
    list_pairs,
    multipage_warning,
    read_folders_mask,
)
from .splits import _read_user_split, _seeded_split, class_notes
from .tiff import check_page, tiff_header

__all__ = ["DataReport", "SiteReport", "builtin_line", "image_header", "inspect_folders"]

THREADS = 2  # header reads are I/O bound; two threads stay polite on a shared machine
MAX_FILE_PROBLEMS = 10  # per site: the first unreadable files are named, the rest counted
GROUPS_SHOWN = 6  # per split in a site's groups line
# Pillow modes as reading.read_image sees them (P/PA become RGBA, CMYK/YCbCr/LAB/HSV RGB).
_GREY_MODES = ("1", "L", "LA", "I", "F")
_COLOUR_MODES = ("RGB", "RGBA", "P", "PA", "CMYK", "YCbCr", "LAB", "HSV")


@dataclass
class SiteReport:
    """One site as the pipeline will see it. Sizes count samples (images or NIfTI slices), channels
    count files (images or volumes)."""

    site: str
    files: int = 0  # 2-D images and NIfTI volumes
    volumes: int = 0
    samples: int = 0  # rows of the store: images, or slices of the volumes
    groups: int = 0
    split: dict[str, int] | None = None  # samples per split; None when it could not be made
    sizes: Counter = field(default_factory=Counter)  # (H, W) of a sample -> samples
    channels: Counter = field(default_factory=Counter)  # "grey" / "colour" -> files
    mask_values: dict[int, int] = field(default_factory=dict)  # pixel value -> pixels (segmentation)
    class_pixels: list[int] | None = None  # pixels per class index (segmentation)
    class_images: list[int] | None = None  # images per class index (classification)
    upright: int = 0  # files turned upright by their EXIF Orientation tag
    group_splits: dict[str, list[tuple[str, int]]] | None = (
        None  # split -> (group, samples), when groups hold several files
    )
    # split -> (samples, groups, per class: its images (classification) or the samples holding it (segmentation))
    split_classes: dict[str, tuple[int, int, list[int]]] | None = None

    @property
    def class_fractions(self) -> list[float]:
        """Each class's share of the site's mask pixels (segmentation) or images (classification)."""
        counts = np.asarray(self.class_pixels if self.class_pixels is not None else self.class_images or [], np.float64)
        return (counts / counts.sum()).tolist() if counts.sum() else [0.0] * len(counts)


@dataclass
class DataReport:
    name: str
    options: FoldersOptions
    sites: list[SiteReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def class_names(self) -> list[str]:
        o = self.options
        return list(o.classes) if o.classes else [f"class{k}" for k in range(o.num_classes)]

    def site(self, name: str) -> SiteReport:
        return next(s for s in self.sites if s.site == name)

    def lines(self) -> list[str]:
        """The report as text: a head line, two or three lines per site, one line per problem or warning;
        without any site (the layout or labels.csv could not be read), its problems alone."""
        o, label = self.options, f"data.{self.name}" if self.name else "folders data"
        if not self.sites and self.problems:  # the layout or labels.csv stopped it: no "0 site(s)" to show
            return (
                [f"{label}: problem: {p}" for p in self.problems]
                + [f"{label}: warning: {w}" for w in self.warnings]
                + [f"{label}: {len(self.problems)} problem(s), {len(self.warnings)} warning(s)"]
            )
        split = (
            f"split_csv {o.split_csv}"
            if o.split_csv
            else f"seeded fractions {'/'.join(f'{f:g}' for f in o.fractions)} (seed {o.seed})"
        )
        size = f"resized to {o.image_size}x{o.image_size}" if o.image_size else "sizes as stored"
        extra = (
            f"; mask_values {dict(sorted(o.class_of_value.items()))}"
            if o.kind == "segmentation" and o.mask_values
            else ""
        )
        out = [
            f"{label}: {o.kind} data in {o.root}: {len(self.sites)} site(s); classes "
            f"{', '.join(f'{k} {n}' for k, n in enumerate(self.class_names))}{extra}; {split}; {size}"
        ]
        for s in self.sites:
            out += ["  " + line for line in self._site_lines(s)]
        out += [f"  problem: {p}" for p in self.problems] + [f"  warning: {w}" for w in self.warnings]
        out.append(
            f"{label}: {len(self.problems)} problem(s), {len(self.warnings)} warning(s)"
            if self.problems or self.warnings
            else f"{label}: no problem found"
        )
        return out

    def _site_lines(self, s: SiteReport) -> list[str]:
        unit = "slice" if s.volumes else "image"  # what a row of the store is
        files = "volume" if s.volumes == s.files and s.volumes else "file" if s.volumes else "image"
        what = _count(s.files, files) + (f" = {_count(s.samples, unit)}" if s.volumes else "")
        split = (
            f"train/val/test = {'/'.join(str(s.split[k]) for k in SPLITS)} {unit}s"
            if s.split
            else "no split (see the problems)"
        )
        sizes = ", ".join(f"{h}x{w} ({_count(n, unit)})" for (h, w), n in s.sizes.most_common())
        channels = ", ".join(f"{kind} ({_count(n, files)})" for kind, n in sorted(s.channels.items()))
        upright = f"; {s.upright} turned upright by their EXIF Orientation tag" if s.upright else ""
        lines = [
            f"{s.site}: {what}, {_count(s.groups, 'group')}; {split}; H x W {sizes or '-'}; {channels or '-'}{upright}"
        ]
        names = self.class_names
        if s.class_pixels is not None:
            total = sum(s.mask_values.values()) or 1
            mapping = self.options.class_of_value
            values = ", ".join(
                f"{v} -> {mapping[v]} {names[mapping[v]]}" if v in mapping else f"{v} -> (not in mask_values)"
                for v in sorted(s.mask_values)
            )
            lines.append(f"  mask values: {values or '-'}")
            unmapped = total - sum(s.class_pixels) if s.mask_values else 0
            shares = [f"{n} {_percent(c / total)}" for n, c in zip(names, s.class_pixels)]
            lines.append(
                "  pixels per class: "
                + ", ".join(shares + ([f"not in mask_values {_percent(unmapped / total)}"] if unmapped else []))
            )
        if s.class_images is not None:
            lines.append("  images per class: " + ", ".join(f"{n} {c}" for n, c in zip(names, s.class_images)))
        if s.split_classes:
            lines += self._split_lines(s, unit)
        if s.group_splits:
            shown = "; ".join(
                f"{name} "
                + ", ".join(f"{g} ({n})" for g, n in groups[:GROUPS_SHOWN])
                + (f", ... ({len(groups)} groups)" if len(groups) > GROUPS_SHOWN else "")
                for name, groups in s.group_splits.items()
                if groups
            )
            lines.append(f"  groups ({groups_source(self.options)}; {unit}s per group): {shown}")
        return lines

    def _split_lines(self, s: SiteReport, unit: str) -> list[str]:
        """One line per split: samples, groups and per class its count; a class the site has that
        train or test lacks is marked (a model never trained on it, or a score never measured)."""
        names, kind = self.class_names, self.options.kind
        in_site = [sum(s.split_classes[split][2][k] for split in SPLITS) > 0 for k in range(len(names))]
        lines = []
        for split in SPLITS:
            samples, groups, counts = s.split_classes[split]
            marked = [
                f"{name} {n}" + (" (missing)" if not n and in_site[k] and split != "val" else "")
                for k, (name, n) in enumerate(zip(names, counts))
            ]
            what = "images per class" if kind == "classification" else f"{unit}s holding each class"
            lines.append(f"  {split}: {_count(samples, unit)}, {_count(groups, 'group')}; {what}: {', '.join(marked)}")
        return lines


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def _percent(x: float) -> str:
    return "0%" if x == 0 else "<0.01%" if x < 5e-5 else f"{100 * x:.2f}%"


# ---------------------------------------------------------------------------
# Reading headers and masks
# ---------------------------------------------------------------------------


def image_header(path: str | os.PathLike, page: int = 0) -> tuple[int, int, str]:
    """(H, W, "grey" | "colour") of a 2-D image from its header, as ``reading.read_image`` would
    decode it (a TIFF at page ``page`` through its photometric interpretation, as preprocessing
    reads it with tifffile first; upright, by the file's EXIF Orientation)."""
    return _header(Path(path), page)[:3]


def _header(path: Path, page: int = 0) -> tuple[int, int, str, int, int]:
    """``image_header``, the file's EXIF (TIFF) Orientation (1: upright as stored) and its page count."""
    errors = []
    if is_tiff(path):
        try:
            h, w, channels, orientation, pages = tiff_header(path, page)
            kind = "grey" if channels == 1 else "colour"
            return (
                (w, h, kind, orientation, pages) if orientation >= 5 else (h, w, kind, orientation, pages)
            )  # 5..8 swap H and W
        except FoldersDataError:
            raise
        except Exception as exc:  # tifffile raises many types (bad tags, truncated header)
            errors.append(f"tifffile: {exc}")
    try:
        with open_image(path, FoldersDataError) as img:
            pages = getattr(img, "n_frames", 1) if is_tiff(path) else 1
            if page and is_tiff(path):  # as reading._decode falls back to Pillow
                check_page(path, page, pages)
                img.seek(page)
            mode, (width, height), orientation = img.mode, img.size, exif_orientation(img)
    except FoldersDataError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        errors.append(f"{exc}" if not errors else f"Pillow: {exc}")
        raise FoldersDataError(f"{path}: cannot read the image ({'; '.join(errors)}); {DAMAGED_HINT}") from None
    if orientation >= 5:  # read upright: orientations 5..8 swap H and W
        width, height = height, width
    if mode in _GREY_MODES or mode.startswith("I;16"):
        return height, width, "grey", orientation, pages
    if mode in _COLOUR_MODES:
        return height, width, "colour", orientation, pages
    raise FoldersDataError(f"{path}: unsupported Pillow mode {mode}")


def _volume_header(path: Path, nifti_axis: int) -> tuple[tuple[int, int, int], dict]:
    """(slices, H, W) of a NIfTI volume cut along ``nifti_axis``, and its geometry as
    ``reading._read_volume`` gives it, from the header alone."""
    import SimpleITK as sitk  # noqa: PLC0415  (SimpleITK costs ~70 ms; only 3-D volumes need it, and the DAG loads this module)

    reader = sitk.ImageFileReader()
    reader.SetFileName(str(path))
    try:
        reader.ReadImageInformation()
    except RuntimeError as exc:
        raise FoldersDataError(f"{path}: cannot read as NIfTI ({str(exc).strip().splitlines()[-1]})") from None
    size = reader.GetSize()  # (i, j, k)
    if len(size) != 3:
        raise FoldersDataError(f"{path}: expected a 3-D volume, got {len(size)} dimensions {size}")
    # reading._read_volume: array order (k, j, i), NIfTI axis a first, the others in array order.
    height, width = (size[a] for a in (2, 1, 0) if a != nifti_axis)
    geometry = {"direction": reader.GetDirection(), "origin": reader.GetOrigin(), "spacing": reader.GetSpacing()}
    return (size[nifti_axis], height, width), geometry


@dataclass
class _Pair:
    """What one image/mask pair (or volume pair) holds: rows of the store it makes and its values."""

    slices: int = 1
    size: tuple[int, int] | None = None
    channels: str | None = None
    values: dict[int, int] = field(default_factory=dict)  # mask value -> pixels
    foreground: list[int] = field(default_factory=list)  # per row: pixels of classes >= 1
    present: list[tuple[int, ...]] = field(default_factory=list)  # per row: the classes its mask holds
    orientation: int = 1
    multipage: list[tuple[Path, int]] = field(default_factory=list)  # (file, pages) of a multi-page TIFF
    problem: str | None = None


def _read_pair(pair: tuple, options: FoldersOptions) -> _Pair:
    stem, image_path, mask_path, fmt = pair
    out = _Pair()
    try:
        if fmt == "nifti":
            (out.slices, h, w), grid = _volume_header(image_path, options.nifti_axis)
            out.size, out.channels = (h, w), "grey"
            mask, mask_grid = _read_volume(mask_path, options.nifti_axis)
            if mask.shape != (out.slices, h, w):
                raise FoldersDataError(
                    f"{image_path} has shape {(out.slices, h, w)} (slices, H, W) but its mask "
                    f"{mask_path} has {mask.shape}"
                )
            differs = _geometry_difference(grid, mask_grid)  # as reading._volume_samples refuses it
            if differs is not None:
                raise FoldersDataError(
                    f"{image_path} and its mask {mask_path} are not on one voxel grid: {differs} "
                    "(image vs mask); resample the mask onto its image (nearest neighbour) or fix its header"
                )
            if mask.dtype.kind == "f" and (not np.isfinite(mask).all() or not np.array_equal(mask, np.round(mask))):
                raise FoldersDataError(
                    f"{mask_path}: a mask must hold integer values; found non-integer {mask.dtype} values"
                )
            mask = mask.astype(np.int64)
        else:
            h, w, out.channels, out.orientation, pages = _header(image_path, options.tiff_page)
            out.size = (h, w)
            mask, mask_pages = read_folders_mask(mask_path, options.tiff_page)  # preprocessing's own reading
            mask = mask[None]
            out.multipage = [(p, n) for p, n in ((image_path, pages), (mask_path, mask_pages)) if n > 1]
            if mask.shape[1:] != (h, w):
                raise FoldersDataError(
                    f"{image_path} is {w}x{h} but its mask {mask_path} is {mask.shape[2]}x{mask.shape[1]}"
                )
        found, counts = np.unique(mask, return_counts=True)
        out.values = dict(zip(found.tolist(), counts.tolist()))
        mapping = options.class_of_value
        if any(v not in mapping for v in out.values):
            _map_mask(found, mapping, mask_path)  # raises preprocessing's own message
        background = [v for v, c in mapping.items() if c == 0]
        out.foreground = (
            mask.reshape(len(mask), -1).shape[1] - np.isin(mask, background).reshape(len(mask), -1).sum(1)
        ).tolist()
        out.present = [tuple(sorted({mapping[v] for v in np.unique(m).tolist()})) for m in mask]
    except FoldersDataError as exc:
        out.problem = str(exc)
    return out


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


def inspect_folders(
    options: Mapping | FoldersOptions,
    name: str = "",
    *,
    size_problem: Callable[[int, int], str | None] | None = None,
    threads: int = THREADS,
) -> DataReport:
    """The report of one ``folders`` data section; never raises for bad data (each problem is a line
    of the report). ``options`` that are themselves wrong raise ``ConfigError``. ``size_problem(H, W)``:
    why the task's model cannot take images of that size, or None (the caller knows the model; the
    data layer does not)."""
    options = FoldersOptions.from_dict(options, where=f"data.{name}" if name else "folders")
    report = DataReport(name, options)
    try:
        root = _check_root(options.root)
        sites = discover_sites(root, options.kind)
    except FoldersDataError as exc:
        report.problems.append(str(exc))
        return report
    with ThreadPoolExecutor(max(1, threads)) as pool:
        if options.kind == "segmentation":
            metas = {site: _segmentation_site(root, site, options, report, pool) for site in sites}
        else:
            metas = _classification_sites(root, options, report, pool)
    metas = _groups(report, root, metas)
    _split(report, metas)
    _check_sizes(report, size_problem)
    _check_classes(report)
    return report


def _file_problems(report: DataReport, site: str, problems: list[str]) -> None:
    report.problems += problems[:MAX_FILE_PROBLEMS]
    if len(problems) > MAX_FILE_PROBLEMS:
        report.problems.append(f"site {site}: {len(problems) - MAX_FILE_PROBLEMS} more file(s) with problems")


def _check_channels(report: DataReport, site: SiteReport, kinds: list[tuple[Path, str]]) -> None:
    first = {kind: path for path, kind in reversed(kinds)}  # the first file of each kind
    if len(first) > 1:
        report.problems.append(
            f"site {site.site}: mixed channels: {site.channels['grey']} grey and {site.channels['colour']} colour images "
            f"(e.g. {first['grey']} is grey, {first['colour']} is colour); preprocessing needs one kind per site"
        )


def _multipage(report: DataReport, site: str, files: list[tuple[Path, int]], root: Path) -> None:
    """The preprocessing log's warning about a site's multi-page TIFF files, worded as the report's."""
    warning = multipage_warning(site, files, root, report.options.tiff_page)
    if warning:
        report.warnings.append(warning.replace(f"folders {site}: warning: ", f"site {site}: ", 1))


def _segmentation_site(root: Path, site: str, options: FoldersOptions, report: DataReport, pool) -> pd.DataFrame | None:
    rep = SiteReport(site, class_pixels=[0] * options.num_classes)
    report.sites.append(rep)
    try:
        pairs = list_pairs(root, site, options.mask_suffix)
    except FoldersDataError as exc:
        report.problems.append(str(exc))
        return None
    read = list(pool.map(lambda pair: _read_pair(pair, options), pairs))
    rows, problems, kinds, multipage = [], [], [], []
    for (stem, image_path, _, fmt), got in zip(pairs, read):
        rep.files += 1
        multipage += got.multipage
        rep.volumes += fmt == "nifti"
        rep.upright += got.orientation != 1
        if got.problem:
            problems.append(got.problem)
        if got.channels:
            rep.channels[got.channels] += 1
            kinds.append((image_path, got.channels))
        if got.size:
            rep.sizes[got.size] += got.slices
        for value, n in got.values.items():
            rep.mask_values[value] = rep.mask_values.get(value, 0) + n
            index = options.class_of_value.get(value)
            if index is not None and index < len(rep.class_pixels):
                rep.class_pixels[index] += n
        foreground = got.foreground if len(got.foreground) == got.slices else [np.nan] * got.slices
        present = got.present if len(got.present) == got.slices else [()] * got.slices
        # As folders._segmentation_site builds the store: one row per image or slice, a volume one group.
        rows += [
            {"group": f"{site}/{stem}", "source": _relative(image_path, root), "foreground": fg, "classes": cs}
            for fg, cs in zip(foreground, present)
        ]
    _file_problems(report, site, problems)
    _check_channels(report, rep, kinds)
    _multipage(report, site, multipage, root)
    meta = pd.DataFrame(rows, columns=["group", "source", "foreground", "classes"])
    rep.samples, rep.groups = len(meta), meta["group"].nunique()
    return meta


def _classification_sites(
    root: Path, options: FoldersOptions, report: DataReport, pool
) -> dict[str, pd.DataFrame | None]:
    try:
        table = _labelled_images(root, options)  # labels.csv: columns, labels, files
    except FoldersDataError as exc:
        report.problems.append(str(exc))
        return {}
    unlisted = _unlisted_message(root, table)  # preprocessing stops on it; the rest is still worth seeing
    if (
        options.group_pattern is None
        and options.groups_csv is None
        and options.split_csv is None
        and (table["group"] == "").all()
    ):
        warning = subject_column_warning(table, LABEL_COLUMNS + OPTIONAL_LABEL_COLUMNS + ("label_index", "path"))
        if warning:
            report.warnings.append(warning)
    if unlisted:
        report.problems.append(unlisted)
    tables = {site: rows.reset_index(drop=True) for site, rows in table.groupby("site", sort=True)}

    def header(path):
        try:
            return _header(path, options.tiff_page)
        except FoldersDataError as exc:
            return str(exc)

    metas = {}
    for site, table in tables.items():
        rep = SiteReport(site, class_images=np.bincount(table["label_index"], minlength=options.num_classes).tolist())
        report.sites.append(rep)
        problems, kinds, multipage = [], [], []
        for path, got in zip(table["path"], pool.map(header, list(table["path"]))):
            rep.files += 1
            if isinstance(got, str):
                problems.append(got)
                continue
            rep.sizes[got[:2]] += 1
            rep.channels[got[2]] += 1
            rep.upright += got[3] != 1
            kinds.append((path, got[2]))
            if got[4] > 1:
                multipage.append((path, got[4]))
        _file_problems(report, site, problems)
        _check_channels(report, rep, kinds)
        _multipage(report, site, multipage, root)
        sources = [_relative(p, root) for p in table["path"]]
        # As folders._classification_site builds the store: an image without a group is its own group.
        groups = [f"{site}/{g}" if g else f"{site}/{s}" for g, s in zip(table["group"], sources)]
        metas[site] = pd.DataFrame(
            {
                "group": groups,
                "source": sources,
                "foreground": np.nan,
                "label": [options.classes[k] for k in table["label_index"]],
            }
        )
        rep.samples, rep.groups = len(table), len(set(groups))
    return metas


def _groups(report: DataReport, root: Path, metas: dict[str, pd.DataFrame | None]) -> dict[str, pd.DataFrame | None]:
    """The user's groups (group_pattern, groups_csv) put into the store-like tables as preprocessing
    puts them into the store; a problem with them leaves no split to show. Without them: one warning
    when file names suggest several images per patient while every image is its own group."""
    options = report.options
    if options.group_pattern is None and options.groups_csv is None:
        if options.split_csv is None:  # a user split already says which images go together
            own = {
                site: [src.rsplit("/", 1)[-1] for src in meta["source"].unique()]
                for site, meta in metas.items()
                if meta is not None and len(meta) and meta["group"].nunique() == meta["source"].nunique()
            }
            warning = prefix_warning(own)
            if warning:
                report.warnings.append(warning)
            stems = repeated_stem_warning({site: list(metas[site]["source"].unique()) for site in own})
            if stems:
                report.warnings.append(stems)
        return metas
    if any(meta is None for meta in metas.values()) or not metas:
        report.warnings.append(f"{groups_source(options)} not checked: fix the problems above first")
        return {site: None for site in metas}
    try:
        groups = assign_groups(root, options, {site: list(meta["source"]) for site, meta in metas.items()})
    except FoldersDataError as exc:
        report.problems.append(str(exc))
        return {site: None for site in metas}
    shared = shared_group_warning(groups, groups_source(options)) if options.groups_csv is not None else None
    if shared:
        report.warnings.append(shared)
    out = {}
    for site, meta in metas.items():
        out[site] = meta.assign(group=[f"{site}/{groups[site][s]}" for s in meta["source"]])
        report.site(site).groups = out[site]["group"].nunique()
    return out


def _split(report: DataReport, metas: dict[str, pd.DataFrame | None]) -> None:
    """Samples per split with folders' own split code: the seeded cut of the groups, or the user's CSV."""
    options = report.options
    if options.split_csv is not None:
        if any(meta is None for meta in metas.values()) or not metas:
            report.warnings.append(f"split_csv {options.split_csv} not checked: fix the problems above first")
            return
        notes: list[str] = []
        try:
            chosen = _read_user_split(Path(options.split_csv), metas, notes.append)
        except FoldersDataError as exc:
            report.problems.append(str(exc))
            return
        # folders logs "folders <site>: warning: <what>"; the report names the site as its other lines do.
        report.warnings += [re.sub(r"^folders (.+?): warning: ", r"site \1: ", note) for note in notes]
    else:
        chosen = {}
        for site, meta in metas.items():
            if meta is None:
                continue
            try:
                chosen[site] = _seeded_split(site, meta, options, "seeded", options.seed)
            except FoldersDataError as exc:
                report.problems.append(str(exc))
    user = Path(options.split_csv).name if options.split_csv is not None else None
    for site, (rows, names) in chosen.items():
        rep = report.site(site)
        rep.split = {s: int((names == s).sum()) for s in SPLITS}
        groups = metas[site]["group"].to_numpy(str)[rows]
        rep.split_classes = _split_classes(metas[site], rows, names, report.class_names)
        report.warnings += [f"site {site}: {note}" for note in class_notes(metas[site], rows, names, options, user)]
        if len(set(groups)) < metas[site]["source"].nunique():  # some group holds several files: show them
            rep.group_splits = {
                s: sorted(Counter(g.split("/", 1)[1] for g in groups[names == s]).items()) for s in SPLITS
            }
        foreground = metas[site]["foreground"].to_numpy(np.float64)[rows]
        test = foreground[names == "test"]
        if options.kind == "segmentation" and len(test) and not np.isnan(test).any() and test.sum() == 0:
            report.warnings.append(
                f"site {site}: no foreground pixel (class >= 1) in the test split: its foreground Dice is undefined"
            )


def _split_classes(meta: pd.DataFrame, rows: np.ndarray, names: np.ndarray, classes: Sequence[str]) -> dict:
    """Per split: its samples, its groups, and per class the images of that class (classification:
    the ``label`` column) or the samples whose mask holds it (segmentation: the ``classes`` column)."""
    groups = meta["group"].to_numpy(str)[rows]
    if "label" in meta.columns:
        index = {name: k for k, name in enumerate(classes)}
        held = [(index[str(v)],) for v in meta["label"].to_numpy()[rows]]
    else:
        held = list(meta["classes"].to_numpy()[rows])
    out = {}
    for name in SPLITS:
        counts = [0] * len(classes)
        for present, chosen in zip(held, names == name):
            if chosen:
                for k in present:
                    counts[k] += 1
        out[name] = (int((names == name).sum()), len(set(groups[names == name])), counts)
    return out


def _check_sizes(report: DataReport, size_problem: Callable[[int, int], str | None] | None) -> None:
    options = report.options
    sizes = Counter()
    for site in report.sites:
        sizes.update(site.sizes)
    if options.image_size is None and len(sizes) > 1:
        shown = ", ".join(f"{h}x{w} ({n})" for (h, w), n in sizes.most_common(4)) + (", ..." if len(sizes) > 4 else "")
        report.problems.append(
            f"{len(sizes)} image sizes (H x W) across the sites ({shown}) and no image_size: preprocessing needs "
            "one size; set image_size to resize every image to one square size"
        )
        return
    size = (options.image_size, options.image_size) if options.image_size else next(iter(sizes), None)
    problem = size_problem(*size) if size_problem and size else None
    if problem:
        where = "image_size" if options.image_size else "the images (image_size not set: their size as stored)"
        report.problems.append(f"{where}: {problem}")


def _check_classes(report: DataReport) -> None:
    names, kind = report.class_names, report.options.kind
    per_class = "class_pixels" if kind == "segmentation" else "class_images"
    what = "pixel" if kind == "segmentation" else "image"
    counted = [s for s in report.sites if s.files and getattr(s, per_class) is not None]
    if not counted:
        return
    totals = np.sum([getattr(s, per_class) for s in counted], axis=0)
    for k, name in enumerate(names):
        if totals[k] == 0:
            how = (
                f"mask_values {dict(sorted(report.options.class_of_value.items()))} map no value found to it"
                if kind == "segmentation"
                else f"no row of {LABELS_FILE} has this label"
            )
            report.problems.append(f"class {k} {name!r} has no {what} in any site ({how})")
    for s in counted:  # a class some sites lack (label skew) is legal, and worth knowing: one line per site
        absent = [f"{k} {name!r}" for k, name in enumerate(names) if getattr(s, per_class)[k] == 0 and totals[k]]
        if absent:
            report.warnings.append(
                f"site {s.site}: no {what} of class{'es' if len(absent) > 1 else ''} {', '.join(absent)}"
            )


def builtin_line(name: str, family: str, counts_files: Sequence[str | os.PathLike]) -> str:
    """One line for a built-in family's data section: preprocessing checks its raw layout (against
    the counts of record where the paper gives them); the counts of a built store, where one exists."""
    line = f"data.{name}: built-in family {family}: its preprocessing checks the release's layout and counts of record"
    built = []
    for path in map(Path, counts_files):
        if path.is_file():
            try:
                counts = json.loads(path.read_text())
                built.append(
                    f"{path} ({sum(counts.values())} samples: " + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")"
                )
            except (ValueError, AttributeError, TypeError):
                built.append(f"{path} (unreadable)")
    if built:
        return line + "; built: " + "; ".join(built)
    return (
        line + "; not built yet" + (f" (counts will be in {', '.join(map(str, counts_files))})" if counts_files else "")
    )
