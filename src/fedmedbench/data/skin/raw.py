"""Reading HAM10000 and ISIC 2017 (metadata, ground truth, JPEGs) into the canonical store."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from ..store import atomic_write_text, staged_dir, write_client
from .download import DOWNLOADS, HAM_METADATA, HAM_PART1, HAM_PART2, ISIC_GT, ISIC_IMAGES
from .sites import (
    CLASS_INDEX,
    CLASSES,
    CLIENT_SOURCES,
    EXPECTED_CLASS_COUNTS,
    ISIC_CLIENT,
    OOD_CLIENT,
    OOD_SOURCE,
    STORE_CLIENTS,
    SkinDataError,
)
from .splits import DEFAULT_SPLIT_DIR, check_prrfl_membership

HAM_COLUMNS = ("lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization", "dataset")
DEFAULT_SIZE = 128
RESAMPLE = "bilinear"  # Pillow BILINEAR, antialiased (support scaled by the downscale factor)

_IMAGE_RE = re.compile(r"^ISIC_\d{7}\.jpg$")
_DECODE_THREADS = max(1, min(8, os.cpu_count() or 1))


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
        {
            "image_id": gt["image_id"],
            "melanoma": flags["melanoma"],
            "seborrheic_keratosis": flags["seborrheic_keratosis"],
            "label": label,
        }
    )
    return out.sort_values("image_id", kind="stable").reset_index(drop=True)


def class_counts(labels: Iterable[int]) -> tuple[int, int, int]:
    counts = np.bincount(np.asarray(list(labels), dtype=np.int64), minlength=len(CLASSES))
    return tuple(int(c) for c in counts[: len(CLASSES)])


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
        raise SkinDataError(
            f"raw input {name!r} not given (got {sorted(raw)}); the skin family needs {[s.filename for s in DOWNLOADS]}"
        )
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
                extras = {
                    "label_name": [CLASSES[k] for k in table["label"]],
                    "dataset": "isic2017",
                    "melanoma": table["melanoma"],
                    "seborrheic_keratosis": table["seborrheic_keratosis"],
                }
                groups = table["image_id"]
            else:
                table = clients[client]
                entries = [ham_images[i] for i in table["image_id"]]
                extras = {
                    "label_name": table["dx"],
                    **{c: table[c] for c in ("dx_type", "age", "sex", "localization", "dataset")},
                }
                groups = table["lesion_id"]
            if len(table) == 0:
                raise SkinDataError(f"client {client}: no image of classes {CLASSES} in the raw data")
            images, shapes = _load_many([p for _, p in entries], size)
            meta = pd.DataFrame(
                {
                    "id": table["image_id"],
                    "group": groups,
                    "source": [source(e) for e in entries],
                    **extras,
                    "orig_width": [w for w, _ in shapes],
                    "orig_height": [h for _, h in shapes],
                }
            )
            write_client(tmp_store, client, images, table["label"].to_numpy(np.int64), meta)
            counts[client] = len(table)
            log(f"skin {client}: {len(table)} images -> {size}x{size}")
        info = {
            "family": "skin",
            "protocol": "prrfl",
            "classes": list(CLASSES),
            "size": size,
            "resize": f"centre square crop on the shorter side, Pillow {RESAMPLE} (antialiased)",
            "clients": {
                **{c: f"HAM10000 {s}" for c, s in CLIENT_SOURCES.items()},
                ISIC_CLIENT: "ISIC 2017 training set",
                OOD_CLIENT: f"HAM10000 {OOD_SOURCE} (out-of-distribution cohort, test only)",
            },
        }
        atomic_write_text(Path(tmp_store) / "info.json", json.dumps(info, indent=2) + "\n")
    return counts
