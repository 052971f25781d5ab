"""The prostate splits of record: HarmoFL's slice-level index files, seeded and Fed-LWR case-level splits."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..store import client_rng, grouped_split, open_client, require_clients, split_groups, write_split_csv
from .sites import (
    DEFAULT_INDEX_DIR,
    FEDLWR_CLIENTS,
    FEDLWR_FRACTIONS,
    HARMOFL_CLIENTS,
    HARMOFL_FRACTIONS,
    ProstateDataError,
)


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
    require_clients(store_dir, HARMOFL_CLIENTS, ProstateDataError)
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
            perm, split = grouped_split(
                meta["group"].to_numpy(str), rng, lambda cases, client=client: case_cut_points(cases, fractions, client)
            )
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
    require_clients(store_dir, FEDLWR_CLIENTS, ProstateDataError)
    tables = []
    for client in FEDLWR_CLIENTS:
        meta = open_client(store_dir, client).meta
        rng = client_rng(seed, client) if permutation == "seeded" else None
        names = split_groups(
            meta["group"].to_numpy(str), rng, lambda cases, client=client: case_cut_points(cases, fractions, client)
        )
        rank = {"train": 0, "val": 1, "test": 2}
        rows = np.argsort([rank[name] for name in names], kind="stable").astype(np.int64)  # store order inside a split
        tables.append(
            pd.DataFrame(
                {
                    "client": client,
                    "split": names[rows],
                    "row": rows,
                    "id": meta["id"].to_numpy()[rows],
                    "group": meta["group"].to_numpy()[rows],
                }
            )
        )
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table
