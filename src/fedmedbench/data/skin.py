"""Dermoscopy, PRR-FL protocol: HAM10000 (clients A-C and the OOD cohort) + ISIC 2017 (client D).

Raw files (``DOWNLOADS``), all under their real names:

* ``HAM10000_images_part1.zip`` / ``HAM10000_images_part2.zip``: 5,000 + 5,015 JPEGs
  ``ISIC_00xxxxx.jpg`` (600 x 450), Harvard Dataverse doi:10.7910/DVN/DBW86T (terms to accept:
  manual download);
* ``HAM10000_metadata.csv``: the Dataverse metadata, the version **with the ``dataset`` column**
  (acquisition source). FLamby's byte copy ships in ``resources/ham10000/`` and can be used as is;
* ``ISIC-2017_Training_Data.zip``: 2,000 ``ISIC_<7 digits>.jpg`` (plus superpixel PNGs and a
  metadata CSV, ignored), ISIC challenge S3;
* ``ISIC-2017_Training_Part3_GroundTruth.csv``: ``image_id,melanoma,seborrheic_keratosis``.

Clients (PRR-FL Table 1): A = HAM ``vidir_modern``, B = ``vidir_molemax``, C = ``rosendahl``, each
restricted to ``dx`` in {nv, bkl, mel}; D = the ISIC 2017 training set. The out-of-distribution cohort
(PRR-FL Table 3, 427 images) is HAM ``vienna_dias`` restricted to the same classes; it is written as
the extra store client ``OOD`` whose rows are all ``test`` in the split file. Labels: nv / nevus = 0,
bkl / seborrheic keratosis = 1, mel / melanoma = 2 (int64).

Images: centre square crop on the shorter side, then one resize to ``size`` x ``size`` (128 by
default) with Pillow's BILINEAR filter. Pillow widens the filter support by the downscale factor,
so this is an antialiased (triangle-filter) downscale, the same as torchvision's default ``Resize``
on PIL images; PRR-FL's own resize method is unpublished. JPEGs are decoded in full (no draft
mode) and converted to RGB; EXIF orientation is ignored (as PRR-FL's cv2 reader does by default
for these files, which carry no rotation).

Split of record: PRR-FL's CSVs (``resources/skin_prrfl/client{A..D}/{train,valid,test}_client{X}.csv``)
with their row order; only ``image_id`` and ``label`` are read (client D's train/valid files misuse
the ``lesion_id``/``dx`` columns for the ISIC 2017 flags). Synthetic data cannot match those ids,
so ``permutation="seeded"`` draws a class-stratified 70/10/20 split from ``seed`` instead.
``group`` = HAM ``lesion_id`` (several images of one lesion share it), or the image id for ISIC.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError
from .archive import write_zip_atomic
from .download import MANUAL, DownloadSpec
from .store import atomic_write_text, client_rng, grouped_split, list_clients, open_client, staged_dir, write_client, write_split_csv

# ---------------------------------------------------------------------------
# Raw files
# ---------------------------------------------------------------------------

HAM_PART1 = "HAM10000_images_part1.zip"
HAM_PART2 = "HAM10000_images_part2.zip"
HAM_METADATA = "HAM10000_metadata.csv"
ISIC_IMAGES = "ISIC-2017_Training_Data.zip"
ISIC_GT = "ISIC-2017_Training_Part3_GroundTruth.csv"

HAM_DOI = "https://doi.org/10.7910/DVN/DBW86T"
HAM_LICENCE = (
    "HAM10000 (Tschandl et al., Sci. Data 2018), Harvard Dataverse doi:10.7910/DVN/DBW86T: the Dataverse "
    "dataset terms must be accepted; the ISIC Archive lists the images as CC BY-NC 4.0 (non-commercial, "
    "attribution). Cite Tschandl, Rosendahl & Kittler 2018."
)
ISIC_LICENCE = (
    "ISIC 2017 challenge training data (Codella et al. 2018), ISIC Archive terms: CC BY-NC 4.0 per the "
    "archive (per-image licences may apply); cite the ISIC 2017 challenge paper."
)


def _ham_manual_step(filename: str, what: str) -> str:
    return (
        f"Open {HAM_DOI} (Harvard Dataverse, HAM10000), accept the dataset terms, download {what} and set "
        f"data.skin.files.{filename}.archive in config.yaml to the path of the downloaded file."
    )


DOWNLOADS = [
    DownloadSpec(
        name="skin",
        url=MANUAL,
        filename=HAM_PART1,
        sha256=None,  # none published: pin the one logged at the first download
        licence=HAM_LICENCE,
        manual_step=_ham_manual_step(HAM_PART1, "HAM10000_images_part1.zip (5,000 JPEGs)"),
        homepage=HAM_DOI,
    ),
    DownloadSpec(
        name="skin",
        url=MANUAL,
        filename=HAM_PART2,
        sha256=None,
        licence=HAM_LICENCE,
        manual_step=_ham_manual_step(HAM_PART2, "HAM10000_images_part2.zip (5,015 JPEGs)"),
        homepage=HAM_DOI,
    ),
    DownloadSpec(
        name="skin",
        url=MANUAL,
        filename=HAM_METADATA,
        # FLamby's copy of the Dataverse original (resources/ham10000/HAM10000_metadata.csv).
        sha256="de17ec44cb25ea9c3f6378ba18d69224c740afd62e86ec2edc6a894d6aa663d3",
        licence=HAM_LICENCE,
        manual_step=(
            "Set data.skin.files.HAM10000_metadata.csv.archive in config.yaml to "
            "resources/ham10000/HAM10000_metadata.csv (FLamby's byte copy of the Dataverse file, sha256 pinned). "
            f"Or open {HAM_DOI}, accept the terms, download HAM10000_metadata in its original format (CSV with "
            "the 'dataset' column; the Kaggle copy lacks it and cannot be used), set that key to its path and "
            "override data.skin.files.HAM10000_metadata.csv.sha256 if its hash differs."
        ),
        homepage=HAM_DOI,
    ),
    DownloadSpec(
        name="skin",
        url="https://isic-challenge-data.s3.amazonaws.com/2017/ISIC-2017_Training_Data.zip",
        filename=ISIC_IMAGES,
        sha256=None,
        licence=ISIC_LICENCE,
        manual_step=(
            "Download https://isic-challenge-data.s3.amazonaws.com/2017/ISIC-2017_Training_Data.zip "
            "(ISIC 2017 challenge, https://challenge.isic-archive.com/data/#2017) in a browser and set "
            "data.skin.files.ISIC-2017_Training_Data.zip.archive in config.yaml to its path."
        ),
        homepage="https://challenge.isic-archive.com/landing/2017/",
    ),
    DownloadSpec(
        name="skin",
        url="https://isic-challenge-data.s3.amazonaws.com/2017/ISIC-2017_Training_Part3_GroundTruth.csv",
        filename=ISIC_GT,
        sha256=None,
        licence=ISIC_LICENCE,
        manual_step=(
            "Download https://isic-challenge-data.s3.amazonaws.com/2017/ISIC-2017_Training_Part3_GroundTruth.csv "
            "in a browser and set data.skin.files.ISIC-2017_Training_Part3_GroundTruth.csv.archive in config.yaml "
            "to its path."
        ),
        homepage="https://challenge.isic-archive.com/landing/2017/",
    ),
]

# ---------------------------------------------------------------------------
# Clients, classes, expected counts
# ---------------------------------------------------------------------------

CLASSES = ("nv", "bkl", "mel")
CLASS_INDEX = {name: i for i, name in enumerate(CLASSES)}
CLIENT_SOURCES = {"A": "vidir_modern", "B": "vidir_molemax", "C": "rosendahl"}
ISIC_CLIENT = "D"
OOD_CLIENT = "OOD"
OOD_SOURCE = "vienna_dias"
PRRFL_CLIENTS = ["A", "B", "C", "D"]
STORE_CLIENTS = PRRFL_CLIENTS + [OOD_CLIENT]
PROTOCOLS = {"prrfl": PRRFL_CLIENTS}

# nv/bkl/mel per client: PRR-FL Table 1 (= HAM10000 metadata) and the OOD cohort.
EXPECTED_CLASS_COUNTS = {
    "A": (1832, 475, 680),
    "B": (3720, 124, 24),
    "C": (803, 490, 342),
    "D": (1372, 254, 374),
    "OOD": (350, 10, 67),
}
# train/valid/test rows of PRR-FL's CSVs (reference/MANIFEST.md).
PRRFL_SPLIT_COUNTS = {"A": (2091, 298, 598), "B": (2708, 386, 774), "C": (1144, 163, 328), "D": (1400, 199, 401)}
PRRFL_FRACTIONS = (0.7, 0.1, 0.2)
HAM_COLUMNS = ("lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization", "dataset")
DEFAULT_SIZE = 128
RESAMPLE = "bilinear"  # Pillow BILINEAR, antialiased (support scaled by the downscale factor)

DEFAULT_SPLIT_DIR = Path(__file__).resolve().parents[3] / "resources" / "skin_prrfl"
_CSV_SPLITS = (("train", "train"), ("valid", "val"), ("test", "test"))
_IMAGE_RE = re.compile(r"^ISIC_\d{7}\.jpg$")
_DECODE_THREADS = max(1, min(8, os.cpu_count() or 1))


class SkinDataError(DataError):
    """The raw dermoscopy data do not have the layout or content we expect."""


# ---------------------------------------------------------------------------
# Metadata and ground truth
# ---------------------------------------------------------------------------


def read_ham_metadata(path: str | os.PathLike) -> pd.DataFrame:
    """The HAM10000 metadata as strings (comma- or tab-separated; Dataverse offers both).

    Requires the eight Dataverse columns including ``dataset``; ``image_id`` must be unique and
    carry no ``.jpg`` (copies that append it, or that add augmented rows, are other files).
    """
    path = Path(path)
    if not path.is_file():
        raise SkinDataError(f"HAM10000 metadata {path} does not exist")
    try:
        with open(path, encoding="utf-8-sig") as fh:
            first = fh.readline()
        sep = "\t" if "\t" in first else ","
        meta = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SkinDataError(f"{path}: not a readable CSV/TSV file ({exc})") from exc
    meta.columns = [str(c).strip() for c in meta.columns]
    missing = [c for c in HAM_COLUMNS if c not in meta.columns]
    if missing:
        hint = (
            " The 'dataset' (acquisition source) column exists only in the Harvard Dataverse version of the "
            "metadata (the Kaggle copy lacks it); use resources/ham10000/HAM10000_metadata.csv or the Dataverse file."
            if "dataset" in missing
            else ""
        )
        raise SkinDataError(f"{path}: missing column(s) {missing}; found {list(meta.columns)}.{hint}")
    meta = meta[list(HAM_COLUMNS)].apply(lambda col: col.str.strip())
    bad = meta["image_id"][~meta["image_id"].str.fullmatch(r"ISIC_\d{7}")]
    if len(bad):
        raise SkinDataError(
            f"{path}: {len(bad)} image_id value(s) are not of the form ISIC_<7 digits>, e.g. {list(bad.head(3))} "
            "(this is not the Dataverse HAM10000 metadata)"
        )
    dup = meta["image_id"][meta["image_id"].duplicated()]
    if len(dup):
        raise SkinDataError(f"{path}: duplicated image_id(s) {list(dup.head(5))}")
    return meta


def select_ham(meta: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Clients A, B, C and the OOD cohort from the HAM10000 metadata.

    Rows with ``dx`` in {nv, bkl, mel} of the four sources, sorted by ``image_id``, with an int
    ``label`` column. Other classes (akiec, bcc, df, vasc) are dropped.
    """
    kept = meta[meta["dx"].isin(CLASSES)]
    sources = {**CLIENT_SOURCES, OOD_CLIENT: OOD_SOURCE}
    result = {}
    for client, source in sources.items():
        rows = kept[kept["dataset"] == source].sort_values("image_id", kind="stable").reset_index(drop=True)
        rows = rows.assign(label=rows["dx"].map(CLASS_INDEX).astype(np.int64))
        result[client] = rows
    return result


def read_isic2017_ground_truth(path: str | os.PathLike) -> pd.DataFrame:
    """``image_id, melanoma, seborrheic_keratosis, label`` sorted by id; label mel -> 2, else SK -> 1, else 0."""
    path = Path(path)
    if not path.is_file():
        raise SkinDataError(f"ISIC 2017 ground truth {path} does not exist")
    try:
        gt = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SkinDataError(f"{path}: not a readable CSV file ({exc})") from exc
    gt.columns = [str(c).strip() for c in gt.columns]
    wanted = ["image_id", "melanoma", "seborrheic_keratosis"]
    missing = [c for c in wanted if c not in gt.columns]
    if missing:
        raise SkinDataError(f"{path}: missing column(s) {missing}; found {list(gt.columns)}")
    gt = gt[wanted].apply(lambda col: col.str.strip())
    flags = {}
    for col in wanted[1:]:
        values = pd.to_numeric(gt[col], errors="coerce")
        bad = gt[col][~values.isin([0.0, 1.0])]
        if len(bad):
            raise SkinDataError(f"{path}: column {col!r} must hold 0/1 (0.0/1.0), found {sorted(set(bad))[:5]}")
        flags[col] = values.astype(np.int64)
    bad_ids = gt["image_id"][~gt["image_id"].str.fullmatch(r"ISIC_\d{7}")]
    if len(bad_ids):
        raise SkinDataError(f"{path}: image_id value(s) not of the form ISIC_<7 digits>: {list(bad_ids.head(3))}")
    dup = gt["image_id"][gt["image_id"].duplicated()]
    if len(dup):
        raise SkinDataError(f"{path}: duplicated image_id(s) {list(dup.head(5))}")
    label = np.where(flags["melanoma"] == 1, 2, np.where(flags["seborrheic_keratosis"] == 1, 1, 0)).astype(np.int64)
    out = pd.DataFrame(
        {"image_id": gt["image_id"], "melanoma": flags["melanoma"], "seborrheic_keratosis": flags["seborrheic_keratosis"],
         "label": label}
    )
    return out.sort_values("image_id", kind="stable").reset_index(drop=True)


def class_counts(labels: Iterable[int]) -> tuple[int, int, int]:
    counts = np.bincount(np.asarray(list(labels), dtype=np.int64), minlength=len(CLASSES))
    return tuple(int(c) for c in counts[: len(CLASSES)])


# ---------------------------------------------------------------------------
# PRR-FL split files
# ---------------------------------------------------------------------------


def read_prrfl_split(split_dir: str | os.PathLike = DEFAULT_SPLIT_DIR) -> pd.DataFrame:
    """PRR-FL's split of record as ``client, split, image_id, label`` (CSV row order kept).

    Only ``image_id`` and ``label`` are used: client D's train/valid files carry the ISIC 2017
    flags in their ``lesion_id``/``dx`` columns and blanks elsewhere, its test file other columns.
    """
    split_dir = Path(split_dir)
    tables = []
    for client in PRRFL_CLIENTS:
        for csv_name, split in _CSV_SPLITS:
            path = split_dir / f"client{client}" / f"{csv_name}_client{client}.csv"
            if not path.is_file():
                raise FileNotFoundError(f"PRR-FL split file {path} is missing (expected in resources/skin_prrfl)")
            df = pd.read_csv(path, dtype=str, keep_default_na=False)
            missing = [c for c in ("image_id", "label") if c not in df.columns]
            if missing:
                raise SkinDataError(f"{path}: missing column(s) {missing}")
            labels = pd.to_numeric(df["label"], errors="coerce")
            if labels.isna().any() or not labels.isin([0, 1, 2]).all():
                raise SkinDataError(f"{path}: column 'label' must hold 0, 1 or 2")
            tables.append(
                pd.DataFrame({"client": client, "split": split, "image_id": df["image_id"].str.strip(),
                              "label": labels.astype(np.int64)})
            )
    table = pd.concat(tables, ignore_index=True)
    dup = table[table.duplicated(subset=["client", "image_id"], keep=False)]
    if len(dup):
        raise SkinDataError(f"{split_dir}: image(s) listed twice in PRR-FL's CSVs: {dup.head(4).to_dict('records')}")
    return table


def check_prrfl_membership(client_ids: dict[str, Iterable[str]], split_dir: str | os.PathLike = DEFAULT_SPLIT_DIR) -> list[str]:
    """Differences between our clients A-D and the union of PRR-FL's CSVs, as text (empty = equal)."""
    prrfl = read_prrfl_split(split_dir)
    problems = []
    for client in PRRFL_CLIENTS:
        ours = set(client_ids.get(client, ()))
        theirs = set(prrfl.loc[prrfl["client"] == client, "image_id"])
        if ours - theirs:
            problems.append(f"client {client}: {len(ours - theirs)} image(s) not in PRR-FL's CSVs, e.g. {sorted(ours - theirs)[:3]}")
        if theirs - ours:
            problems.append(f"client {client}: {len(theirs - ours)} PRR-FL image(s) missing, e.g. {sorted(theirs - ours)[:3]}")
    return problems


# ---------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------


def find_images(folders: dict[str, Path]) -> dict[str, tuple[str, Path]]:
    """``image_id -> (raw file name, path)`` for every ``ISIC_<7 digits>.jpg`` under the folders.

    ``folders`` maps a raw file name (e.g. the zip) to its extracted folder. Superpixel PNGs,
    metadata CSVs, ``__MACOSX/`` and ``._*`` files are ignored. An id found twice is an error.
    """
    found: dict[str, tuple[str, Path]] = {}
    for raw_name, folder in folders.items():
        folder = Path(folder)
        if not folder.is_dir():
            raise SkinDataError(f"{raw_name}: extracted folder {folder} does not exist")
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__MACOSX" and not d.startswith("."))
            for name in sorted(filenames):
                if not _IMAGE_RE.match(name):
                    continue
                image_id = name[: -len(".jpg")]
                path = Path(dirpath) / name
                if image_id in found:
                    raise SkinDataError(f"image {image_id} found twice: {found[image_id][1]} and {path}")
                found[image_id] = (raw_name, path)
    return found


def load_square(path: str | os.PathLike, size: int) -> tuple[np.ndarray, tuple[int, int]]:
    """Centre square crop on the shorter side, resized to ``size`` x ``size`` RGB; also (width, height)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            width, height = img.size
            side = min(width, height)
            left, top = (width - side) // 2, (height - side) // 2
            # crop first: resize(box=...) would let the filter reach pixels outside the square
            out = img.crop((left, top, left + side, top + side)).resize((size, size), Image.Resampling.BILINEAR)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise SkinDataError(f"{path}: cannot decode the image ({exc})") from exc
    return np.asarray(out, dtype=np.uint8), (width, height)


def _load_many(paths: list[Path], size: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    with ThreadPoolExecutor(_DECODE_THREADS) as pool:  # Pillow releases the GIL while decoding
        results = list(pool.map(lambda p: load_square(p, size), paths))
    return np.stack([r[0] for r in results]), [r[1] for r in results]


# ---------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------


def _raw_path(raw: dict, name: str) -> Path:
    if name not in raw:
        raise SkinDataError(f"raw input {name!r} not given (got {sorted(raw)}); the skin family needs {[s.filename for s in DOWNLOADS]}")
    return Path(raw[name])


def _missing_message(what: str, ids: list[str], where: Iterable[Path]) -> str:
    return (
        f"{len(ids)} {what} image(s) listed in the metadata are not in the extracted archives, e.g. {ids[:5]}; "
        f"searched: {', '.join(str(p) for p in where)}"
    )


def preprocess_prrfl(
    raw: dict,
    store_dir: str | os.PathLike,
    *,
    expect_real_counts: bool = False,
    size: int | None = None,
    log: Callable[[str], object] = print,
    split_dir: str | os.PathLike = DEFAULT_SPLIT_DIR,
) -> dict[str, int]:
    """Write clients A, B, C, D and OOD to the store; returns their sizes.

    With ``expect_real_counts`` the metadata must give PRR-FL Table 1's class counts, the OOD
    cohort 427 (350/10/67), and the image ids of A-D must equal PRR-FL's CSVs; these checks run
    on the metadata before any image is decoded, and every mismatch is listed in one error.
    """
    size = DEFAULT_SIZE if size is None else size
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    ham_meta_path, gt_path = _raw_path(raw, HAM_METADATA), _raw_path(raw, ISIC_GT)
    ham_dirs = {HAM_PART1: _raw_path(raw, HAM_PART1), HAM_PART2: _raw_path(raw, HAM_PART2)}
    isic_dirs = {ISIC_IMAGES: _raw_path(raw, ISIC_IMAGES)}

    clients = select_ham(read_ham_metadata(ham_meta_path))
    gt = read_isic2017_ground_truth(gt_path)
    counts_by_class = {c: class_counts(df["label"]) for c, df in clients.items()}
    counts_by_class[ISIC_CLIENT] = class_counts(gt["label"])
    for client in STORE_CLIENTS:
        log(f"skin {client}: nv/bkl/mel = {'/'.join(map(str, counts_by_class[client]))} in the metadata")
    if expect_real_counts:
        problems = [
            f"client {c}: nv/bkl/mel = {counts_by_class[c]}, expected {EXPECTED_CLASS_COUNTS[c]}"
            for c in STORE_CLIENTS
            if counts_by_class[c] != EXPECTED_CLASS_COUNTS[c]
        ]
        ids = {c: clients[c]["image_id"] for c in CLIENT_SOURCES}
        ids[ISIC_CLIENT] = gt["image_id"]
        problems += check_prrfl_membership(ids, split_dir)
        if problems:
            raise SkinDataError(
                f"the dermoscopy data ({ham_meta_path.name}, {gt_path.name}) do not match PRR-FL's:\n  "
                + "\n  ".join(problems)
                + "\n(for other or synthetic data set expect_real_counts to false and use permutation: seeded)"
            )

    ham_images = find_images(ham_dirs)
    isic_images = find_images(isic_dirs)
    needed = sorted(i for df in clients.values() for i in df["image_id"] if i not in ham_images)
    if needed:
        raise SkinDataError(_missing_message("HAM10000", needed, ham_dirs.values()))
    missing_isic = sorted(i for i in gt["image_id"] if i not in isic_images)
    if missing_isic:
        raise SkinDataError(_missing_message(f"ISIC 2017 (from {gt_path.name})", missing_isic, isic_dirs.values()))
    extra = len(set(isic_images) - set(gt["image_id"]))
    if extra:
        log(f"skin D: {extra} image(s) in {ISIC_IMAGES} have no ground-truth row and are ignored")

    def source(entry: tuple[str, Path]) -> str:
        raw_name, path = entry
        return f"{raw_name}/{path.relative_to(Path(raw[raw_name])).as_posix()}"

    counts: dict[str, int] = {}
    with staged_dir(store_dir) as tmp_store:
        for client in STORE_CLIENTS:
            if client == ISIC_CLIENT:
                table = gt
                entries = [isic_images[i] for i in table["image_id"]]
                extras = {"label_name": [CLASSES[k] for k in table["label"]], "dataset": "isic2017",
                          "melanoma": table["melanoma"], "seborrheic_keratosis": table["seborrheic_keratosis"]}
                groups = table["image_id"]
            else:
                table = clients[client]
                entries = [ham_images[i] for i in table["image_id"]]
                extras = {"label_name": table["dx"], **{c: table[c] for c in ("dx_type", "age", "sex", "localization", "dataset")}}
                groups = table["lesion_id"]
            if len(table) == 0:
                raise SkinDataError(f"client {client}: no image of classes {CLASSES} in the raw data")
            images, shapes = _load_many([p for _, p in entries], size)
            meta = pd.DataFrame(
                {"id": table["image_id"], "group": groups, "source": [source(e) for e in entries], **extras,
                 "orig_width": [w for w, _ in shapes], "orig_height": [h for _, h in shapes]}
            )
            write_client(tmp_store, client, images, table["label"].to_numpy(np.int64), meta)
            counts[client] = len(table)
            log(f"skin {client}: {len(table)} images -> {size}x{size}")
        info = {
            "family": "skin", "protocol": "prrfl", "classes": list(CLASSES), "size": size,
            "resize": f"centre square crop on the shorter side, Pillow {RESAMPLE} (antialiased)",
            "clients": {**{c: f"HAM10000 {s}" for c, s in CLIENT_SOURCES.items()}, ISIC_CLIENT: "ISIC 2017 training set",
                        OOD_CLIENT: f"HAM10000 {OOD_SOURCE} (out-of-distribution cohort, test only)"},
        }
        atomic_write_text(Path(tmp_store) / "info.json", json.dumps(info, indent=2) + "\n")
    return counts


# ---------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------


def _position_cut(fractions=PRRFL_FRACTIONS):
    """The k-th of n goes to train if (k + .5) / n < f_train, to val if < f_train + f_val: on
    PRR-FL's class sizes this gives their counts within one image."""

    def cut(n: int) -> tuple[int, int]:
        position = (np.arange(n) + 0.5) / n
        return int((position < fractions[0]).sum()), int((position < fractions[0] + fractions[1]).sum())

    return cut


def split_prrfl(
    store_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    permutation: str = "prrfl",
    seed: int = 0,
    split_dir: str | os.PathLike = DEFAULT_SPLIT_DIR,
) -> pd.DataFrame:
    """Train/val/test of clients A-D, plus the OOD client as test only, written to ``out_csv``.

    ``permutation="prrfl"``: PRR-FL's CSVs, every store image must be listed exactly once and
    the labels must agree (row order = CSV order). ``"seeded"``: class-stratified 70/10/20 of the
    lesions per client from ``seed`` (each client its own stream, seeded with (seed, crc32(client))).
    """
    if permutation not in ("prrfl", "seeded"):
        raise ValueError(f"permutation must be 'prrfl' or 'seeded', got {permutation!r}")
    present = list_clients(store_dir)
    missing = [c for c in STORE_CLIENTS if c not in present]
    if missing:
        raise SkinDataError(f"store {store_dir} lacks client(s) {missing} (found {present})")
    prrfl = read_prrfl_split(split_dir) if permutation == "prrfl" else None
    tables = []
    for client in PRRFL_CLIENTS:
        data = open_client(store_dir, client)
        meta, labels = data.meta, np.asarray(data.labels)
        if permutation == "prrfl":
            listed = prrfl[prrfl["client"] == client]
            row_of = pd.Series(np.arange(len(meta)), index=meta["id"])
            unknown = listed.loc[~listed["image_id"].isin(row_of.index), "image_id"]
            unlisted = sorted(set(meta["id"]) - set(listed["image_id"]))
            if len(unknown) or unlisted:
                raise SkinDataError(
                    f"client {client}: the store and PRR-FL's CSVs ({split_dir}) differ: {len(unknown)} listed image(s) "
                    f"not in the store (e.g. {list(unknown.head(3))}), {len(unlisted)} store image(s) not listed "
                    f"(e.g. {unlisted[:3]}). PRR-FL's split only fits the real data; for other or synthetic data use "
                    "`permutation: seeded`."
                )
            rows = row_of[listed["image_id"]].to_numpy(np.int64)
            wrong = listed["label"].to_numpy() != labels[rows]
            if wrong.any():
                raise SkinDataError(
                    f"client {client}: {int(wrong.sum())} label(s) differ between the store and PRR-FL's CSVs, "
                    f"e.g. {list(listed.loc[wrong, 'image_id'].head(3))}"
                )
            names = listed["split"].to_numpy()
        else:
            # Stratified by class, whole lesions (the group) in one split: a lesion's images never
            # straddle train and test.
            rng = client_rng(seed, client)
            rows, names = grouped_split(meta["group"].to_numpy(str), rng, _position_cut(), strata=labels)
            empty = [s for s in ("train", "val", "test") if not (names == s).any()]
            if empty:
                raise SkinDataError(f"client {client}: {len(rows)} images are too few for a 70/10/20 split (no {empty})")
        tables.append(pd.DataFrame({"client": client, "split": names, "row": rows,
                                    "id": meta["id"].to_numpy()[rows], "group": meta["group"].to_numpy()[rows]}))
    ood = open_client(store_dir, OOD_CLIENT).meta
    tables.append(pd.DataFrame({"client": OOD_CLIENT, "split": "test", "row": np.arange(len(ood), dtype=np.int64),
                                "id": ood["id"], "group": ood["group"]}))
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table


# ---------------------------------------------------------------------------
# Synthetic twin
# ---------------------------------------------------------------------------

# Per-source acquisition style: skin tone, colour cast, brightness, contrast, blur, noise, vignette.
_SOURCE_STYLE = {
    "vidir_modern": dict(skin=(222, 180, 160), cast=(1.00, 0.97, 0.95), gain=1.00, contrast=1.00, blur=0.0, noise=3, vignette=0.25),
    "vidir_molemax": dict(skin=(205, 150, 135), cast=(1.05, 0.92, 0.88), gain=0.85, contrast=0.80, blur=1.0, noise=6, vignette=0.10),
    "rosendahl": dict(skin=(230, 195, 175), cast=(0.95, 1.00, 1.06), gain=1.10, contrast=1.15, blur=0.0, noise=2, vignette=0.45),
    "vienna_dias": dict(skin=(215, 190, 140), cast=(1.08, 1.00, 0.78), gain=0.90, contrast=0.70, blur=1.5, noise=10, vignette=0.60),
    "isic2017": dict(skin=(200, 170, 165), cast=(0.97, 0.97, 1.02), gain=0.95, contrast=1.05, blur=0.5, noise=4, vignette=0.30),
}
# Class signal: lesion colour, radius (fraction of the short side), border irregularity, texture.
_CLASS_STYLE = {
    0: dict(colour=(120, 75, 50), radius=0.22, irregular=0.05, texture=0.05),   # nevus: brown, round, smooth
    1: dict(colour=(170, 135, 95), radius=0.28, irregular=0.15, texture=0.35),  # BKL: tan, oval, warty
    2: dict(colour=(55, 35, 40), radius=0.30, irregular=0.25, texture=0.20),    # melanoma: dark, irregular
}
_REAL_FRACTIONS = {c: np.asarray(v, float) / sum(v) for c, v in EXPECTED_CLASS_COUNTS.items()}


def _class_sizes(n: int, fractions: np.ndarray) -> list[int]:
    """n split over 3 classes: half the real proportions, half uniform, at least 3 per class."""
    mix = 0.5 * fractions + 0.5 / 3
    sizes = np.maximum(3, np.floor(mix * n).astype(int))
    sizes[0] += max(0, n - sizes.sum())
    return sizes.tolist()


def _synthetic_image(rng: np.random.Generator, label: int, source: str, width: int, height: int) -> np.ndarray:
    from PIL import Image, ImageFilter

    st, cl = _SOURCE_STYLE[source], _CLASS_STYLE[label]
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    short = min(width, height)
    cy, cx = height / 2 + rng.uniform(-0.08, 0.08) * short, width / 2 + rng.uniform(-0.08, 0.08) * short
    angle = np.arctan2(y - cy, x - cx)
    radius = cl["radius"] * short * rng.uniform(0.85, 1.15)
    stretch = 1.3 if label == 1 else 1.0
    border = 1 + cl["irregular"] * (np.cos(3 * angle + rng.uniform(0, 6.3)) + 0.6 * np.cos(5 * angle + rng.uniform(0, 6.3)))
    dist = np.sqrt(((x - cx) / stretch) ** 2 + (y - cy) ** 2) / (radius * border)
    lesion = np.clip((1.0 - dist) * 4, 0, 1)[..., None]  # soft edge
    skin = np.asarray(st["skin"], float) * (1 + 0.04 * rng.standard_normal(3))
    colour = np.asarray(cl["colour"], float) * (1 + 0.12 * rng.standard_normal(3))
    texture = 1 + cl["texture"] * (rng.random((height, width)) - 0.5)[..., None]
    image = skin * (1 - lesion) + colour * texture * lesion
    if label == 2:  # blue-grey veil in part of the melanoma
        veil = lesion[..., 0] * (np.cos(angle - rng.uniform(0, 6.3)) > 0.3)
        image = image * (1 - 0.5 * veil[..., None]) + np.asarray([70, 80, 110.0]) * 0.5 * veil[..., None]
    # acquisition: contrast around the mean, colour cast, gain, vignette, blur, noise
    image = (image - image.mean()) * st["contrast"] + image.mean()
    image = image * np.asarray(st["cast"]) * st["gain"]
    r2 = ((x - width / 2) ** 2 + (y - height / 2) ** 2) / (0.25 * (width**2 + height**2))
    image = image * (1 - st["vignette"] * r2)[..., None]
    out = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8), "RGB")
    if st["blur"]:
        out = out.filter(ImageFilter.GaussianBlur(st["blur"]))
    arr = np.asarray(out, float) + st["noise"] * rng.standard_normal((height, width, 3))
    return np.clip(arr, 0, 255).astype(np.uint8)


def _jpeg(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array, "RGB").save(buf, format="JPEG", quality=92)
    return buf.getvalue()


def write_synthetic(
    out_dir: str | os.PathLike,
    seed: int = 0,
    *,
    images_per_client: int = 30,
    ood_images: int = 15,
    width: int = 64,
    height: int = 48,
) -> dict:
    """Write the five raw files of the skin family, small and in their real formats.

    HAM-style metadata (8 columns incl. ``dataset``, float ages with some blanks, lesions with two
    images, a few akiec/bcc/df/vasc rows that must be dropped) and JPEGs ``ISIC_00xxxxx.jpg`` split
    over the two part zips; an ISIC-2017-style zip (``ISIC-2017_Training_Data/`` with a superpixel
    PNG and a metadata CSV to be ignored) and its Part-3 ground truth with ``0.0``/``1.0`` flags.
    Each source has its own colour cast, brightness, contrast, blur, noise and vignette; the class
    drives lesion colour, size, shape and texture. Returns per-client class counts.
    """
    from PIL import Image

    if images_per_client < 12 or ood_images < 3:
        raise ValueError(f"need images_per_client >= 12 and ood_images >= 3, got {images_per_client}, {ood_images}")
    if width < 8 or height < 8:
        raise ValueError(f"need width, height >= 8, got {width}x{height}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([int(seed), 7])
    rows, jpegs = [], []
    next_image, next_lesion = 24306, 0  # HAM10000 ids start at ISIC_0024306
    info: dict[str, dict] = {}
    sources = {**CLIENT_SOURCES, OOD_CLIENT: OOD_SOURCE}
    for client, source in sources.items():
        n = ood_images if client == OOD_CLIENT else images_per_client
        sizes = _class_sizes(n, _REAL_FRACTIONS[client]) if n >= 9 else [n - 2, 1, 1]
        labels = [k for k, m in enumerate(sizes) for _ in range(m)] + [-1, -2]  # two dropped-class rows
        info[client] = {"source": source, "nv/bkl/mel": sizes}
        for j, label in enumerate(labels):
            dx = CLASSES[label] if label >= 0 else ("bcc", "df", "akiec", "vasc")[(j + len(client)) % 4]
            # every fourth image is a second view of the previous lesion (same lesion_id and class)
            if j % 4 != 3 or label < 0 or labels[j - 1] != label:
                next_lesion += 1
            image_id = f"ISIC_{next_image:07d}"
            next_image += 1
            age = "" if j == 5 else f"{float(rng.integers(1, 18) * 5):.1f}"
            rows.append({"lesion_id": f"HAM_{next_lesion:07d}", "image_id": image_id, "dx": dx,
                         "dx_type": ("histo", "follow_up", "consensus", "confocal")[j % 4], "age": age,
                         "sex": ("male", "female")[j % 2], "localization": ("back", "face", "trunk", "lower extremity")[j % 4],
                         "dataset": source})
            drawn = label if label >= 0 else 1
            jpegs.append((image_id, _jpeg(_synthetic_image(rng, drawn, source, width, height))))
    order = rng.permutation(len(rows))  # the real file is not grouped by source
    meta = pd.DataFrame([rows[i] for i in order], columns=list(HAM_COLUMNS))
    atomic_write_text(out_dir / HAM_METADATA, meta.to_csv(index=False, lineterminator="\n"))
    half = len(jpegs) // 2
    write_zip_atomic(out_dir / HAM_PART1, [(f"{i}.jpg", b) for i, b in jpegs[:half]], date_time=(2018, 1, 1, 0, 0, 0))
    write_zip_atomic(out_dir / HAM_PART2, [(f"{i}.jpg", b) for i, b in jpegs[half:]], date_time=(2018, 1, 1, 0, 0, 0))

    # ISIC 2017: ids ISIC_0000000.., varied sizes (portrait, landscape, larger), superpixels + metadata junk.
    sizes = _class_sizes(images_per_client, _REAL_FRACTIONS[ISIC_CLIENT])
    labels = [k for k, m in enumerate(sizes) for _ in range(m)]
    labels = [labels[i] for i in rng.permutation(len(labels))]
    info[ISIC_CLIENT] = {"source": "isic2017", "nv/bkl/mel": sizes}
    prefix = "ISIC-2017_Training_Data/"
    members = [(prefix, b"")]
    gt_lines = ["image_id,melanoma,seborrheic_keratosis"]
    meta_lines = ["image_id,age_approximate,sex"]
    shapes = [(width, height), (height, width), (width * 3 // 2, height * 3 // 2)]
    for k, label in enumerate(labels):
        image_id = f"ISIC_{k * 7:07d}"
        w, h = shapes[k % 3]
        members.append((f"{prefix}{image_id}.jpg", _jpeg(_synthetic_image(rng, label, "isic2017", w, h))))
        gt_lines.append(f"{image_id},{'1.0' if label == 2 else '0.0'},{'1.0' if label == 1 else '0.0'}")
        meta_lines.append(f"{image_id},{'unknown' if k % 5 == 0 else 45},{('male', 'female')[k % 2]}")
    buf = io.BytesIO()
    Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(buf, format="PNG")
    members.append((f"{prefix}ISIC_0000000_superpixels.png", buf.getvalue()))
    members.append((f"{prefix}ISIC-2017_Training_Data_metadata.csv", ("\n".join(meta_lines) + "\n").encode()))
    write_zip_atomic(out_dir / ISIC_IMAGES, members, date_time=(2018, 1, 1, 0, 0, 0))
    atomic_write_text(out_dir / ISIC_GT, "\n".join(gt_lines) + "\n")
    return {"clients": info, "files": [s.filename for s in DOWNLOADS]}


# ---------------------------------------------------------------------------
# Family interface
# ---------------------------------------------------------------------------


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"skin: unknown protocol {protocol!r}; known: {sorted(PROTOCOLS)}")


def preprocess(raw: dict, store_dir, protocol: str, *, expect_real_counts: bool = False, size: int | None = None,
               log=print) -> dict:
    _check_protocol(protocol)
    return preprocess_prrfl(raw, Path(store_dir), expect_real_counts=expect_real_counts, size=size, log=log)


def split(store_dir, out_csv, protocol: str, *, permutation: str = "default", seed: int = 0) -> pd.DataFrame:
    """``permutation``: ``prrfl`` (= ``default``, PRR-FL's CSVs) or ``seeded`` (stratified 70/10/20)."""
    _check_protocol(protocol)
    permutation = "prrfl" if permutation == "default" else permutation
    return split_prrfl(Path(store_dir), Path(out_csv), permutation=permutation, seed=seed)
