"""Canonical on-disk store shared by every dataset family, and split CSV helpers.

Layout, one folder per client::

    <store>/<client>/images.npy   uint8, N x H x W x C
    <store>/<client>/labels.npy   uint8 N x H x W (segmentation) or int64 N (classification)
    <store>/<client>/meta.csv     one row per sample; at least id, group, source

``group`` is the unit that must never be split across train and test to avoid
leakage (case, patient, slide, lesion); ``source`` is the raw file the sample
came from, relative to the raw root, so every array row can be traced back.

A split file is a CSV with columns ``client,split,row,id,group``: ``row`` indexes
the client's arrays, ``split`` is one of train/val/test. The order of rows
inside a split is meaningful (e.g. HarmoFL truncates every client's training
set to its first rows), so writers keep it.

Everything here writes atomically (temporary file or folder beside the final
path, then rename), so a crash or a Snakemake kill never leaves a half-written
output that a later step would mistake for a finished one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .. import faults
from ..errors import DataError, plain
from ..files import naming_full_disk, new_folder
from .staging import locked_atomic_file, staging_folder

__all__ = [
    "SPLITS",
    "SPLIT_COLUMNS",
    "META_COLUMNS",
    "ClientData",
    "atomic_write_text",
    "atomic_write_csv",
    "staged_dir",
    "write_client",
    "mark_random_pixels",
    "random_pixels",
    "store_info",
    "open_client",
    "list_clients",
    "require_clients",
    "write_split_csv",
    "read_split_csv",
    "split_rows",
    "client_rng",
    "split_groups",
    "grouped_split",
]

SPLITS = ("train", "val", "test")
SPLIT_COLUMNS = ["client", "split", "row", "id", "group"]
META_COLUMNS = ["id", "group", "source"]

IMAGES_FILE = "images.npy"
LABELS_FILE = "labels.npy"
META_FILE = "meta.csv"
NPY_HEADER_BYTES = 128  # np.save's header (format 1.0, padded to 64 bytes) for the store's arrays
# The store's own description (family, classes, counts...), at its top beside the client folders.
INFO_FILE = "info.json"


# ---------------------------------------------------------------------------
# Atomic writes
# ---------------------------------------------------------------------------


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """``fedmedbench.files.atomic_write_text`` that also removes the temporaries of ``path`` a killed
    run left behind (split files, info.json, checksum sidecars)."""
    # newline="" keeps "\n" as written: outputs are byte-identical across platforms.
    with (
        naming_full_disk(path, len(text.encode(encoding))),
        locked_atomic_file(path, "w", encoding=encoding, newline="") as handle,
    ):
        handle.write(text)
    return Path(path)


def atomic_write_csv(df: pd.DataFrame, path: str | os.PathLike, **to_csv_kwargs) -> Path:
    """Write a DataFrame as CSV atomically (``index=False`` unless told otherwise)."""
    to_csv_kwargs.setdefault("index", False)
    to_csv_kwargs.setdefault("lineterminator", "\n")
    return atomic_write_text(path, df.to_csv(**to_csv_kwargs))


@contextmanager
def staged_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder that replaces ``final`` when the block succeeds.

    On any exception the temporary folder is deleted and ``final`` is left
    untouched. An existing ``final`` is moved aside, the new folder renamed in,
    then the old one deleted: readers never see a partly written folder.
    Temporaries of ``final`` left by a killed run are removed first.
    """
    final = Path(final)
    # new_folder: a failed step leaves no empty parent folders behind; staging_folder: the stale
    # temporaries of a killed run are removed, ours is locked until it is renamed.
    with new_folder(final.parent), staging_folder(final) as tmp:
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = None
        try:
            if final.exists() or final.is_symlink():
                old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.old-"))
                os.rmdir(old)  # only the unique name was wanted; rename needs it absent
                os.rename(final, old)
            os.rename(tmp, final)
        except BaseException:
            if old is not None and old.exists() and not final.exists():
                os.rename(old, final)  # put the previous version back
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


# ---------------------------------------------------------------------------
# Client arrays
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientData:
    """One client's samples. ``images`` and ``labels`` are read-only memory maps."""

    name: str
    path: Path
    images: np.ndarray
    labels: np.ndarray
    meta: pd.DataFrame

    def __len__(self) -> int:
        return int(self.images.shape[0])


def _check_client_name(client: str) -> None:
    if (
        not isinstance(client, str)
        or not client
        or client in (".", "..")
        or client.startswith(".")
        or "/" in client
        or "\\" in client
    ):
        raise ValueError(
            f"invalid client name {client!r}: it must be a plain folder name "
            "(no path separators, not starting with '.')"
        )


def _validate_arrays(client: str, images: np.ndarray, labels: np.ndarray, meta: pd.DataFrame) -> None:
    where = f"client {client!r}"
    if not isinstance(images, np.ndarray) or images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(
            f"{where}: images must be a uint8 array N x H x W x C, got "
            f"{type(images).__name__} {getattr(images, 'dtype', '?')} shape {getattr(images, 'shape', '?')}"
        )
    n = images.shape[0]
    if n == 0:
        raise ValueError(f"{where}: no samples (images has N = 0)")
    if not isinstance(labels, np.ndarray):
        raise ValueError(f"{where}: labels must be a numpy array, got {type(labels).__name__}")
    if labels.ndim == 3:
        if labels.dtype != np.uint8 or labels.shape != images.shape[:3]:
            raise ValueError(
                f"{where}: segmentation labels must be uint8 with shape {images.shape[:3]} "
                f"(N x H x W of the images), got {labels.dtype} {labels.shape}"
            )
    elif labels.ndim == 1:
        if labels.dtype != np.int64 or labels.shape[0] != n:
            raise ValueError(
                f"{where}: classification labels must be int64 of length {n}, got {labels.dtype} {labels.shape}"
            )
    else:
        raise ValueError(
            f"{where}: labels must be N x H x W (segmentation) or N (classification), got shape {labels.shape}"
        )
    if not isinstance(meta, pd.DataFrame):
        raise ValueError(f"{where}: meta must be a pandas DataFrame, got {type(meta).__name__}")
    missing = [c for c in META_COLUMNS if c not in meta.columns]
    if missing:
        raise ValueError(f"{where}: meta lacks required column(s) {missing}; it has {list(meta.columns)}")
    if len(meta) != n:
        raise ValueError(f"{where}: meta has {len(meta)} rows but there are {n} images")
    for col in META_COLUMNS:
        if meta[col].isna().any() or (meta[col].astype(str) == "").any():
            raise ValueError(f"{where}: meta column {col!r} has empty values")
    dup = meta["id"][meta["id"].duplicated()]
    if len(dup):
        raise ValueError(f"{where}: meta ids must be unique; duplicated: {list(dup.head(5))}")


def write_client(
    store_dir: str | os.PathLike,
    client: str,
    images: np.ndarray,
    labels: np.ndarray,
    meta: pd.DataFrame,
) -> Path:
    """Validate and write one client's arrays and metadata; returns the client folder.

    The folder is built under a temporary name and renamed into place, so a
    client folder that exists is always complete.
    """
    _check_client_name(client)
    _validate_arrays(client, images, labels, meta)
    final = Path(store_dir) / client
    meta_text = meta.reset_index(drop=True).to_csv(index=False, lineterminator="\n")
    # A full disk names the file (its final place) and its size: an .npy file is its array and a header.
    with staged_dir(final) as tmp:
        with naming_full_disk(final / IMAGES_FILE, images.nbytes + NPY_HEADER_BYTES):
            np.save(tmp / IMAGES_FILE, np.ascontiguousarray(images), allow_pickle=False)
        faults.reached("store_write")  # test hook: a kill with the client folder half written
        with naming_full_disk(final / LABELS_FILE, labels.nbytes + NPY_HEADER_BYTES):
            np.save(tmp / LABELS_FILE, np.ascontiguousarray(labels), allow_pickle=False)
        with (
            naming_full_disk(final / META_FILE, len(meta_text.encode("utf-8"))),
            open(tmp / META_FILE, "w", encoding="utf-8", newline="") as handle,
        ):
            handle.write(meta_text)
    return final


def mark_random_pixels(store_dir: str | os.PathLike, made_by: str) -> Path:
    """Say in the store's ``info.json`` that its pixels are random (``"pixels": "random"``): a store
    of the papers' shapes for timing jobs, which a run that does not say its data are synthetic
    refuses to train on (``random_pixels``)."""
    return atomic_write_text(
        Path(store_dir) / INFO_FILE, json.dumps({"pixels": "random", "made_by": made_by}, indent=2) + "\n"
    )


def store_info(store_dir: str | os.PathLike) -> dict:
    """The store's ``info.json`` (empty when it has none: some families write none)."""
    path = Path(store_dir) / INFO_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a JSON object ({err}); rebuild the store") from None
    if not isinstance(info, dict):
        raise DataError(f"{path}: not a JSON object (a {type(info).__name__}); rebuild the store")
    return info


def random_pixels(store_dir: str | os.PathLike) -> bool:
    """Whether the store's ``info.json`` says its pixels are random (``mark_random_pixels``)."""
    return store_info(store_dir).get("pixels") == "random"


def list_clients(store_dir: str | os.PathLike) -> list[str]:
    """Sorted names of the client folders in a store (hidden/temporary folders excluded)."""
    store_dir = Path(store_dir)
    if not store_dir.is_dir():
        raise FileNotFoundError(f"store folder {store_dir} does not exist (run the preprocessing step first)")
    return sorted(
        p.name for p in store_dir.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / IMAGES_FILE).is_file()
    )


def require_clients(store_dir: str | os.PathLike, clients, error: type[Exception] = ValueError) -> None:
    """Stop with ``error`` naming the clients of a protocol that the store lacks (a split needs them all)."""
    present = list_clients(store_dir)
    missing = [c for c in clients if c not in present]
    if missing:
        raise error(f"store {store_dir} lacks client(s) {missing} (found {present})")


def open_client(store_dir: str | os.PathLike, client: str) -> ClientData:
    """Open one client of a store; arrays are memory-mapped read-only, so this is cheap."""
    _check_client_name(client)
    folder = Path(store_dir) / client
    if not folder.is_dir():
        try:
            known = list_clients(store_dir)
        except FileNotFoundError:
            known = []
        raise FileNotFoundError(f"client {client!r} not found in store {store_dir} (clients there: {known})")
    for name in (IMAGES_FILE, LABELS_FILE, META_FILE):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} is missing: the store for client {client!r} is incomplete")
    images = np.load(folder / IMAGES_FILE, mmap_mode="r", allow_pickle=False)
    labels = np.load(folder / LABELS_FILE, mmap_mode="r", allow_pickle=False)
    # ids and groups are names ("BIDMC/Case00", patient "004"), never numbers or NaN.
    meta = pd.read_csv(
        folder / META_FILE,
        dtype={c: str for c in META_COLUMNS},
        keep_default_na=False,
    )
    missing = [c for c in META_COLUMNS if c not in meta.columns]
    if missing:
        raise DataError(f"{folder / META_FILE}: missing required column(s) {missing}")
    if len(meta) != images.shape[0] or labels.shape[0] != images.shape[0]:
        raise DataError(
            f"{folder}: inconsistent sizes: images {images.shape[0]}, labels {labels.shape[0]}, meta rows {len(meta)}"
        )
    return ClientData(name=client, path=folder, images=images, labels=labels, meta=meta)


# ---------------------------------------------------------------------------
# Split CSVs
# ---------------------------------------------------------------------------


def _check_split_frame(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """Validate a split table and return it with ``row`` as int64. ``where`` names the source."""
    missing = [c for c in SPLIT_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(
            f"{where}: missing column(s) {missing}; expected at least {SPLIT_COLUMNS}, got {list(df.columns)}"
        )
    bad_split = sorted(set(df["split"].astype(str)) - set(SPLITS))
    if bad_split:
        raise DataError(f"{where}: unknown split name(s) {bad_split}; allowed: {list(SPLITS)}")
    rows = pd.to_numeric(df["row"], errors="coerce")
    bad = df.index[rows.isna() | (rows < 0) | (rows != rows.round())]
    if len(bad):
        raise DataError(
            f"{where}: column 'row' must hold non-negative integers; bad value(s) {plain(df.loc[bad[:5], 'row'])}"
        )
    for col in ("client", "id", "group"):
        empty = df[col].isna() | (df[col].astype(str) == "")
        if empty.any():
            raise DataError(f"{where}: column {col!r} has {int(empty.sum())} empty value(s)")
    out = df.copy()
    out["row"] = rows.astype(np.int64)
    dup = out.duplicated(subset=["client", "row"], keep=False)
    if dup.any():
        first = out.loc[dup, ["client", "row", "split"]].head(6).to_dict("records")
        raise DataError(f"{where}: a (client, row) appears more than once, e.g. {first}")
    return out


def write_split_csv(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Validate and write a split CSV atomically.

    Rows are sorted by client, then split (train, val, test), then their
    position in ``df``: the order inside a split is preserved on purpose.
    """
    df = _check_split_frame(df, f"split table for {path}")
    rank = {name: i for i, name in enumerate(SPLITS)}
    order = (
        df.assign(_split_rank=df["split"].map(rank), _pos=np.arange(len(df)))
        .sort_values(["client", "_split_rank", "_pos"], kind="stable")
        .drop(columns=["_split_rank", "_pos"])
    )
    extra = [c for c in order.columns if c not in SPLIT_COLUMNS]
    return atomic_write_csv(order[SPLIT_COLUMNS + extra], path)


def read_split_csv(path: str | os.PathLike) -> pd.DataFrame:
    """Read and validate a split CSV; errors name the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"split file {path} does not exist")
    try:
        df = pd.read_csv(
            path,
            dtype={"client": str, "split": str, "id": str, "group": str},
            keep_default_na=False,
        )
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a readable CSV split file ({exc})") from exc
    return _check_split_frame(df, str(path))


def client_rng(seed: int, client: str) -> np.random.Generator:
    """The generator of one client's seeded split, seeded with (seed, crc32(client name)): each client
    has its own stream, whatever the other clients are and in whatever order they are split."""
    return np.random.default_rng([int(seed), zlib.crc32(client.encode("utf-8"))])


def split_groups(
    groups: np.ndarray,
    rng: np.random.Generator | None,
    cut: Callable[[int], tuple[int, int]],
    strata: np.ndarray | None = None,
) -> np.ndarray:
    """The split name of every row of one client, every group (patient, case, lesion, slide) in
    exactly one split. This is the one place where the seeded splits of every family cut groups.

    Within each stratum (e.g. a class; a group belongs to the stratum of its first row) the sorted
    groups are permuted by ``rng`` (``None``: kept sorted) and cut by
    ``cut(number of groups) -> (end of train, end of val)``: first train, then val, then test.
    """
    groups = np.asarray(groups).astype(str)
    strata = np.zeros(len(groups), np.int64) if strata is None else np.asarray(strata)
    unique, first = np.unique(groups, return_index=True)
    group_stratum = strata[first]
    split_of: dict[str, str] = {}
    for stratum in np.unique(group_stratum):
        members = unique[group_stratum == stratum]
        if rng is not None:
            members = members[rng.permutation(len(members))]
        train_end, val_end = cut(len(members))
        split_of.update(
            {g: ("train" if k < train_end else "val" if k < val_end else "test") for k, g in enumerate(members)}
        )
    return np.array([split_of[g] for g in groups])


def grouped_split(
    groups: np.ndarray,
    rng: np.random.Generator,
    cut: Callable[[int], tuple[int, int]],
    strata: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, split name per row): ``split_groups`` with the rows in random order, so training that
    truncates a split to its first rows sees every stratum and many groups."""
    names = split_groups(groups, rng, cut, strata)
    rows = rng.permutation(len(names)).astype(np.int64)
    return rows, names[rows]


def split_rows(split_df: pd.DataFrame, client: str, split: str) -> np.ndarray:
    """Row indices of one client's split, in file order (int64)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {list(SPLITS)}")
    sel = split_df[(split_df["client"] == client) & (split_df["split"] == split)]
    return sel["row"].to_numpy(dtype=np.int64)
