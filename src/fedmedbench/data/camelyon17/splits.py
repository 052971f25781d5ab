"""The Camelyon17 split of record (ours: HarmoFL's is unrecoverable): seeded, per hospital."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from ...errors import plain
from .. import check_protocol
from ..store import client_rng, grouped_split, open_client, require_clients, write_split_csv
from .sites import CLIENTS, PROTOCOLS, CamelyonDataError

TEST_FRACTION = 0.2
VAL_FRACTION = 0.2  # of what is left after the test split
PERMUTATIONS = ("default", "image", "patch", "slide")


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
            raise CamelyonDataError(
                f"a slide-level split needs at least 3 slides per client, got {s} ({plain(np.unique(groups))})"
            )
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
    check_protocol("camelyon17", protocol, PROTOCOLS)
    if permutation not in PERMUTATIONS:
        raise ValueError(f"camelyon17: permutation must be one of {PERMUTATIONS}, got {permutation!r}")
    require_clients(store_dir, CLIENTS, CamelyonDataError)
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
            tables.append(
                pd.DataFrame({"client": client, "split": name, "row": rows, "id": ids[rows], "group": groups[rows]})
            )
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table
