"""Reading the SAML release (NIfTI volumes per site) into the canonical store, per protocol."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from .. import nifti
from ..store import staged_dir, write_client
from .sites import (
    CLIENT_TO_RELEASE,
    DEFAULT_INDEX_DIR,
    FEDLWR_CLIENT_TO_RELEASE,
    FEDLWR_CLIENTS,
    HARMOFL_CLIENTS,
    HARMOFL_SLICE_COUNTS,
    RELEASE_SITES,
    RELEASE_TO_CLIENT,
    ProstateDataError,
)

_NIFTI_RE = re.compile(r"^(?P<case>.+?)(?P<seg>_segmentation)?\.nii(?:\.gz)?$", re.IGNORECASE)
_SEARCH_DEPTH = 3


# ---------------------------------------------------------------------------
# Finding and reading the files
# ---------------------------------------------------------------------------


def _subdir_names(folder: Path) -> set[str]:
    try:
        return {p.name for p in folder.iterdir() if p.is_dir()}
    except OSError:
        return set()


def find_release_root(extracted: str | os.PathLike) -> Path:
    """The folder that holds the six site folders, with or without ``Processed_data_nii/`` on top.

    Release names (BIDMC, BMC, HK, I2CVB, RUNMC, UCL) and HarmoFL's renamed
    layout (BIDMC, HK, I2CVB, ISBI, ISBI_1.5, UCL) are both recognised.
    """
    extracted = Path(extracted)
    if not extracted.is_dir():
        raise ProstateDataError(f"prostate raw folder {extracted} does not exist")
    wanted = (set(RELEASE_SITES), set(HARMOFL_CLIENTS))
    seen: list[str] = []
    level = [extracted]
    for _ in range(_SEARCH_DEPTH + 1):
        next_level = []
        for folder in sorted(level):
            names = _subdir_names(folder)
            if any(w <= names for w in wanted):
                return folder
            seen.append(f"{folder}: {sorted(names) if names else '(no subfolders)'}")
            next_level += [folder / n for n in sorted(names) if n != "__MACOSX" and not n.startswith(".")]
        level = next_level
    listing = "\n  ".join(seen[:20]) + ("\n  ..." if len(seen) > 20 else "")
    raise ProstateDataError(
        f"{extracted}: no folder containing the six prostate site folders {RELEASE_SITES} "
        f"(or HarmoFL's {HARMOFL_CLIENTS}) within {_SEARCH_DEPTH} levels. Folders found:\n  {listing}"
    )


def client_site_dirs(release_root: str | os.PathLike) -> dict[str, Path]:
    """HarmoFL client name -> site folder, for either naming of the release."""
    release_root = Path(release_root)
    names = _subdir_names(release_root)
    if set(RELEASE_SITES) <= names:
        return {client: release_root / CLIENT_TO_RELEASE[client] for client in HARMOFL_CLIENTS}
    if set(HARMOFL_CLIENTS) <= names:
        return {client: release_root / client for client in HARMOFL_CLIENTS}
    # Name the missing site(s) of whichever naming the folder is closer to.
    expected = max((RELEASE_SITES, HARMOFL_CLIENTS), key=lambda sites: len(set(sites) & names))
    missing = [site for site in expected if site not in names]
    raise ProstateDataError(
        f"{release_root}: site folder(s) {', '.join(missing)} missing (expected {list(expected)}, found {sorted(names)})"
    )


def list_cases(site_dir: str | os.PathLike) -> list[tuple[str, Path, Path]]:
    """``(case_id, image_path, label_path)`` for every case of a site folder.

    Masks are recognised case-insensitively (BMC writes ``_Segmentation``).
    The order is that of the mask file names, which is how HarmoFL walks its
    sorted ``<site>-dir.npy``; for the release's fixed-width ``CaseNN`` ids
    this is case-id order.
    """
    site_dir = Path(site_dir)
    if not site_dir.is_dir():
        raise ProstateDataError(f"site folder {site_dir} does not exist")
    images: dict[str, Path] = {}
    labels: dict[str, Path] = {}
    for path in sorted(site_dir.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue  # macOS ._ files, .DS_Store
        match = _NIFTI_RE.match(path.name)
        if match is None:
            continue  # not a NIfTI volume
        case = match["case"]
        table = labels if match["seg"] else images
        if case in table:
            raise ProstateDataError(
                f"{path}: case {case} has two {'mask' if match['seg'] else 'image'} files "
                f"({table[case].name} and {path.name})"
            )
        table[case] = path
    for case, path in images.items():
        if case not in labels:
            raise ProstateDataError(
                f"{path}: image has no segmentation file ({case}_segmentation.nii.gz) in {site_dir}"
            )
    for case, path in labels.items():
        if case not in images:
            raise ProstateDataError(f"{path}: segmentation has no image file ({case}.nii.gz) in {site_dir}")
    if not images:
        raise ProstateDataError(f"{site_dir}: no CaseNN.nii.gz volumes found")
    return [(case, images[case], labels[case]) for case in sorted(labels, key=lambda c: labels[c].name)]


def check_nifti_complete(path: str | os.PathLike) -> None:
    """Fail on a cut-short NIfTI file with a ``ProstateDataError`` (``nifti.check_nifti_complete``)."""
    nifti.check_nifti_complete(path, ProstateDataError)


def read_volume(path: str | os.PathLike) -> np.ndarray:
    """A NIfTI volume as a (D, H, W) array, in the file's own dtype."""
    import SimpleITK as sitk  # noqa: PLC0415  (SimpleITK costs ~70 ms; only 3-D volumes need it, and the DAG loads this module)

    check_nifti_complete(path)
    try:
        array = sitk.GetArrayFromImage(sitk.ReadImage(str(path)))
    except RuntimeError as exc:
        raise ProstateDataError(f"{path}: cannot read as NIfTI ({str(exc).strip().splitlines()[-1]})") from exc
    if array.ndim != 3:
        raise ProstateDataError(f"{path}: expected a 3-D volume, got array shape {array.shape}")
    return array


def read_label_volume(path: str | os.PathLike) -> np.ndarray:
    """A segmentation volume, refused (naming the file) unless it holds non-negative integer classes:
    a soft or negative mask would otherwise be thresholded silently (Fed-LWR's ``label > 0``)."""
    label = read_volume(path)
    if label.size and (not np.isfinite(label).all() or label.min() < 0 or not np.array_equal(label, np.round(label))):
        found = np.unique(label)
        shown = ", ".join(f"{v:g}" for v in found[:6].tolist()) + (
            f", ... ({len(found)} distinct)" if len(found) > 6 else ""
        )
        raise ProstateDataError(
            f"{path}: a segmentation must hold non-negative integer classes; found {label.dtype} values {shown}"
        )
    return label


# ---------------------------------------------------------------------------
# HarmoFL protocol: 2.5D slices
# ---------------------------------------------------------------------------


def harmofl_normalize(volume: np.ndarray) -> np.ndarray:
    """HarmoFL's intensity mapping of a whole volume to uint8.

    Clip above the volume's 99th percentile, min-max to [0, 1], times 255,
    truncate (``astype``, not rounding: that is what HarmoFL does). Computed
    in float64. A volume whose p99 equals its minimum maps to zeros instead of
    dividing by zero.
    """
    vol = np.asarray(volume, dtype=np.float64)
    if not np.isfinite(vol).all():
        raise ProstateDataError("image volume contains NaN or infinite values")
    high = np.percentile(vol, 99)
    low = vol.min()
    if high <= low:
        return np.zeros(vol.shape, dtype=np.uint8)
    scaled = (np.minimum(vol, high) - low) / (high - low)
    return (scaled * 255).astype(np.uint8)


def harmofl_slices(image: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """2.5D samples of one case: (images uint8 n x H x W x 3, labels uint8 n x H x W, slice indices).

    Slices 0 and D-1 are never centre slices (they lack a neighbour), and
    slices whose mask is empty are dropped. Labels > 1 (the second NCI-ISBI
    zone at RUNMC/BMC) are merged into 1.
    """
    image = np.asarray(image)
    label = np.asarray(label)
    if image.ndim != 3 or image.shape != label.shape:
        raise ProstateDataError(f"image {image.shape} and label {label.shape} must be 3-D with the same shape")
    if label.size and (label.min() < 0 or not np.array_equal(label, np.round(label))):
        raise ProstateDataError("label volume must hold non-negative integer classes")
    merged = (label >= 1).astype(np.uint8)  # == HarmoFL's label[label > 1] = 1 for such labels
    norm = harmofl_normalize(image)
    depth = image.shape[0]
    keep = [i for i in range(1, depth - 1) if merged[i].any()]
    h, w = image.shape[1:]
    if not keep:
        return (
            np.zeros((0, h, w, 3), np.uint8),
            np.zeros((0, h, w), np.uint8),
            np.zeros(0, np.int64),
        )
    stacks = np.stack([np.moveaxis(norm[i - 1 : i + 2], 0, -1) for i in keep])
    return stacks, merged[keep], np.asarray(keep, dtype=np.int64)


def _resize(images: np.ndarray, labels: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Square in-plane resize: bilinear for the 3-channel images, nearest for the masks."""
    out_i = np.empty((images.shape[0], size, size, images.shape[3]), np.uint8)
    out_l = np.empty((labels.shape[0], size, size), np.uint8)
    for k in range(images.shape[0]):
        out_i[k] = np.asarray(Image.fromarray(images[k], "RGB").resize((size, size), Image.Resampling.BILINEAR))
        out_l[k] = np.asarray(Image.fromarray(labels[k], "L").resize((size, size), Image.Resampling.NEAREST))
    return out_i, out_l


def _check_against_dir_list(client: str, site_dir: Path, cases, index_dir: Path) -> list[str]:
    """Compare the files found with HarmoFL's ``<client>-dir.npy``; return problems as text."""
    dir_file = Path(index_dir) / f"{client}-dir.npy"
    if not dir_file.is_file():
        return [f"{client}: cannot check file names, {dir_file} is missing"]
    expected = {str(name) for name in np.load(dir_file, allow_pickle=False)}
    found = {p.name for _, img, lab in cases for p in (img, lab)}

    def few(names: set[str]) -> str:
        names = sorted(names)
        return f"{len(names)} file(s), e.g. {names[:4]}"

    problems = []
    if expected - found:
        problems.append(f"{client} ({site_dir}): missing {few(expected - found)} listed in {dir_file.name}")
    if found - expected:
        problems.append(f"{client} ({site_dir}): {few(found - expected)} not in {dir_file.name}")
    return problems


def preprocess_harmofl(
    raw_root: str | os.PathLike,
    store_dir: str | os.PathLike,
    expect_real_counts: bool,
    size: int | None = None,
    log: Callable[[str], object] = print,
    *,
    index_dir: str | os.PathLike = DEFAULT_INDEX_DIR,
) -> dict[str, int]:
    """Build the canonical store (one client per HarmoFL site) from the raw release.

    ``raw_root`` is the extraction folder (the release root is found inside).
    With ``expect_real_counts`` the file names must match HarmoFL's
    ``<site>-dir.npy`` and the slice counts ``HARMOFL_SLICE_COUNTS``; every
    mismatch is listed in one error and no store is written. The whole store
    is built in a temporary folder and renamed at the end.
    Returns the number of slices per client.
    """
    raw_root = Path(raw_root)
    site_dirs = client_site_dirs(find_release_root(raw_root))
    if size is not None and (not isinstance(size, int) or size <= 0):
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    counts: dict[str, int] = {}
    problems: list[str] = []
    with staged_dir(store_dir) as tmp_store:
        for client in HARMOFL_CLIENTS:
            site_dir = site_dirs[client]
            cases = list_cases(site_dir)
            if expect_real_counts:
                problems += _check_against_dir_list(client, site_dir, cases, Path(index_dir))
            images, labels, rows = [], [], []
            shape = None
            for case, img_path, lab_path in cases:
                image, label = read_volume(img_path), read_label_volume(lab_path)
                if image.shape != label.shape:
                    raise ProstateDataError(
                        f"{img_path} has shape {image.shape} but its mask {lab_path.name} has {label.shape}"
                    )
                x, y, idx = harmofl_slices(image, label)
                if size is not None and x.shape[1:3] != (size, size):
                    x, y = _resize(x, y, size)
                if shape is None:
                    shape = image.shape[1:]
                elif image.shape[1:] != shape and size is None:
                    raise ProstateDataError(
                        f"{img_path}: in-plane size {image.shape[1:]} differs from {shape} of the first case "
                        f"of {site_dir}; set a common size (data.prostate.size) to resize"
                    )
                images.append(x)
                labels.append(y)
                source = img_path.relative_to(raw_root).as_posix()
                for s in idx:
                    rows.append(
                        {
                            "id": f"{client}/{case}/s{s:03d}",
                            "group": f"{client}/{case}",
                            "source": source,
                            "case": case,
                            "slice": int(s),
                            "label_source": lab_path.relative_to(raw_root).as_posix(),
                        }
                    )
            if not rows:
                raise ProstateDataError(f"{site_dir}: no case has a non-empty mask in slices 1..D-2")
            counts[client] = len(rows)
            write_client(tmp_store, client, np.concatenate(images), np.concatenate(labels), pd.DataFrame(rows))
            log(f"prostate {client} (folder {site_dir.name}): {len(cases)} cases, {len(rows)} slices")
        if expect_real_counts:
            problems += [
                f"{c}: {counts[c]} slices, HarmoFL has {HARMOFL_SLICE_COUNTS[c]}"
                for c in HARMOFL_CLIENTS
                if counts[c] != HARMOFL_SLICE_COUNTS[c]
            ]
            if problems:
                raise ProstateDataError(
                    "the prostate data do not match the real SAML release used by HarmoFL:\n  "
                    + "\n  ".join(problems)
                    + "\n(for other or synthetic data set expect_real_counts to false and use permutation: seeded)"
                )
    return counts


# ---------------------------------------------------------------------------
# Fed-LWR protocol
# ---------------------------------------------------------------------------


FEDLWR_SIZE = 384
FEDLWR_CHANNELS = {"fedlwr": "replicate", "fedlwr_stack": "stack"}


def fedlwr_normalize_slice(image: np.ndarray) -> np.ndarray:
    """One 2-D slice to uint8: clip to [min, p99], min-max to [0, 1], times 255, rounded.

    Fed-LWR's ``mr_norm`` clips the same way and then computes ``(x - min) / p99``; for a slice
    whose minimum is 0 (MR magnitude background) the two agree up to the factor 255. A slice whose
    p99 equals its minimum maps to zeros.
    """
    x = np.asarray(image, dtype=np.float64)
    if x.ndim != 2:
        raise ProstateDataError(f"expected a 2-D slice, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ProstateDataError("image slice contains NaN or infinite values")
    low, high = x.min(), np.percentile(x, 99)
    if high <= low:
        return np.zeros(x.shape, np.uint8)
    return np.round((np.clip(x, low, high) - low) / (high - low) * 255).astype(np.uint8)


def fedlwr_slices(
    image: np.ndarray, label: np.ndarray, channels: str = "replicate"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fed-LWR samples of one case: (images n x H x W x 3, binary labels n x H x W, slice indices).

    Every slice with a non-empty mask is kept, edges included. ``channels="replicate"``: the
    normalised slice three times; ``"stack"``: normalised slices [i-1, i, i+1], clamped at the
    volume's ends.
    """
    if channels not in ("replicate", "stack"):
        raise ValueError(f"channels must be 'replicate' or 'stack', got {channels!r}")
    image, label = np.asarray(image), np.asarray(label)
    if image.ndim != 3 or image.shape != label.shape:
        raise ProstateDataError(f"image {image.shape} and label {label.shape} must be 3-D with the same shape")
    binary = (label > 0).astype(np.uint8)
    keep = [i for i in range(image.shape[0]) if binary[i].any()]
    h, w = image.shape[1:]
    if not keep:
        return np.zeros((0, h, w, 3), np.uint8), np.zeros((0, h, w), np.uint8), np.zeros(0, np.int64)
    depth = image.shape[0]
    needed = sorted(
        {j for i in keep for j in ((i,) if channels == "replicate" else (max(i - 1, 0), i, min(i + 1, depth - 1)))}
    )
    norm = {j: fedlwr_normalize_slice(image[j]) for j in needed}
    if channels == "replicate":
        stacks = [np.stack([norm[i]] * 3, axis=-1) for i in keep]
    else:
        stacks = [np.stack([norm[max(i - 1, 0)], norm[i], norm[min(i + 1, depth - 1)]], axis=-1) for i in keep]
    return np.stack(stacks), binary[keep], np.asarray(keep, dtype=np.int64)


def fedlwr_site_dirs(release_root: str | os.PathLike) -> dict[str, Path]:
    """``Site1..Site6`` -> site folder (release or HarmoFL naming), Site k = k-th release name in sorted order."""
    harmofl = client_site_dirs(release_root)
    return {site: harmofl[RELEASE_TO_CLIENT[release]] for site, release in FEDLWR_CLIENT_TO_RELEASE.items()}


def preprocess_fedlwr(
    raw_root: str | os.PathLike,
    store_dir: str | os.PathLike,
    *,
    channels: str = "replicate",
    expect_real_counts: bool = False,
    size: int | None = None,
    log: Callable[[str], object] = print,
    index_dir: str | os.PathLike = DEFAULT_INDEX_DIR,
) -> dict[str, int]:
    """Build the Fed-LWR store (clients Site1..Site6); returns the slices per client.

    ``size`` defaults to 384 (volumes of another in-plane size are resized: bilinear images,
    nearest masks). With ``expect_real_counts`` the file names must match HarmoFL's
    ``<site>-dir.npy`` and the kept slices inside 1..D-2 must number HarmoFL's per-site counts
    (the same volumes and masks, so the same foreground slices); mismatches stop with one error
    and nothing written.
    """
    size = FEDLWR_SIZE if size is None else size
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    raw_root = Path(raw_root)
    site_dirs = fedlwr_site_dirs(find_release_root(raw_root))
    counts: dict[str, int] = {}
    problems: list[str] = []
    with staged_dir(store_dir) as tmp_store:
        for client in FEDLWR_CLIENTS:
            release = FEDLWR_CLIENT_TO_RELEASE[client]
            harmofl_name = RELEASE_TO_CLIENT[release]
            site_dir = site_dirs[client]
            cases = sorted(list_cases(site_dir), key=lambda c: c[0])
            if expect_real_counts:
                problems += _check_against_dir_list(harmofl_name, site_dir, cases, Path(index_dir))
            images, labels, rows, inner = [], [], [], 0
            for case, img_path, lab_path in cases:
                image, label = read_volume(img_path), read_label_volume(lab_path)
                if image.shape != label.shape:
                    raise ProstateDataError(
                        f"{img_path} has shape {image.shape} but its mask {lab_path.name} has {label.shape}"
                    )
                x, y, idx = fedlwr_slices(image, label, channels)
                inner += int(((idx >= 1) & (idx <= image.shape[0] - 2)).sum())
                if x.shape[1:3] != (size, size):
                    x, y = _resize(x, y, size)
                images.append(x)
                labels.append(y)
                for s in idx:
                    rows.append(
                        {
                            "id": f"{client}/{case}/s{s:03d}",
                            "group": f"{client}/{case}",
                            "source": img_path.relative_to(raw_root).as_posix(),
                            "case": case,
                            "slice": int(s),
                            "site": release,
                            "label_source": lab_path.relative_to(raw_root).as_posix(),
                        }
                    )
            if not rows:
                raise ProstateDataError(f"{site_dir}: no case has a non-empty mask")
            if expect_real_counts and inner != HARMOFL_SLICE_COUNTS[harmofl_name]:
                problems.append(
                    f"{client} ({release}): {inner} foreground slices inside 1..D-2, HarmoFL has "
                    f"{HARMOFL_SLICE_COUNTS[harmofl_name]}"
                )
            counts[client] = len(rows)
            write_client(tmp_store, client, np.concatenate(images), np.concatenate(labels), pd.DataFrame(rows))
            log(
                f"prostate {client} = {release} (folder {site_dir.name}): {len(cases)} cases, {len(rows)} slices, "
                f"channels {channels}"
            )
        if problems:
            raise ProstateDataError(
                "the prostate data do not match the real SAML release:\n  "
                + "\n  ".join(problems)
                + "\n(for other or synthetic data set expect_real_counts to false)"
            )
    return counts
