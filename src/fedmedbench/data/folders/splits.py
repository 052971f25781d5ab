"""The split: each site's groups (image stem, NIfTI volume, classification ``group``) cut into
train/val/test from a seeded permutation, or the user's ``split_csv`` followed.

A classification site is cut stratified by class within groups (``stratified_split_groups``): the
splits hold as many groups as without classes, and each class is spread over them, train first, so
a rare class is not left out of training by chance. A class that cannot be in every split is logged
with the reason (``class_notes``)."""

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


def group_classes(groups: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted unique groups, each row's index into them, each group's class): a group's class is its
    most frequent label, the lower class index on a tie (a patient with two lesions of two classes)."""
    unique, inverse = np.unique(np.asarray(groups).astype(str), return_inverse=True)
    labels = np.asarray(labels, np.int64)
    counts = np.zeros((len(unique), int(labels.max()) + 1 if len(labels) else 1), np.int64)
    np.add.at(counts, (inverse, labels), 1)
    return unique, inverse, counts.argmax(1)


def stratified_split_groups(
    groups: np.ndarray, labels: np.ndarray, rng: np.random.Generator | None, cut: Callable[[int], tuple[int, int]]
) -> np.ndarray:
    """The split name of every row, every group in one split, the splits holding as many groups as
    ``cut(number of groups)`` gives them (the unstratified rule, so the sizes do not depend on the
    labels), and each class spread over them by its groups (a group's class: ``group_classes``).

    First each class gets one group in train, then one in test, then one in val, while it has groups
    left and the split has room (classes with at least one group per split first, then the larger
    ones; ``rng`` orders classes of one size and each class's groups, ``None`` keeps them sorted).
    Then each remaining place goes to the class furthest below its share of that split. So a class
    with as many groups as splits is in every split unless a split holds fewer groups than there
    are such classes, and any class is in train before it is in test or val."""
    unique, inverse, group_class = group_classes(groups, labels)
    train_end, val_end = cut(len(unique))
    room = {"train": train_end, "val": val_end - train_end, "test": len(unique) - val_end}
    share = {s: room[s] / len(unique) for s in SPLITS}
    classes = np.unique(group_class)
    members = {int(c): list(np.flatnonzero(group_class == c)) for c in classes}
    tie = {int(c): k for k, c in enumerate(classes if rng is None else rng.permutation(classes))}
    if rng is not None:
        members = {c: [m[k] for k in rng.permutation(len(m))] for c, m in members.items()}
    size = {c: len(m) for c, m in members.items()}
    order = sorted(members, key=lambda c: (size[c] < len(SPLITS), -size[c], tie[c]))
    split_of = np.empty(len(unique), dtype=object)
    placed = {s: dict.fromkeys(members, 0) for s in SPLITS}

    def place(c: int, s: str) -> None:
        split_of[members[c].pop(0)] = s
        room[s] -= 1
        placed[s][c] += 1

    for s in ("train", "test", "val"):  # one group of each class per split, train first
        for c in order:
            if members[c] and room[s]:
                place(c, s)
    while any(members.values()):  # the rest: the (split, class) furthest below the class's share of the split
        s, c = max(
            ((s, c) for s in SPLITS if room[s] for c in order if members[c]),
            key=lambda sc: (
                share[sc[0]] * size[sc[1]] - placed[sc[0]][sc[1]],
                -SPLITS.index(sc[0]),
                -order.index(sc[1]),
            ),
        )
        place(c, s)
    return split_of[inverse].astype(str)


def _label_indices(meta: pd.DataFrame, options: FoldersOptions) -> np.ndarray | None:
    """Each row's class index for a classification store (its ``label`` column holds class names),
    None for segmentation (its split is not stratified)."""
    if options.kind != "classification" or "label" not in meta.columns:
        return None
    index = {name: k for k, name in enumerate(options.classes)}
    return np.array([index[str(v)] if str(v) in index else int(v) for v in meta["label"]], np.int64)


def _seeded_split(site: str, meta: pd.DataFrame, options: FoldersOptions, permutation: str, seed: int):
    """(rows, split name per row) of one site: its groups cut by ``options.fractions``; for a
    classification task the classes are spread over the splits (``stratified_split_groups``)."""
    groups = meta["group"].to_numpy(str)
    cut = _cut(site, options.fractions, len(meta))
    labels = _label_indices(meta, options)
    if permutation == "seeded":
        if labels is None:
            return grouped_split(groups, client_rng(seed, site), cut)
        rng = client_rng(seed, site)
        names = stratified_split_groups(groups, labels, rng, cut)
        rows = rng.permutation(len(names)).astype(np.int64)  # as grouped_split: rows in random order
        return rows, names[rows]
    names = split_groups(groups, None, cut) if labels is None else stratified_split_groups(groups, labels, None, cut)
    rank = {name: k for k, name in enumerate(SPLITS)}
    rows = np.argsort([rank[n] for n in names], kind="stable").astype(np.int64)
    return rows, names[rows]


def class_notes(
    meta: pd.DataFrame, rows: np.ndarray, names: np.ndarray, options: FoldersOptions, user_split: str | None = None
) -> list[str]:
    """One line per class of a classification site that is not in every split, and why: it has fewer
    groups than splits, a split holds fewer groups than the site has classes, or ``user_split`` (the
    user's split file) puts it so. Empty for segmentation."""
    labels = _label_indices(meta, options)
    if labels is None or not len(rows):
        return []
    labels, groups = labels[rows], meta["group"].to_numpy(str)[rows]
    n_classes = len(np.unique(labels))
    notes = []
    for k in np.unique(labels):
        present = [s for s in SPLITS if ((labels == k) & (names == s)).any()]
        absent = [s for s in SPLITS if s not in present]
        if not absent:
            continue
        n_groups = len(set(groups[labels == k]))
        if user_split:
            why = f"as {user_split} puts its images"
        else:
            parts = (
                [f"its images are {n_groups} group(s), fewer than the {len(SPLITS)} splits"]
                if n_groups < len(SPLITS)
                else []
            )
            if len(present) < min(n_groups, len(SPLITS)):  # it had a group to spare: the split was full
                held = {s: len(set(groups[names == s])) for s in absent}
                parts.append(
                    ", ".join(f"{s} holds {n} group(s)" for s, n in held.items())
                    + f" for the site's {n_classes} classes"
                )
            why = "; ".join(parts)
        notes.append(
            f"class {int(k)} {options.classes[k]!r} is in {' and '.join(present)} only, none in {' and '.join(absent)} "
            f"({why})"
        )
    return notes


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
            raise FoldersDataError(
                f"{where}: site {site!r} is not in the data{closest(site, metas)} (sites: {sorted(metas)})"
            )
        if name not in SPLITS:
            raise FoldersDataError(f"{where}: split {name!r} is not one of {list(SPLITS)}{closest(name, SPLITS)}")
        source = names[site].resolve(image, where)
        if source is None:
            unknown.append((where, site, image))
            continue
        key = (site, source)
        if key in seen:
            raise FoldersDataError(
                f"{where}: image {image} of site {site} is listed twice (lines {seen[key]} and {_line(i)})"
            )
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
            raise FoldersDataError(
                f"{path}: {len(set(left))} image(s) of site {site} are in no split, e.g. {left[0]}; "
                "every image needs a row (remove images you do not want from the data folder)"
            )
        rows = np.array([r for r, _ in picked[site]], np.int64)
        names = np.array([n for _, n in picked[site]])
        counts = [int((names == s).sum()) for s in SPLITS]
        if min(counts) == 0:
            raise FoldersDataError(
                f"{path}: site {site} has train/val/test = {counts[0]}/{counts[1]}/{counts[2]} images; "
                "each split needs at least one"
            )
        per_group = (
            pd.DataFrame({"group": meta["group"].to_numpy(str)[rows], "split": names})
            .groupby("group")["split"]
            .nunique()
        )
        spanning = sorted(per_group.index[per_group > 1])
        if spanning:
            log(
                f"folders {site}: warning: {len(spanning)} group(s) of {path.name} are in more than one split "
                f"(e.g. {spanning[0]}); kept as given"
            )
        out[site] = (rows, names)
    return out


def split(
    store_dir,
    out_csv,
    protocol: str = "",
    *,
    options: Mapping | FoldersOptions,
    permutation: str = "default",
    seed: int | None = None,
    log: Callable[[str], object] = print,
) -> pd.DataFrame:
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
        tables.append(
            pd.DataFrame(
                {
                    "client": site,
                    "split": names,
                    "row": rows,
                    "id": meta["id"].to_numpy()[rows],
                    "group": meta["group"].to_numpy()[rows],
                }
            )
        )
        counts = "/".join(str(int((names == s).sum())) for s in SPLITS)
        source = Path(options.split_csv).name if options.split_csv else f"{permutation} seed {seed}"
        log(f"folders {site}: train/val/test = {counts} images, {meta['group'].nunique()} groups ({source})")
        user = Path(options.split_csv).name if options.split_csv else None
        for note in class_notes(meta, rows, names, options, user):
            log(f"folders {site}: warning: {note}")
    table = pd.concat(tables, ignore_index=True)
    write_split_csv(table, out_csv)
    return table
