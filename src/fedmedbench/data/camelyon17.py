"""Camelyon17-WILDS v1.0 patches (HarmoFL classification task, 5 hospital clients).

The WILDS release is one tar.gz (~10.7 GB, no published checksum) holding::

    RELEASE_v1.0.txt
    metadata.csv                 ,patient,node,x_coord,y_coord,tumor,slide,center,split
    patches/patient_{PPP}_node_{N}/patch_patient_{PPP}_node_{N}_x_{X}_y_{Y}.png

WILDS extracts the archive *into* ``<root>/camelyon17_v1.0/``, so the members
sit at the top level of the archive; third-party copies sometimes carry the
``camelyon17_v1.0/`` folder. Both are accepted: the release root is the first
folder (breadth first, 3 levels) holding ``metadata.csv`` and ``patches/``.

Parsing rules (``datasets.md`` §1):

* ``patient`` is read as a string and zero-padded to 3 digits (``004`` stays
  ``004``); the patch path is built from the WILDS template exactly;
* patches are 96x96 PNGs written from OpenSlide's RGBA regions: alpha is
  dropped (``convert('RGB')``, as WILDS and HarmoFL do);
* clients are the five hospitals = WILDS ``center`` 0..4, named
  ``hospital1`` .. ``hospital5`` like HarmoFL's ``data.pkl`` keys (paper
  columns A..E). hospital k = center k-1 is our reading; HarmoFL's own split
  file could not be retrieved;
* labels are ``tumor`` (0/1) as int64.

The 455,954 patches are decoded by a small thread pool straight into
``np.lib.format.open_memmap`` files (never all in memory) inside a staged
store folder that is renamed into place only when every client is complete;
training then memory-maps ``images.npy``.

Split of record (ours; HarmoFL's is unrecoverable): per hospital, rows sorted
by patch id, permuted with a generator seeded by (seed, crc32(client)), 20 %
test, then 80/20 train/val of the rest (image level, HarmoFL-like). The slide
is the ``group`` so slide-level leakage is visible; ``permutation="slide"``
puts whole slides in one split instead.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import tarfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import DataError, plain
from ..files import atomic_file
from ..progress import Progress
from .download import DownloadSpec
from .store import IMAGES_FILE, LABELS_FILE, META_FILE, client_rng, grouped_split, list_clients, open_client, staged_dir, write_split_csv

__all__ = [
    "DOWNLOAD",
    "DOWNLOADS",
    "PROTOCOLS",
    "CLIENTS",
    "CENTER_TO_CLIENT",
    "REAL_COUNTS",
    "CamelyonDataError",
    "find_release_root",
    "read_metadata",
    "patch_relpath",
    "load_patch",
    "preprocess",
    "split",
    "write_synthetic",
    "write_synthetic_release",
]

URL = "https://worksheets.codalab.org/rest/bundles/0xe45e15f39fb54e9d9e919556af67aabe/contents/blob/"
ARCHIVE = "camelyon17_v1.0.tar.gz"

DOWNLOAD = DownloadSpec(
    name="camelyon17",
    url=URL,
    filename=ARCHIVE,
    sha256=None,  # WILDS publishes none: pin the one logged at the first download
    licence=(
        "CC0 1.0 (public domain), as stated by WILDS for Camelyon17-WILDS v1.0. "
        "Cite Bandi et al., IEEE TMI 2019 (CAMELYON17) and Koh et al., ICML 2021 (WILDS)."
    ),
    manual_step=(
        "Download the Camelyon17-WILDS v1.0 archive (~10.7 GB tar.gz) by hand from "
        f"{URL} (also linked from https://wilds.stanford.edu/downloads; WILDS saves it as archive.tar.gz) "
        f"and set data.camelyon17.files.{ARCHIVE}.archive in config.yaml to its path."
    ),
    homepage="https://wilds.stanford.edu/datasets/#camelyon17",
)

DOWNLOADS = [DOWNLOAD]

CENTER_TO_CLIENT = {0: "hospital1", 1: "hospital2", 2: "hospital3", 3: "hospital4", 4: "hospital5"}
CLIENTS = [CENTER_TO_CLIENT[c] for c in sorted(CENTER_TO_CLIENT)]
PROTOCOLS = {"harmofl": CLIENTS}

PATCH_SIZE = 96
REAL_COUNTS = {"hospital1": 59_436, "hospital2": 34_904, "hospital3": 85_054, "hospital4": 129_838, "hospital5": 146_722}
REAL_TOTAL = 455_954
REAL_SLIDES_PER_CENTER = 10

METADATA_COLUMNS = ["patient", "node", "x_coord", "y_coord", "tumor", "slide", "center"]
TEST_FRACTION = 0.2
VAL_FRACTION = 0.2  # of what is left after the test split
PERMUTATIONS = ("default", "image", "patch", "slide")

_SEARCH_DEPTH = 3
_DECODE_BATCH = 2048


class CamelyonDataError(DataError):
    """The raw Camelyon17-WILDS files do not have the layout or content we expect."""


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
            next_level += [p for p in subdirs if p.name != "__MACOSX" and not p.name.startswith(".") and p.name != "patches"]
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
        problems.append(f"{int(dup.sum())} rows share (patient, node, x_coord, y_coord), e.g. {out[dup].head(2).to_dict('records')}")
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
    from PIL import Image

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
    _check_protocol(protocol)
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
            images = np.lib.format.open_memmap(folder / IMAGES_FILE, mode="w+", dtype=np.uint8, shape=(n, out_size, out_size, 3))
            paths = rows["path"].tolist()
            # tqdm on a terminal; plain lines every 30 s in a job log (no carriage-return fragments).
            bar = Progress(n, f"camelyon17 {client}", logging.getLogger("fedmedbench.camelyon17"), unit="patch", enabled=progress)
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
            columns = ["id", "group", "source", "patient", "node", "x_coord", "y_coord", "slide", "center", "tumor",
                       "wilds_split", "wilds_index"]
            rows[columns].to_csv(folder / META_FILE, index=False, lineterminator="\n")
            opened = open_client(tmp_store, client)  # re-read: the store is complete and consistent
            counts[client] = len(opened)
            log(
                f"camelyon17 {client} (center {center}): {n} patches, {int(rows['tumor'].sum())} tumour, "
                f"{rows['group'].nunique()} slides"
            )
    return counts


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"camelyon17: unknown protocol {protocol!r}; known: {sorted(PROTOCOLS)}")


# ---------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------


def _image_level(ids: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = len(ids)
    if n < 3:
        raise CamelyonDataError(f"need at least 3 patches to split into train/val/test, got {n}")
    order = np.argsort(ids, kind="stable")  # sorted before splitting
    perm = order[rng.permutation(n)]
    n_test = max(1, int(n * TEST_FRACTION))
    rest = n - n_test
    n_val = max(1, int(rest * VAL_FRACTION))
    if rest - n_val < 1:
        raise CamelyonDataError(f"{n} patches are too few for a train/val/test split")
    return {"train": perm[: rest - n_val], "val": perm[rest - n_val : rest], "test": perm[rest:]}


def _slide_level(ids: np.ndarray, groups: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def cut(s: int) -> tuple[int, int]:
        if s < 3:
            raise CamelyonDataError(f"a slide-level split needs at least 3 slides per client, got {s} ({plain(np.unique(groups))})")
        n_test = max(1, int(round(s * TEST_FRACTION)))
        n_val = max(1, int(round((s - n_test) * VAL_FRACTION)))
        if s - n_test - n_val < 1:
            raise CamelyonDataError(f"{s} slides are too few for a slide-level train/val/test split")
        return s - n_test - n_val, s - n_test

    order = np.argsort(ids, kind="stable")  # sorted by id first: the split does not depend on the store order
    rows, names = grouped_split(groups[order], rng, cut)
    return {name: order[rows[names == name]] for name in ("train", "val", "test")}


def split(
    store_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    protocol: str,
    *,
    permutation: str = "default",
    seed: int = 0,
) -> pd.DataFrame:
    """Per-hospital seeded split, written to ``out_csv`` (columns client,split,row,id,group).

    ``permutation``: ``default`` (= ``image`` / ``patch``): patch level, 20 %
    test then 80/20 train/val of the rest, so patches of one slide appear in
    several splits (visible through ``group`` = slide); ``slide``: whole
    slides go to one split (20 % of the slides to test, 20 % of the rest to
    val, rounded, at least one each). Rows within a split are in seeded
    random order (training may truncate to the first rows).
    """
    _check_protocol(protocol)
    if permutation not in PERMUTATIONS:
        raise ValueError(f"camelyon17: permutation must be one of {PERMUTATIONS}, got {permutation!r}")
    present = list_clients(store_dir)
    missing = [c for c in CLIENTS if c not in present]
    if missing:
        raise CamelyonDataError(f"store {store_dir} lacks client(s) {missing} (found {present})")
    tables = []
    for client in CLIENTS:
        meta = open_client(store_dir, client).meta
        ids, groups = meta["id"].to_numpy(str), meta["group"].to_numpy(str)
        rng = client_rng(seed, client)
        try:
            parts = _slide_level(ids, groups, rng) if permutation == "slide" else _image_level(ids, rng)
        except CamelyonDataError as exc:
            raise CamelyonDataError(f"client {client} in {store_dir}: {exc}") from None
        for name in ("train", "val", "test"):
            rows = parts[name]
            tables.append(pd.DataFrame({"client": client, "split": name, "row": rows, "id": ids[rows], "group": groups[rows]}))
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table


# ---------------------------------------------------------------------------
# Synthetic twin
# ---------------------------------------------------------------------------

# What the twin must show (issue 16): as in real Camelyon17, the label lives in the tissue's
# STRUCTURE and the hospital in its STAIN and scanner. Normal = pale stroma and fat with sparse,
# small, very dark nuclei (a few isolated dark spots: strongly negative grey-level skewness);
# tumour = a confluent sheet of large overlapping nuclei (a dense texture: skewness near 0). Where
# the nuclei are and how they cluster is Fourier phase, so the label survives HarmoFL's full
# amplitude swap (tested). Tumour is also darker on average, as dense tissue is; that cue is
# amplitude (the DC term) and AmpNorm removes it.
#
# Per-center "staining lab and scanner", applied alike to both classes, so it changes colour and
# the amplitude spectrum only: stain optical-density vectors (RGB), stain strength, brightness,
# focus blur (sigma in pixels), unsharp masking (a sharpening scanner) and noise.
_CENTER_STYLE = {
    0: dict(h=(0.65, 0.70, 0.29), e=(0.07, 0.99, 0.11), strength=1.00, brightness=1.00, blur=0.0, sharpen=0, noise=3.0),
    1: dict(h=(0.45, 0.85, 0.25), e=(0.05, 0.90, 0.35), strength=1.25, brightness=0.92, blur=0.8, sharpen=0, noise=2.0),
    2: dict(h=(0.80, 0.60, 0.15), e=(0.20, 1.05, 0.02), strength=0.75, brightness=1.05, blur=0.0, sharpen=150, noise=6.0),
    3: dict(h=(0.55, 0.65, 0.60), e=(0.02, 0.70, 0.20), strength=1.10, brightness=0.97, blur=1.3, sharpen=0, noise=1.5),
    4: dict(h=(0.75, 0.70, 0.40), e=(0.30, 0.90, 0.25), strength=0.90, brightness=1.08, blur=0.4, sharpen=0, noise=4.0),
}


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Smooth random field in [0, 1]: a coarse random grid upsampled bilinearly. ``cells`` per 96 px,
    so a smaller twin patch is a crop of the same tissue, not a shrunken one."""
    from PIL import Image

    cells = max(2, round(cells * size / PATCH_SIZE))
    coarse = rng.random((cells, cells)).astype(np.float32)
    return np.asarray(Image.fromarray(coarse, "F").resize((size, size), Image.Resampling.BILINEAR), dtype=np.float32)


def _nuclei(layer: np.ndarray, rng: np.random.Generator, per_patch: tuple[int, int], radius: tuple[float, float],
            level: tuple[float, float]) -> None:
    """Paint randomly placed, oriented elliptic nuclei into ``layer`` (max with what is there).
    ``per_patch`` is the count range per 96 x 96 px (scaled to the layer's area); radii in pixels.
    Only each nucleus' bounding box is touched."""
    size = layer.shape[0]
    count = int(round(rng.uniform(*per_patch) * (size / PATCH_SIZE) ** 2))
    for _ in range(count):
        cy, cx = rng.uniform(-radius[1], size + radius[1], 2)  # nuclei may be cut by the border
        ry, rx = rng.uniform(*radius, 2)
        theta, value = rng.uniform(0.0, np.pi), rng.uniform(*level)
        y0, y1 = max(int(cy - max(ry, rx)), 0), min(int(cy + max(ry, rx)) + 2, size)
        x0, x1 = max(int(cx - max(ry, rx)), 0), min(int(cx + max(ry, rx)) + 2, size)
        if y0 >= y1 or x0 >= x1:
            continue
        yy, xx = np.mgrid[y0:y1, x0:x1].astype(np.float32)
        u = (yy - cy) * np.cos(theta) + (xx - cx) * np.sin(theta)
        v = (xx - cx) * np.cos(theta) - (yy - cy) * np.sin(theta)
        box = layer[y0:y1, x0:x1]  # a view
        inside = (u / ry) ** 2 + (v / rx) ** 2 <= 1.0
        box[inside] = np.maximum(box[inside], value)


def _tissue(rng: np.random.Generator, tumor: bool, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Hematoxylin and eosin densities (size x size): the class's structure, no colour yet."""
    eosin = 0.25 + 0.25 * _smooth_noise(rng, size, 7)
    hema = 0.05 * _smooth_noise(rng, size, 8)
    if tumor:  # a confluent sheet: dense chromatin, large overlapping pleomorphic nuclei, no gaps
        clear = np.zeros((size, size), bool)
        hema += 0.5 + 0.2 * _smooth_noise(rng, size, 9)
        _nuclei(hema, rng, (110, 160), (3.5, 6.0), (0.9, 1.2))
    else:  # pale stroma and fat (unstained, white) with sparse, small, very dark nuclei
        clear = _smooth_noise(rng, size, 5) > 0.75
        _nuclei(hema, rng, (45, 90), (1.8, 3.0), (1.0, 1.4))
    return hema * ~clear, eosin * ~clear


def _synthetic_patch(rng: np.random.Generator, center: int, tumor: bool, size: int) -> np.ndarray:
    """An H&E-like RGBA patch at native resolution (a smaller ``size`` is a crop, like the real
    label's central 32 x 32 region): the class's tissue seen through the center's stain and scanner."""
    from PIL import Image, ImageFilter

    style = _CENTER_STYLE[center]
    hema, eosin = _tissue(rng, tumor, size)
    od = style["strength"] * (hema[..., None] * np.array(style["h"]) + eosin[..., None] * np.array(style["e"]))
    image = Image.fromarray(np.clip(255.0 * style["brightness"] * np.exp(-od), 0, 255).astype(np.uint8), "RGB")
    if style["blur"] > 0:
        image = image.filter(ImageFilter.GaussianBlur(style["blur"]))
    if style["sharpen"] > 0:
        image = image.filter(ImageFilter.UnsharpMask(radius=2, percent=style["sharpen"], threshold=0))
    rgb = np.asarray(image, dtype=np.float32) + rng.normal(0.0, style["noise"], (size, size, 3))
    rgba = np.empty((size, size, 4), np.uint8)
    rgba[..., :3] = np.clip(np.round(rgb), 0, 255).astype(np.uint8)
    rgba[..., 3] = 255  # OpenSlide regions are RGBA with an opaque alpha
    return rgba


def _png_bytes(array: np.ndarray, mode: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, format="PNG", compress_level=1)  # fast; content is noise anyway
    return buf.getvalue()


def _tar_add(tf: tarfile.TarFile, name: str, data: bytes | None) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if data is None:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tf.addfile(info)
    else:
        info.size = len(data)
        info.mode = 0o644
        tf.addfile(info, io.BytesIO(data))


def write_synthetic_release(
    archive_path: str | os.PathLike,
    seed: int = 0,
    patches_per_center: int = 60,
    slides_per_center: int = 4,
    patch_size: int = PATCH_SIZE,
    *,
    top_folder: bool = False,
) -> dict:
    """Write a small, deterministic fake of the WILDS archive (same names, header, RGBA PNGs).

    Per center: ``slides_per_center`` slides (real-style zero-padded patients
    with center == patient // 20 and slide == 10 * center + k, so WILDS'
    invariants hold), ``patches_per_center`` patches, half of them tumour.
    Members are at the top level like WILDS' archive (``top_folder=True``
    puts them under ``camelyon17_v1.0/``). Byte-identical for a given seed.
    """
    if patches_per_center < 3 or not 1 <= slides_per_center <= 10 or patch_size < 16:
        raise ValueError(
            "need patches_per_center >= 3, 1 <= slides_per_center <= 10 and patch_size >= 16, got "
            f"{patches_per_center}, {slides_per_center}, {patch_size}"
        )
    archive_path = Path(archive_path)
    archive_path.parent.mkdir(parents=True, exist_ok=True)
    prefix = "camelyon17_v1.0/" if top_folder else ""
    rows, files = [], []
    info = {"archive": archive_path.name, "patches": {}, "tumor": {}, "slides": {}}
    for center in sorted(CENTER_TO_CLIENT):
        client = CENTER_TO_CLIENT[center]
        slides = [(f"{center * 20 + 2 * k:03d}", (3 * k + center) % 5, center * 10 + k) for k in range(slides_per_center)]
        n_tumor = 0
        for j in range(patches_per_center):
            rng = np.random.default_rng([seed, center, j])
            patient, node, slide = slides[j % slides_per_center]
            tumor = (j // slides_per_center) % 2 == 1  # both classes on every slide
            n_tumor += tumor
            # Coordinates: centres on a 32-pixel grid (level-2 pixels), distinct within a slide.
            x, y = 32 * (100 + 7 * j + center), 32 * (200 + 13 * j)
            rows.append(dict(patient=patient, node=node, x_coord=x, y_coord=y, tumor=int(tumor), slide=slide,
                             center=center, split=int(rng.random() < 0.1)))
            files.append((prefix + patch_relpath(patient, node, x, y), _png_bytes(_synthetic_patch(rng, center, tumor, patch_size), "RGBA")))
        info["patches"][client] = patches_per_center
        info["tumor"][client] = n_tumor
        info["slides"][client] = [f"patient_{p}_node_{n}" for p, n, _ in slides]
    metadata = pd.DataFrame(rows, columns=["patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split"])
    csv = metadata.to_csv(index=True, lineterminator="\n").encode("utf-8")  # header starts with ',' like WILDS'

    with atomic_file(archive_path) as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tf:
            if prefix:
                _tar_add(tf, prefix.rstrip("/"), None)
            _tar_add(tf, prefix + "RELEASE_v1.0.txt", b"Synthetic twin of Camelyon17-WILDS v1.0 (fedmedbench).\n")
            _tar_add(tf, prefix + "metadata.csv", csv)
            _tar_add(tf, prefix + "patches", None)
            made = set()
            for name, data in files:
                folder = name.rsplit("/", 1)[0]
                if folder not in made:
                    _tar_add(tf, folder, None)
                    made.add(folder)
                _tar_add(tf, name, data)
    return info


def write_synthetic(out_dir: str | os.PathLike, seed: int = 0, **options) -> dict:
    """The synthetic twin: ``<out_dir>/camelyon17_v1.0.tar.gz``.

    Options: ``patches_per_center`` (60), ``slides_per_center`` (4, at most
    10), ``patch_size`` (96; a smaller patch is a crop at native resolution, not a shrunken
    one), ``top_folder`` (False).
    """
    known = {"patches_per_center", "slides_per_center", "patch_size", "top_folder"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"camelyon17: unknown synthetic option(s) {unknown}; known: {sorted(known)}")
    return write_synthetic_release(Path(out_dir) / ARCHIVE, seed=seed, **options)
