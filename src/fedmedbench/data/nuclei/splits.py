"""The nuclei split of record: image-level (or patient-level), seeded, with HarmoFL's fractions."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from .. import check_protocol
from ..prostate.sites import HARMOFL_FRACTIONS
from ..prostate.splits import cut_points
from ..store import client_rng, open_client, require_clients, write_split_csv
from .sites import PROTOCOLS, NucleiDataError

PERMUTATIONS = ("default", "official", "image", "patient")


def _official_parts(groups: np.ndarray, meta: pd.DataFrame, key: np.ndarray) -> dict[str, np.ndarray]:
    """Official test images stay test; 20 % of the (permuted) rest becomes validation."""
    official_test = set(key[meta["subset"].astype(str).to_numpy() == "test"])
    if official_test:
        test = np.array([g for g in groups if g in official_test])
        rest = np.array([g for g in groups if g not in official_test])
    else:  # TNBC: no official split
        cut = int(len(groups) * 0.8)
        rest, test = groups[:cut], groups[cut:]
    n_val = max(1, int(len(rest) * 0.2)) if len(rest) >= 2 else 0  # small (synthetic) sites keep a val image
    train_end = len(rest) - n_val
    return {"train": rest[:train_end], "val": rest[train_end:], "test": test}


def split(
    store_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    protocol: str,
    *,
    permutation: str = "default",
    seed: int = 0,
) -> pd.DataFrame:
    """Per-client seeded grouped split, written to ``out_csv``.

    ``permutation``: ``default`` (= ``official``) is HarmoFL's appendix: the datasets' own train/test
    split (MoNuSAC, MoNuSeg), 20 % of the training images for validation; TNBC has no official split,
    so 20 % of its images are held out for test first. ``image`` pools everything and cuts HarmoFL's
    64/16/20 by source image
    (all tiles of an image in one split); ``patient`` the same by patient.
    ``image`` groups the rows by source image
    (all tiles of an image in one split); ``patient`` by patient. Groups are
    sorted, permuted with a generator seeded by (seed, crc32(client)), then cut
    at int(0.64 n) and int(0.8 n) groups. Every split must be non-empty.
    """
    check_protocol("nuclei", protocol, PROTOCOLS)
    if permutation not in PERMUTATIONS:
        raise ValueError(f"nuclei: permutation must be one of {PERMUTATIONS}, got {permutation!r}")
    require_clients(store_dir, PROTOCOLS[protocol], NucleiDataError)
    tables = []
    for client in PROTOCOLS[protocol]:
        meta = open_client(store_dir, client).meta
        key = meta["patient"] if permutation == "patient" else meta["group"]
        key = key.astype(str).to_numpy()
        groups = np.array(sorted(set(key)))
        rng = client_rng(seed, client)
        groups = groups[rng.permutation(len(groups))]
        if permutation in ("default", "official"):
            parts = _official_parts(groups, meta, key)
        else:
            train_end, val_end = cut_points(len(groups), HARMOFL_FRACTIONS)
            parts = {"train": groups[:train_end], "val": groups[train_end:val_end], "test": groups[val_end:]}
        empty = [name for name, g in parts.items() if len(g) == 0]
        if empty:
            raise NucleiDataError(
                f"client {client} in {store_dir}: {len(groups)} {permutation if permutation != 'default' else 'image'} "
                f"group(s) leave the {empty} split(s) empty; at least 3 groups are needed"
            )
        rows_of = pd.Series(np.arange(len(meta))).groupby(key).apply(list).to_dict()
        for name, names in parts.items():
            rows = np.array([r for g in names for r in rows_of[g]], dtype=np.int64)
            tables.append(
                pd.DataFrame(
                    {
                        "client": client,
                        "split": name,
                        "row": rows,
                        "id": meta["id"].to_numpy()[rows],
                        "group": meta["group"].to_numpy()[rows],
                    }
                )
            )
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table
