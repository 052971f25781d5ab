"""Multi-site prostate MRI (SAML release ``Processed_data_nii.zip``), HarmoFL protocol.

The release holds six site folders of NIfTI volumes, ``CaseNN.nii.gz`` plus
``CaseNN_segmentation.nii.gz`` (``_Segmentation`` at BMC). HarmoFL renames two
sites (RUNMC -> ISBI, BMC -> ISBI_1.5) and turns every volume into 2.5D
slices:

* clip the volume at its 99th percentile, min-max to 0..255, truncate to uint8;
* for every slice i in 1..D-2 whose mask is not empty: image = slices
  [i-1, i, i+1] as 3 channels (H x W x 3), label = slice i with 2 -> 1;
* cases in the order of the file names in ``<site>-dir.npy`` (sorted names),
  slices in increasing i.

That list is permuted by ``<site>-index.npy`` and cut 64/16/20 at slice level
(so slices of one patient land in train and test: the ``group`` column of the
split CSV makes that leakage visible). The permutations only fit the real
release, whose per-site slice counts (``HARMOFL_SLICE_COUNTS``) double as the
post-download check.

Protocol ``fedlwr`` (Fed-LWR, "PMR"): the same release, clients ``Site1..Site6`` = the
release folders sorted alphabetically (BIDMC, BMC, HK, I2CVB, RUNMC, UCL). Every slice whose
mask is not empty is kept (first and last slices included, as Fed-LWR's ``prepare_pmr``); each
slice is normalised on its own (clip to [min, 99th percentile], min-max to 0..255, rounded: Fed-LWR's
``mr_norm`` divides by the percentile instead of the range, which is the same map when the slice
minimum is 0); mask = label > 0; 384 x 384. Fed-LWR stores single-channel slices but its UNet takes
3 channels: ``fedlwr`` replicates the slice into 3 identical channels, ``fedlwr_stack`` stacks the
normalised neighbours [i-1, i, i+1] (HarmoFL's 2.5D input; the edge slices repeat themselves). The
split is by case, 6:2:2 (val and test get max(1, round(0.2 n)) cases each, train the rest) from a
seeded permutation of the sorted case ids, so no case is in two splits.

``write_synthetic_release`` writes a small archive in the same layout with six
visibly different intensity profiles, for tests and for running the pipeline
without the real data.
"""

from __future__ import annotations

import gzip
import os
import re
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from ..files import atomic_path
from .download import DownloadSpec
from .store import client_rng, grouped_split, list_clients, open_client, split_groups, staged_dir, write_client, write_split_csv

DOWNLOAD = DownloadSpec(
    name="prostate",
    url="gdrive:1TtrjnlnJ1yqr5m4LUGMelKTQXtvZaru-",
    filename="Processed_data_nii.zip",
    sha256=None,  # no published checksum: pin the one logged at the first download
    licence=(
        "No licence stated by the SAML release (https://liuquande.github.io/SAML/). The volumes come from "
        "NCI-ISBI 2013 (TCIA), I2CVB and PROMISE12, each under its own terms; cite those and SAML/MS-Net."
    ),
    manual_step=(
        "If Google Drive refuses the download (quota or virus-scan page), open https://liuquande.github.io/SAML/, "
        "download Processed_data_nii.zip by hand and set data.prostate.archive in config.yaml to its path."
    ),
    homepage="https://liuquande.github.io/SAML/",
)

# Release folder -> HarmoFL client name.
RELEASE_TO_CLIENT = {
    "BIDMC": "BIDMC",
    "BMC": "ISBI_1.5",
    "HK": "HK",
    "I2CVB": "I2CVB",
    "RUNMC": "ISBI",
    "UCL": "UCL",
}
CLIENT_TO_RELEASE = {client: site for site, client in RELEASE_TO_CLIENT.items()}
RELEASE_SITES = sorted(RELEASE_TO_CLIENT)

# Our documented choice: this order is the paper's columns A-F.
HARMOFL_CLIENTS = ["BIDMC", "HK", "I2CVB", "ISBI", "ISBI_1.5", "UCL"]
HARMOFL_SLICE_COUNTS = {"BIDMC": 261, "HK": 157, "I2CVB": 468, "ISBI": 411, "ISBI_1.5": 384, "UCL": 175}
# train/val/test of record, from the HarmoFL index files (reference/MANIFEST.md).
HARMOFL_SPLIT_COUNTS = {
    "BIDMC": (167, 41, 53),
    "HK": (100, 25, 32),
    "I2CVB": (299, 75, 94),
    "ISBI": (263, 65, 83),
    "ISBI_1.5": (245, 62, 77),
    "UCL": (112, 28, 35),
}
HARMOFL_FRACTIONS = (0.64, 0.16, 0.20)

# Case ids per release folder, as listed in HarmoFL's <site>-dir.npy.
RELEASE_CASES = {
    "BIDMC": ["Case00"] + [f"Case{i:02d}" for i in range(2, 13)],
    "BMC": [f"Case{i:02d}" for i in range(30)],
    "HK": [f"Case{i:02d}" for i in range(38, 50)],
    "I2CVB": [f"Case{i:02d}" for i in range(19)],
    "RUNMC": [f"Case{i:02d}" for i in range(30)],
    "UCL": ["Case01"] + [f"Case{i:02d}" for i in range(26, 38)],
}

# The split files of record live in the repository (resources/prostate_harmofl),
# found relative to this file for the editable install the pipeline uses.
DEFAULT_INDEX_DIR = Path(__file__).resolve().parents[3] / "resources" / "prostate_harmofl"

_NIFTI_RE = re.compile(r"^(?P<case>.+?)(?P<seg>_segmentation)?\.nii(?:\.gz)?$", re.IGNORECASE)
_SEARCH_DEPTH = 3


class ProstateDataError(DataError):
    """The raw prostate data do not have the layout or content we expect."""


# ---------------------------------------------------------------------------
# Finding the files
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
    raise ProstateDataError(f"{release_root}: site folder(s) {', '.join(missing)} missing (expected {list(expected)}, found {sorted(names)})")


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
            raise ProstateDataError(f"{path}: case {case} has two {'mask' if match['seg'] else 'image'} files "
                                    f"({table[case].name} and {path.name})")
        table[case] = path
    for case, path in images.items():
        if case not in labels:
            raise ProstateDataError(f"{path}: image has no segmentation file ({case}_segmentation.nii.gz) in {site_dir}")
    for case, path in labels.items():
        if case not in images:
            raise ProstateDataError(f"{path}: segmentation has no image file ({case}.nii.gz) in {site_dir}")
    if not images:
        raise ProstateDataError(f"{site_dir}: no CaseNN.nii.gz volumes found")
    return [(case, images[case], labels[case]) for case in sorted(labels, key=lambda c: labels[c].name)]


def check_nifti_complete(path: str | os.PathLike) -> None:
    """Fail on a cut-short NIfTI file. SimpleITK reads a truncated ``.nii.gz`` without complaint and
    fills the missing voxels with zeros (black slices that still carry prostate labels), so the whole
    gzip stream is decompressed (a broken stream fails here) and its length compared with what the
    NIfTI-1 header promises: vox_offset + prod(dim) * bitpix / 8 bytes."""
    path = Path(path)
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    size, header = 0, b""
    try:
        with opener(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                if len(header) < 348:
                    header += chunk[: 348 - len(header)]
                size += len(chunk)
    except (EOFError, OSError, zlib.error) as exc:
        raise ProstateDataError(f"{path}: damaged or cut-short file ({exc})") from exc
    for endian in "<>":
        if len(header) == 348 and struct.unpack(endian + "i", header[:4])[0] == 348:  # NIfTI-1
            dims = struct.unpack(endian + "8h", header[40:56])
            bitpix = struct.unpack(endian + "h", header[72:74])[0]
            vox_offset = struct.unpack(endian + "f", header[108:112])[0]
            expected = int(vox_offset) + int(np.prod([max(d, 1) for d in dims[1 : dims[0] + 1]])) * bitpix // 8
            if size < expected:
                raise ProstateDataError(f"{path}: cut short: {size} bytes of image data where the header promises {expected}")
            return
    # NIfTI-2 or another format: the stream check above is all we can do without parsing it.


def read_volume(path: str | os.PathLike) -> np.ndarray:
    """A NIfTI volume as a (D, H, W) array, in the file's own dtype."""
    import SimpleITK as sitk  # imported here: only preprocessing needs it

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
        shown = ", ".join(f"{v:g}" for v in found[:6].tolist()) + (f", ... ({len(found)} distinct)" if len(found) > 6 else "")
        raise ProstateDataError(f"{path}: a segmentation must hold non-negative integer classes; found {label.dtype} values {shown}")
    return label


# ---------------------------------------------------------------------------
# HarmoFL slice extraction
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
    from PIL import Image

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
# Split
# ---------------------------------------------------------------------------


def cut_points(n: int, fractions: Sequence[float] = HARMOFL_FRACTIONS) -> tuple[int, int]:
    """(end of train, end of val) for n samples, with HarmoFL's int() truncation.

    HarmoFL computes ``t = 0.8*n*0.8``, train = ``[:int(t)]``, val =
    ``[int(t):int(t + (0.8*n - t))]``; for every n up to 200,000 this equals
    ``int(0.64*n)``, ``int(0.8*n)`` (checked in the tests).
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {tuple(fractions)}")
    train_f, val_f, _ = fractions
    return int(n * train_f), int(n * (train_f + val_f))


def _harmofl_permutation(index_dir: Path, client: str, n: int) -> np.ndarray:
    path = Path(index_dir) / f"{client}-index.npy"
    if not path.is_file():
        raise FileNotFoundError(f"HarmoFL permutation {path} is missing (expected in resources/prostate_harmofl)")
    perm = np.load(path, allow_pickle=False)
    if perm.ndim != 1 or not np.issubdtype(perm.dtype, np.integer):
        raise ProstateDataError(f"{path}: expected a 1-D integer array, got {perm.dtype} {perm.shape}")
    if len(perm) != n:
        raise ProstateDataError(
            f"{path} permutes {len(perm)} slices but client {client} has {n}. The HarmoFL permutations only fit "
            "the real SAML release; for other or synthetic data use `permutation: seeded`."
        )
    if not np.array_equal(np.sort(perm), np.arange(n)):
        raise ProstateDataError(f"{path}: not a permutation of 0..{n - 1}")
    return perm.astype(np.int64)


def split_harmofl(
    store_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    permutation: str = "harmofl",
    index_dir: str | os.PathLike = DEFAULT_INDEX_DIR,
    seed: int = 0,
    fractions: Sequence[float] = HARMOFL_FRACTIONS,
) -> pd.DataFrame:
    """Train/val/test split of every client, written to ``out_csv``.

    ``permutation="harmofl"`` uses HarmoFL's ``<client>-index.npy`` (the slice-level split
    of record); ``"seeded"`` a reproducible case-level split from ``seed`` (no case in two splits). Within
    each split rows keep the permuted order, because HarmoFL later trains every
    client on the first rows of its training split only.
    """
    if permutation not in ("harmofl", "seeded"):
        raise ValueError(f"permutation must be 'harmofl' or 'seeded', got {permutation!r}")
    present = list_clients(store_dir)
    missing = [c for c in HARMOFL_CLIENTS if c not in present]
    if missing:
        raise ProstateDataError(f"store {store_dir} lacks client(s) {missing} (found {present})")
    tables = []
    for client in HARMOFL_CLIENTS:
        meta = open_client(store_dir, client).meta
        n = len(meta)
        if permutation == "harmofl":
            # HarmoFL's slice-level split of record (cases straddle splits, as in the paper).
            perm = _harmofl_permutation(Path(index_dir), client, n)
            train_end, val_end = cut_points(n, fractions)
            split = np.where(np.arange(n) < train_end, "train", np.where(np.arange(n) < val_end, "val", "test"))
        else:
            # Our seeded split keeps every case in one split.
            rng = client_rng(seed, client)
            perm, split = grouped_split(meta["group"].to_numpy(str), rng, lambda cases: case_cut_points(cases, fractions, client))
            order = np.argsort([{"train": 0, "val": 1, "test": 2}[s] for s in split], kind="stable")
            perm, split = perm[order], split[order]
        tables.append(
            pd.DataFrame(
                {
                    "client": client,
                    "split": split,
                    "row": perm,
                    "id": meta["id"].to_numpy()[perm],
                    "group": meta["group"].to_numpy()[perm],
                }
            )
        )
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table


# ---------------------------------------------------------------------------
# Synthetic twin of the release
# ---------------------------------------------------------------------------

# Per-site acquisition "style": the six must differ clearly after HarmoFL's
# min-max normalisation, so they differ in gamma, contrast, bias and noise, not
# only in scale/offset (which the normalisation removes).
_SITE_STYLE = {
    "BIDMC": dict(scale=300.0, offset=20.0, gamma=1.0, contrast=0.45, bias=0.15, noise=0.02),
    "BMC": dict(scale=900.0, offset=100.0, gamma=0.55, contrast=0.30, bias=0.35, noise=0.06),
    "HK": dict(scale=120.0, offset=0.0, gamma=1.7, contrast=0.80, bias=0.05, noise=0.01),
    "I2CVB": dict(scale=2000.0, offset=300.0, gamma=0.75, contrast=0.25, bias=0.50, noise=0.10),
    "RUNMC": dict(scale=600.0, offset=50.0, gamma=1.3, contrast=0.60, bias=0.25, noise=0.03),
    "UCL": dict(scale=80.0, offset=10.0, gamma=2.2, contrast=1.00, bias=0.10, noise=0.04),
}


def _smooth_field(rng: np.random.Generator, z, y, x, terms: int = 4) -> np.ndarray:
    """A smooth random texture in about [-1, 1]: a few low-frequency cosines."""
    field = 0.0
    for _ in range(terms):
        fz, fy, fx = rng.uniform(0.5, 2.5, size=3)
        phase = rng.uniform(0, 2 * np.pi)
        field = field + np.cos(2 * np.pi * (fz * z + fy * y + fx * x) + phase)
    return field / terms


def _synthetic_case(
    rng: np.random.Generator, site: str, case_index: int, depth: int, size: int
) -> tuple[np.ndarray, np.ndarray]:
    style = _SITE_STYLE[site]
    z, y, x = np.ogrid[0:depth, 0:size, 0:size]
    zn, yn, xn = z / max(depth - 1, 1), y / max(size - 1, 1), x / max(size - 1, 1)  # in [0, 1]

    # Prostate-like blob; every third case is long enough to reach the first
    # and last slices, so the edge-slice exclusion is exercised.
    cz = (depth - 1) / 2 + rng.uniform(-0.1, 0.1) * depth
    rz = (0.65 if case_index % 3 == 0 else rng.uniform(0.25, 0.38)) * depth
    cy, cx = size / 2 + rng.uniform(-0.12, 0.12, size=2) * size
    ry, rx = rng.uniform(0.12, 0.22, size=2) * size
    wobble = 1 + 0.08 * np.cos(3 * np.arctan2(y - cy, x - cx) + rng.uniform(0, 2 * np.pi))
    dist = np.sqrt(((z - cz) / rz) ** 2 + ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2) / wobble
    gland = dist < 1.0
    label = gland.astype(np.uint8)
    if site in ("RUNMC", "BMC"):  # NCI-ISBI sites carry two zones: central (2) inside peripheral (1)
        label[dist < 0.55] = 2

    # Body (pelvis) ellipse on a dark background, soft tissue texture inside.
    body = ((y - size / 2) / (0.46 * size)) ** 2 + ((x - size / 2) / (0.40 * size)) ** 2 < 1.0
    body = np.broadcast_to(body, (depth, size, size))
    tissue = 0.30 + 0.06 * _smooth_field(rng, zn, yn, xn)
    base = np.where(body, tissue, 0.04)
    texture = 0.5 + 0.12 * _smooth_field(rng, 2 * zn, 3 * yn, 3 * xn)
    base = np.where(gland, base + style["contrast"] * texture, base)
    if site in ("RUNMC", "BMC"):
        base = np.where(dist < 0.55, base - 0.15 * style["contrast"], base)
    base = np.clip(base, 0.0, None) ** style["gamma"]

    # Smooth multiplicative bias field (coil inhomogeneity), then noise, then scanner scale/offset.
    bias = 1 + style["bias"] * (0.6 * (yn - 0.5) + 0.4 * (xn - 0.5) + 0.5 * _smooth_field(rng, 0.3 * zn, yn, xn, 2))
    signal = base * bias + style["noise"] * rng.standard_normal((depth, size, size))
    image = style["offset"] + style["scale"] * np.clip(signal, 0.0, None)
    return image.astype(np.float32), label


def write_synthetic_release(
    zip_path: str | os.PathLike,
    seed: int = 0,
    cases_per_site: int = 3,
    depth: int = 10,
    size: int = 64,
    *,
    top_folder: bool = True,
) -> dict[str, dict]:
    """Write a small fake ``Processed_data_nii.zip`` in the layout of the real release.

    Real site folders and case ids (the first ``cases_per_site`` of each site),
    ``_Segmentation`` at BMC, float32 images and uint8 masks ({0,1,2} at RUNMC
    and BMC). Deterministic in ``seed``. Returns, per release site, the client
    name, case ids, mask values and the number of HarmoFL slices it will give.
    """
    import SimpleITK as sitk

    if not 1 <= cases_per_site <= min(len(c) for c in RELEASE_CASES.values()):
        raise ValueError(f"cases_per_site must be between 1 and 12, got {cases_per_site}")
    if depth < 3 or size < 8:
        raise ValueError(f"need depth >= 3 and size >= 8, got depth={depth}, size={size}")
    zip_path = Path(zip_path)
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    prefix = "Processed_data_nii/" if top_folder else ""
    info: dict[str, dict] = {}
    with (
        atomic_path(zip_path) as tmp_zip,
        tempfile.TemporaryDirectory() as work,
        zipfile.ZipFile(tmp_zip, "w", zipfile.ZIP_STORED) as zf,
    ):
        if top_folder:
            zf.writestr(zipfile.ZipInfo(prefix), b"")
        for site_index, site in enumerate(RELEASE_SITES):
            zf.writestr(zipfile.ZipInfo(f"{prefix}{site}/"), b"")
            seg = "_Segmentation" if site == "BMC" else "_segmentation"
            cases = RELEASE_CASES[site][:cases_per_site]
            n_slices, values = 0, set()
            for case_index, case in enumerate(cases):
                rng = np.random.default_rng([seed, site_index, case_index])
                image, label = _synthetic_case(rng, site, case_index, depth, size)
                n_slices += sum(bool(label[i].any()) for i in range(1, depth - 1))
                values |= set(np.unique(label).tolist())
                for array, name in ((image, f"{case}.nii.gz"), (label, f"{case}{seg}.nii.gz")):
                    local = Path(work) / name
                    sitk.WriteImage(sitk.GetImageFromArray(array), str(local), True)
                    zf.write(local, f"{prefix}{site}/{name}")
            info[site] = {
                "client": RELEASE_TO_CLIENT[site],
                "cases": cases,
                "label_values": sorted(values),
                "slices": n_slices,
            }
    return info


# ---------------------------------------------------------------------------
# Fed-LWR protocol
# ---------------------------------------------------------------------------

FEDLWR_CLIENTS = [f"Site{i}" for i in range(1, len(RELEASE_SITES) + 1)]
FEDLWR_CLIENT_TO_RELEASE = dict(zip(FEDLWR_CLIENTS, RELEASE_SITES))  # Site1 = BIDMC ... Site6 = UCL
FEDLWR_FRACTIONS = (0.6, 0.2, 0.2)
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


def fedlwr_slices(image: np.ndarray, label: np.ndarray, channels: str = "replicate") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    needed = sorted({j for i in keep for j in ((i,) if channels == "replicate" else (max(i - 1, 0), i, min(i + 1, depth - 1)))})
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
                    raise ProstateDataError(f"{img_path} has shape {image.shape} but its mask {lab_path.name} has {label.shape}")
                x, y, idx = fedlwr_slices(image, label, channels)
                inner += int(((idx >= 1) & (idx <= image.shape[0] - 2)).sum())
                if x.shape[1:3] != (size, size):
                    x, y = _resize(x, y, size)
                images.append(x)
                labels.append(y)
                for s in idx:
                    rows.append({
                        "id": f"{client}/{case}/s{s:03d}",
                        "group": f"{client}/{case}",
                        "source": img_path.relative_to(raw_root).as_posix(),
                        "case": case,
                        "slice": int(s),
                        "site": release,
                        "label_source": lab_path.relative_to(raw_root).as_posix(),
                    })
            if not rows:
                raise ProstateDataError(f"{site_dir}: no case has a non-empty mask")
            if expect_real_counts and inner != HARMOFL_SLICE_COUNTS[harmofl_name]:
                problems.append(f"{client} ({release}): {inner} foreground slices inside 1..D-2, HarmoFL has "
                                f"{HARMOFL_SLICE_COUNTS[harmofl_name]}")
            counts[client] = len(rows)
            write_client(tmp_store, client, np.concatenate(images), np.concatenate(labels), pd.DataFrame(rows))
            log(f"prostate {client} = {release} (folder {site_dir.name}): {len(cases)} cases, {len(rows)} slices, "
                f"channels {channels}")
        if problems:
            raise ProstateDataError(
                "the prostate data do not match the real SAML release:\n  " + "\n  ".join(problems)
                + "\n(for other or synthetic data set expect_real_counts to false)"
            )
    return counts


def case_cut_points(n_cases: int, fractions: Sequence[float] = FEDLWR_FRACTIONS, client: str = "") -> tuple[int, int]:
    """(end of train, end of val) in cases: val and test get max(1, round(f * n)) cases, train the rest."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {tuple(fractions)}")
    n_val = max(1, int(np.floor(fractions[1] * n_cases + 0.5)))
    n_test = max(1, int(np.floor(fractions[2] * n_cases + 0.5)))
    n_train = n_cases - n_val - n_test
    if n_train < 1:
        where = f"client {client}: " if client else ""
        raise ProstateDataError(f"{where}{n_cases} case(s) are too few for a case-level train/val/test split (need 3)")
    return n_train, n_train + n_val


def split_fedlwr(
    store_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    permutation: str = "seeded",
    seed: int = 0,
    fractions: Sequence[float] = FEDLWR_FRACTIONS,
) -> pd.DataFrame:
    """Case-level train/val/test split of Site1..Site6, written to ``out_csv``.

    Cases are sorted by id, then permuted (``"seeded"``: generator seeded with (seed,
    crc32(client)); ``"sorted"``: no shuffle, Fed-LWR's "first cases = train") and cut with
    ``case_cut_points``. Inside a split, rows follow the store order (case, slice).
    """
    if permutation not in ("seeded", "sorted"):
        raise ValueError(f"permutation must be 'seeded' or 'sorted', got {permutation!r}")
    present = list_clients(store_dir)
    missing = [c for c in FEDLWR_CLIENTS if c not in present]
    if missing:
        raise ProstateDataError(f"store {store_dir} lacks client(s) {missing} (found {present})")
    tables = []
    for client in FEDLWR_CLIENTS:
        meta = open_client(store_dir, client).meta
        rng = client_rng(seed, client) if permutation == "seeded" else None
        names = split_groups(meta["group"].to_numpy(str), rng, lambda cases: case_cut_points(cases, fractions, client))
        rank = {"train": 0, "val": 1, "test": 2}
        rows = np.argsort([rank[name] for name in names], kind="stable").astype(np.int64)  # store order inside a split
        tables.append(pd.DataFrame({"client": client, "split": names[rows], "row": rows,
                                    "id": meta["id"].to_numpy()[rows], "group": meta["group"].to_numpy()[rows]}))
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table


# --- the family interface (fedmedbench.data) --------------------------------------------------
DOWNLOADS = [DOWNLOAD]
PROTOCOLS = {"harmofl": HARMOFL_CLIENTS, "fedlwr": FEDLWR_CLIENTS, "fedlwr_stack": FEDLWR_CLIENTS}


def write_synthetic(out_dir: str | os.PathLike, seed: int = 0, **options) -> dict:
    return write_synthetic_release(Path(out_dir) / DOWNLOAD.filename, seed=seed, **options)


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"prostate: unknown protocol {protocol!r}; known: {sorted(PROTOCOLS)}")


def preprocess(raw: dict, store_dir, protocol: str, *, expect_real_counts: bool = False, size: int | None = None, log=print) -> dict:
    """``harmofl``: HarmoFL's 2.5D slices; ``fedlwr`` / ``fedlwr_stack``: Fed-LWR's slices, replicated / stacked."""
    _check_protocol(protocol)
    raw_root = Path(raw[DOWNLOAD.filename])
    if protocol == "harmofl":
        return preprocess_harmofl(raw_root, Path(store_dir), expect_real_counts=expect_real_counts, size=size, log=log)
    return preprocess_fedlwr(raw_root, Path(store_dir), channels=FEDLWR_CHANNELS[protocol],
                             expect_real_counts=expect_real_counts, size=size, log=log)


def split(store_dir, out_csv, protocol: str, *, permutation: str = "default", seed: int = 0) -> pd.DataFrame:
    """``harmofl``: ``harmofl`` (= ``default``, HarmoFL's index files) or ``seeded``.
    ``fedlwr*``: ``seeded`` (= ``default``, case-level 6:2:2) or ``sorted``."""
    _check_protocol(protocol)
    if protocol == "harmofl":
        permutation = "harmofl" if permutation == "default" else permutation
        return split_harmofl(Path(store_dir), Path(out_csv), permutation=permutation, seed=seed)
    permutation = "seeded" if permutation == "default" else permutation
    return split_fedlwr(Path(store_dir), Path(out_csv), permutation=permutation, seed=seed)
