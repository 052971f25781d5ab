"""The fundus split of record: the official test folder, and the train folder cut 4:1 into train/val per domain."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from ..store import client_rng, grouped_split, open_client, require_clients, write_split_csv
from .sites import DOMAINS, FundusDataError

TRAIN_FRACTION = 0.8


def split_fedlwr(
    store_dir: str | os.PathLike,
    out_csv: str | os.PathLike,
    permutation: str = "seeded",
    seed: int = 0,
    train_fraction: float = TRAIN_FRACTION,
) -> pd.DataFrame:
    """Per domain: official train images -> train (first ``int(0.8 n)``) / val (rest), official test -> test.

    ``permutation="seeded"`` permutes the name-sorted train images with a generator seeded by
    (seed, crc32(domain)); ``"sorted"`` keeps name order (Fed-LWR's "first 80 % of the list" on a
    filesystem that lists names in order).
    """
    if permutation not in ("seeded", "sorted"):
        raise ValueError(f"permutation must be 'seeded' or 'sorted', got {permutation!r}")
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    require_clients(store_dir, DOMAINS, FundusDataError)
    tables = []
    for domain in DOMAINS:
        meta = open_client(store_dir, domain).meta
        if "official_split" not in meta.columns:
            raise FundusDataError(f"store client {domain} has no 'official_split' column: rebuild the store")
        official = meta["official_split"].to_numpy()
        order = np.argsort(meta["name"].to_numpy(), kind="stable")
        train_rows = order[official[order] == "train"]
        test_rows = order[official[order] == "test"]
        if permutation == "seeded":
            # Whole patients to train or val (RIM-ONE has both eyes of a patient: G-1-L, G-1-R).
            rng = client_rng(seed, domain)
            groups = meta["group"].to_numpy(str)[train_rows]
            picked, names = grouped_split(groups, rng, lambda n: (int(n * train_fraction), n))
            by_split = np.argsort(names == "val", kind="stable")  # train rows first, then val
            train_rows, n_train = train_rows[picked[by_split]], int((names == "train").sum())
        else:
            n_train = int(len(train_rows) * train_fraction)
        if n_train == 0 or n_train == len(train_rows) or len(test_rows) == 0:
            raise FundusDataError(
                f"client {domain}: {len(train_rows)} train / {len(test_rows)} test images are too few for a "
                f"train/val/test split"
            )
        rows = np.concatenate([train_rows, test_rows]).astype(np.int64)
        names = ["train"] * n_train + ["val"] * (len(train_rows) - n_train) + ["test"] * len(test_rows)
        tables.append(
            pd.DataFrame(
                {
                    "client": domain,
                    "split": names,
                    "row": rows,
                    "id": meta["id"].to_numpy()[rows],
                    "group": meta["group"].to_numpy()[rows],
                }
            )
        )
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table
