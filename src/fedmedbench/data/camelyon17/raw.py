"""Reading the Camelyon17-WILDS release (metadata.csv and PNG patches) into the canonical store."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from ...errors import plain
from ...progress import Progress
from .. import check_protocol
from ..store import IMAGES_FILE, LABELS_FILE, META_FILE, open_client, staged_dir
from .download import ARCHIVE
from .sites import (
    CENTER_TO_CLIENT,
    PATCH_SIZE,
    PROTOCOLS,
    REAL_COUNTS,
    REAL_SLIDES_PER_CENTER,
    REAL_TOTAL,
    CamelyonDataError,
)

METADATA_COLUMNS = ["patient", "node", "x_coord", "y_coord", "tumor", "slide", "center"]

_SEARCH_DEPTH = 3
_DECODE_BATCH = 2048


# ---------------------------------------------------------------------------
# Finding and reading the release
# ---------------------------------------------------------------------------


def find_release_root(extracted: str | os.PathLike) -> Path:
    """The folder holding ``metadata.csv`` and ``patches/`` (the archive's top level or one folder below)."""
    extracted = Path(extracted)
    if not extracted.is_dir():
        raise CamelyonDataError(f"Camelyon17 raw folder {extracted} does not exist or is not a folder")
    level, seen = [extracted], []
    for _ in range(_SEARCH_DEPTH + 1):
        next_level = []
        for folder in level:
            if (folder / "metadata.csv").is_file() and (folder / "patches").is_dir():
                return folder
            seen.append(str(folder))
            try:
                subdirs = sorted(p for p in folder.iterdir() if p.is_dir())
            except OSError:
                subdirs = []
            next_level += [
                p for p in subdirs if p.name != "__MACOSX" and not p.name.startswith(".") and p.name != "patches"
            ]
        level = next_level
    raise CamelyonDataError(
        f"{extracted}: no folder with metadata.csv and patches/ within {_SEARCH_DEPTH} levels "
        f"(looked in {seen[:10]}{' ...' if len(seen) > 10 else ''}); is this the Camelyon17-WILDS v1.0 archive?"
    )


def _integer_column(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    values = pd.to_numeric(df[col], errors="coerce")
    bad = values.isna() | (values != values.round())
    if bad.any():
        rows = plain(df.index[bad][:5])
        raise CamelyonDataError(
            f"{path}: column {col!r} must hold integers; bad value(s) {plain(df.loc[bad, col][:5])} at row(s) {rows}"
        )
    return values.astype(np.int64)


def read_metadata(path: str | os.PathLike) -> pd.DataFrame:
    """WILDS ``metadata.csv`` with ``patient`` as a zero-padded 3-digit string.

    The unnamed first column (WILDS reads it with ``index_col=0``) becomes
    ``wilds_index``; the ``split`` column, if any, becomes ``wilds_split``.
    Structural problems raise ``CamelyonDataError`` naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise CamelyonDataError(f"{path} does not exist")
    try:
        df = pd.read_csv(path, dtype={"patient": str}, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise CamelyonDataError(f"{path}: not a readable CSV file ({exc})") from exc
    first = df.columns[0] if len(df.columns) else None
    if first is not None and (first == "" or str(first).startswith("Unnamed: 0")):
        df = df.rename(columns={first: "wilds_index"})
    missing = [c for c in METADATA_COLUMNS if c not in df.columns]
    if missing:
        raise CamelyonDataError(
            f"{path}: missing column(s) {missing}; expected the WILDS header "
            f"',patient,node,x_coord,y_coord,tumor,slide,center,split', got {list(df.columns)}"
        )
    if df.empty:
        raise CamelyonDataError(f"{path}: no rows")
    patient = df["patient"].astype(str).str.strip()
    bad = ~patient.str.fullmatch(r"\d{1,3}")
    if bad.any():
        raise CamelyonDataError(
            f"{path}: column 'patient' must hold patient numbers 000-099; bad value(s) {plain(patient[bad][:5])}"
        )
    out = pd.DataFrame({"patient": patient.str.zfill(3)})
    for col in METADATA_COLUMNS[1:]:
        out[col] = _integer_column(df, col, path)
    out["wilds_split"] = _integer_column(df, "split", path) if "split" in df.columns else -1
    out["wilds_index"] = _integer_column(df, "wilds_index", path) if "wilds_index" in df.columns else np.arange(len(df))

    problems = []
    if not out["tumor"].isin([0, 1]).all():
        problems.append(f"'tumor' must be 0 or 1, found {sorted(set(out['tumor']) - {0, 1})[:5]}")
    if not out["center"].isin(list(CENTER_TO_CLIENT)).all():
        problems.append(f"'center' must be 0..4, found {sorted(set(out['center']) - set(CENTER_TO_CLIENT))[:5]}")
    dup = out.duplicated(["patient", "node", "x_coord", "y_coord"], keep=False)
    if dup.any():
        problems.append(
            f"{int(dup.sum())} rows share (patient, node, x_coord, y_coord), e.g. {out[dup].head(2).to_dict('records')}"
        )
    pairs = out[["patient", "node", "slide", "center"]].drop_duplicates()
    if pairs.duplicated(["patient", "node"]).any() or pairs.duplicated(["slide"]).any():
        problems.append("(patient, node) and slide must correspond one to one, with one center per slide")
    if problems:
        raise CamelyonDataError(f"{path}: " + "; ".join(problems))
    return out


def patch_relpath(patient: str, node: int, x: int, y: int) -> str:
    """WILDS' path template, relative to the release root."""
    return f"patches/patient_{patient}_node_{node}/patch_patient_{patient}_node_{node}_x_{x}_y_{y}.png"


def _patch_id(patient: str, node: int, x: int, y: int) -> str:
    return f"patient_{patient}_node_{node}_x_{x}_y_{y}"


def _slide_name(patient: str, node: int) -> str:
    return f"patient_{patient}_node_{node}"


def load_patch(path: str | os.PathLike, size: int | None = None) -> np.ndarray:
    """One patch as uint8 H x W x 3 (alpha dropped). ``size=None`` demands the native 96x96."""
    try:
        with Image.open(path) as img:
            img.load()
            rgb = img.convert("RGB")
    except (OSError, ValueError) as exc:  # PIL raises UnidentifiedImageError (an OSError) for non-images
        raise CamelyonDataError(f"{path}: cannot read as an image ({exc})") from exc
    if size is None:
        if rgb.size != (PATCH_SIZE, PATCH_SIZE):
            raise CamelyonDataError(
                f"{path}: patch is {rgb.size[0]}x{rgb.size[1]}, expected {PATCH_SIZE}x{PATCH_SIZE} "
                "(set an image size for this task to resize)"
            )
    elif rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


# ---------------------------------------------------------------------------
# Preprocessing
# ---------------------------------------------------------------------------


def _real_count_problems(meta: pd.DataFrame) -> list[str]:
    problems = []
    counts = meta.groupby("center").size()
    for center, client in CENTER_TO_CLIENT.items():
        got = int(counts.get(center, 0))
        if got != REAL_COUNTS[client]:
            problems.append(f"{client} (center {center}): {got} patches, the real release has {REAL_COUNTS[client]}")
    if len(meta) != REAL_TOTAL:
        problems.append(f"total: {len(meta)} patches, the real release has {REAL_TOTAL}")
    slides = meta.groupby("center")["slide"].nunique()
    for center, client in CENTER_TO_CLIENT.items():
        got = int(slides.get(center, 0))
        if got != REAL_SLIDES_PER_CENTER:
            problems.append(f"{client} (center {center}): {got} slides, the real release has {REAL_SLIDES_PER_CENTER}")
    bad = meta["center"] != meta["slide"] // 10
    if bad.any():
        problems.append(f"{int(bad.sum())} rows break WILDS' invariant center == slide // 10")
    bad = meta["center"] != meta["patient"].astype(int) // 20
    if bad.any():
        problems.append(f"{int(bad.sum())} rows break WILDS' invariant center == patient // 20")
    return problems


def _check_files(root: Path, relpaths: list[str]) -> None:
    missing = [rel for rel in relpaths if not (root / rel).is_file()]
    if missing:
        raise CamelyonDataError(
            f"{len(missing)} patch file(s) listed in {root / 'metadata.csv'} are missing under {root}, e.g. "
            + ", ".join(missing[:5])
        )


def preprocess(
    raw: dict,
    store_dir: str | os.PathLike,
    protocol: str,
    *,
    expect_real_counts: bool = False,
    size: int | None = None,
    log: Callable[[str], object] = print,
    workers: int | None = None,
    progress: bool = True,
) -> dict[str, int]:
    """Build the canonical store: one client per hospital, images N x S x S x 3, labels int64 N.

    ``raw`` maps ``camelyon17_v1.0.tar.gz`` to its extracted folder. ``size``
    None or 96 keeps the native patches; another value resizes (bilinear).
    With ``expect_real_counts`` the metadata must match the real release
    (per-center and total counts, 10 slides per center, WILDS' invariants);
    every mismatch is listed in one error before any image is decoded.
    Returns the number of patches per client.
    """
    check_protocol("camelyon17", protocol, PROTOCOLS)
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
        raise ValueError(f"size must be a positive integer or None, got {size!r}")
    out_size = PATCH_SIZE if size is None else size
    resize_to = None if out_size == PATCH_SIZE else out_size
    if ARCHIVE not in raw:
        raise CamelyonDataError(f"camelyon17: raw files must include {ARCHIVE!r}, got {sorted(raw)}")
    raw_dir = Path(raw[ARCHIVE])
    root = find_release_root(raw_dir)
    meta = read_metadata(root / "metadata.csv")
    log(f"camelyon17: {len(meta)} patches in {root / 'metadata.csv'}")
    if expect_real_counts:
        problems = _real_count_problems(meta)
        if problems:
            raise CamelyonDataError(
                f"{root / 'metadata.csv'} does not match the real Camelyon17-WILDS v1.0 release:\n  "
                + "\n  ".join(problems)
                + "\n(for other or synthetic data set expect_real_counts to false)"
            )
    empty = [CENTER_TO_CLIENT[c] for c in CENTER_TO_CLIENT if not (meta["center"] == c).any()]
    if empty:
        raise CamelyonDataError(f"{root / 'metadata.csv'}: no patches for client(s) {empty}")

    meta["id"] = [_patch_id(p, n, x, y) for p, n, x, y in zip(meta.patient, meta.node, meta.x_coord, meta.y_coord)]
    meta["group"] = [_slide_name(p, n) for p, n in zip(meta.patient, meta.node)]
    rel = [patch_relpath(p, n, x, y) for p, n, x, y in zip(meta.patient, meta.node, meta.x_coord, meta.y_coord)]
    _check_files(root, rel)
    prefix = root.relative_to(raw_dir).as_posix()
    meta["source"] = [r if prefix == "." else f"{prefix}/{r}" for r in rel]
    meta["path"] = [str(root / r) for r in rel]

    workers = workers or min(8, os.cpu_count() or 1)
    counts: dict[str, int] = {}
    with staged_dir(store_dir) as tmp_store, ThreadPoolExecutor(max_workers=workers) as pool:
        for center, client in CENTER_TO_CLIENT.items():
            rows = meta[meta["center"] == center].sort_values(["patient", "node", "x_coord", "y_coord"], kind="stable")
            n = len(rows)
            folder = tmp_store / client
            folder.mkdir()
            images = np.lib.format.open_memmap(
                folder / IMAGES_FILE, mode="w+", dtype=np.uint8, shape=(n, out_size, out_size, 3)
            )
            paths = rows["path"].tolist()
            # tqdm on a terminal; plain lines every 30 s in a job log (no carriage-return fragments).
            bar = Progress(
                n, f"camelyon17 {client}", logging.getLogger("fedmedbench.camelyon17"), unit="patch", enabled=progress
            )
            try:
                for start in range(0, n, _DECODE_BATCH):
                    batch = paths[start : start + _DECODE_BATCH]
                    for k, patch in enumerate(pool.map(lambda p: load_patch(p, resize_to), batch)):
                        images[start + k] = patch
                    bar.update(len(batch))
            finally:
                bar.close()
            images.flush()
            del images
            np.save(folder / LABELS_FILE, rows["tumor"].to_numpy(np.int64), allow_pickle=False)
            columns = [
                "id",
                "group",
                "source",
                "patient",
                "node",
                "x_coord",
                "y_coord",
                "slide",
                "center",
                "tumor",
                "wilds_split",
                "wilds_index",
            ]
            rows[columns].to_csv(folder / META_FILE, index=False, lineterminator="\n")
            opened = open_client(tmp_store, client)  # re-read: the store is complete and consistent
            counts[client] = len(opened)
            log(
                f"camelyon17 {client} (center {center}): {n} patches, {int(rows['tumor'].sum())} tumour, "
                f"{rows['group'].nunique()} slides"
            )
    return counts
