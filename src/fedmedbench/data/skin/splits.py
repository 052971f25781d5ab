"""The dermoscopy split of record: PRR-FL's CSVs with their row order, or a seeded stratified split."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from ..store import client_rng, grouped_split, open_client, require_clients, write_split_csv
from .sites import OOD_CLIENT, PRRFL_CLIENTS, PRRFL_FRACTIONS, STORE_CLIENTS, SkinDataError

DEFAULT_SPLIT_DIR = Path(__file__).resolve().parents[4] / "resources" / "skin_prrfl"
_CSV_SPLITS = (("train", "train"), ("valid", "val"), ("test", "test"))


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
                pd.DataFrame(
                    {
                        "client": client,
                        "split": split,
                        "image_id": df["image_id"].str.strip(),
                        "label": labels.astype(np.int64),
                    }
                )
            )
    table = pd.concat(tables, ignore_index=True)
    dup = table[table.duplicated(subset=["client", "image_id"], keep=False)]
    if len(dup):
        raise SkinDataError(f"{split_dir}: image(s) listed twice in PRR-FL's CSVs: {dup.head(4).to_dict('records')}")
    return table


def check_prrfl_membership(
    client_ids: dict[str, Iterable[str]], split_dir: str | os.PathLike = DEFAULT_SPLIT_DIR
) -> list[str]:
    """Differences between our clients A-D and the union of PRR-FL's CSVs, as text (empty = equal)."""
    prrfl = read_prrfl_split(split_dir)
    problems = []
    for client in PRRFL_CLIENTS:
        ours = set(client_ids.get(client, ()))
        theirs = set(prrfl.loc[prrfl["client"] == client, "image_id"])
        if ours - theirs:
            problems.append(
                f"client {client}: {len(ours - theirs)} image(s) not in PRR-FL's CSVs, e.g. {sorted(ours - theirs)[:3]}"
            )
        if theirs - ours:
            problems.append(
                f"client {client}: {len(theirs - ours)} PRR-FL image(s) missing, e.g. {sorted(theirs - ours)[:3]}"
            )
    return problems


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
    require_clients(store_dir, STORE_CLIENTS, SkinDataError)
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
                raise SkinDataError(
                    f"client {client}: {len(rows)} images are too few for a 70/10/20 split (no {empty})"
                )
        tables.append(
            pd.DataFrame(
                {
                    "client": client,
                    "split": names,
                    "row": rows,
                    "id": meta["id"].to_numpy()[rows],
                    "group": meta["group"].to_numpy()[rows],
                }
            )
        )
    ood = open_client(store_dir, OOD_CLIENT).meta
    tables.append(
        pd.DataFrame(
            {
                "client": OOD_CLIENT,
                "split": "test",
                "row": np.arange(len(ood), dtype=np.int64),
                "id": ood["id"],
                "group": ood["group"],
            }
        )
    )
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table
