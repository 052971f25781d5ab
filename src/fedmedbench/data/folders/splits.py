"""The split: each site's groups (image stem, NIfTI volume, classification ``group``) cut into
train/val/test from a seeded permutation, or the user's ``split_csv`` followed."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import closest
from ..store import SPLITS, client_rng, grouped_split, list_clients, open_client, split_groups, write_split_csv
from .groups import ImageNames, normalise_image
from .options import SPLIT_CSV_COLUMNS, FoldersDataError, FoldersOptions
from .reading import _line, read_option_csv


def _cut(site: str, fractions: Sequence[float], n_rows: int) -> Callable[[int], tuple[int, int]]:
    """(end of train, end of val) in groups: val and test get max(1, round(f * n)), train the rest."""

    def cut(n_groups: int) -> tuple[int, int]:
        n_val = max(1, int(np.floor(fractions[1] * n_groups + 0.5)))
        n_test = max(1, int(np.floor(fractions[2] * n_groups + 0.5)))
        n_train = n_groups - n_val - n_test
        if n_train < 1:
            shown = "/".join(f"{f:g}" for f in fractions)
            raise FoldersDataError(
                f"site {site}: {n_groups} group(s) ({n_rows} images) are too few for fractions {shown}: "
                f"train/val/test would get {max(n_train, 0)}/{n_val}/{n_test} groups, each needs at least one (need 3 groups)"
            )
        return n_train, n_train + n_val

    return cut


def _seeded_split(site: str, meta: pd.DataFrame, options: FoldersOptions, permutation: str, seed: int):
    groups = meta["group"].to_numpy(str)
    cut = _cut(site, options.fractions, len(meta))
    if permutation == "seeded":
        return grouped_split(groups, client_rng(seed, site), cut)
    names = split_groups(groups, None, cut)  # sorted groups, rows in store order
    rank = {name: k for k, name in enumerate(SPLITS)}
    rows = np.argsort([rank[n] for n in names], kind="stable").astype(np.int64)
    return rows, names[rows]


def _read_user_split(path: Path, metas: dict[str, pd.DataFrame], log) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(rows, split names) per site from the user's CSV, in the CSV's order; it must name every image
    of the store once and only images of the store."""
    table = read_option_csv(path, "split_csv", SPLIT_CSV_COLUMNS)
    # Store rows by source path (a NIfTI volume has many); a row names its image as ImageNames allows.
    rows_of: dict[str, dict[str, list[int]]] = {site: {} for site in metas}
    for site, meta in metas.items():
        for row, source in enumerate(meta["source"]):
            rows_of[site].setdefault(source, []).append(row)
    names = {site: ImageNames(site, list(rows_of[site])) for site in metas}
    picked: dict[str, list[tuple[int, str]]] = {site: [] for site in metas}
    seen: dict[tuple[str, str], int] = {}
    unknown = []
    for i, row in enumerate(table.itertuples(index=False)):
        site, image, name = str(row.site).strip(), normalise_image(str(row.image)), str(row.split).strip()
        where = f"{path} line {_line(i)}"
        if site not in metas:
            raise FoldersDataError(f"{where}: site {site!r} is not in the data{closest(site, metas)} (sites: {sorted(metas)})")
        if name not in SPLITS:
            raise FoldersDataError(f"{where}: split {name!r} is not one of {list(SPLITS)}{closest(name, SPLITS)}")
        source = names[site].resolve(image, where)
        if source is None:
            unknown.append((where, site, image))
            continue
        key = (site, source)
        if key in seen:
            raise FoldersDataError(f"{where}: image {image} of site {site} is listed twice (lines {seen[key]} and {_line(i)})")
        seen[key] = _line(i)
        picked[site] += [(r, name) for r in rows_of[site][source]]
    if unknown:
        where, site, image = unknown[0]
        raise names[site].unknown(where, image, len(unknown) - 1)
    out = {}
    for site, meta in metas.items():
        covered = {r for r, _ in picked[site]}
        left = [meta["source"].iloc[r] for r in range(len(meta)) if r not in covered]
        if left:
            raise FoldersDataError(f"{path}: {len(set(left))} image(s) of site {site} are in no split, e.g. {left[0]}; "
                                   "every image needs a row (remove images you do not want from the data folder)")
        rows = np.array([r for r, _ in picked[site]], np.int64)
        names = np.array([n for _, n in picked[site]])
        counts = [int((names == s).sum()) for s in SPLITS]
        if min(counts) == 0:
            raise FoldersDataError(f"{path}: site {site} has train/val/test = {counts[0]}/{counts[1]}/{counts[2]} images; "
                                   "each split needs at least one")
        per_group = pd.DataFrame({"group": meta["group"].to_numpy(str)[rows], "split": names}).groupby("group")["split"].nunique()
        spanning = sorted(per_group.index[per_group > 1])
        if spanning:
            log(f"folders {site}: warning: {len(spanning)} group(s) of {path.name} are in more than one split "
                f"(e.g. {spanning[0]}); kept as given")
        out[site] = (rows, names)
    return out


def split(store_dir, out_csv, protocol: str = "", *, options: Mapping | FoldersOptions, permutation: str = "default",
          seed: int | None = None, log: Callable[[str], object] = print) -> pd.DataFrame:
    """The split of record of every site, written to ``out_csv``.

    With ``options.split_csv``: the user's split. Otherwise groups are cut with ``options.fractions``
    after a permutation: ``seeded`` (= ``default``; generator seeded with (seed, crc32(site)), rows in
    random order inside a split) or ``sorted`` (sorted groups, store order). ``seed``: the pipeline's
    split seed; ``None`` uses ``options.seed``.
    """
    options = FoldersOptions.from_dict(options)
    permutation = "seeded" if permutation == "default" else permutation
    if permutation not in ("seeded", "sorted"):
        raise ValueError(f"permutation must be 'default', 'seeded' or 'sorted', got {permutation!r}")
    seed = options.seed if seed is None else seed
    sites = list_clients(store_dir)
    if not sites:
        raise FoldersDataError(f"store {store_dir} holds no site (run the preprocessing step first)")
    metas = {site: open_client(store_dir, site).meta for site in sites}
    if options.split_csv is not None:
        chosen = _read_user_split(Path(options.split_csv), metas, log)
    else:
        chosen = {site: _seeded_split(site, metas[site], options, permutation, seed) for site in sites}
    tables = []
    for site in sites:
        rows, names = chosen[site]
        meta = metas[site]
        tables.append(pd.DataFrame({"client": site, "split": names, "row": rows,
                                    "id": meta["id"].to_numpy()[rows], "group": meta["group"].to_numpy()[rows]}))
        counts = "/".join(str(int((names == s).sum())) for s in SPLITS)
        source = Path(options.split_csv).name if options.split_csv else f"{permutation} seed {seed}"
        log(f"folders {site}: train/val/test = {counts} images, {meta['group'].nunique()} groups ({source})")
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table
