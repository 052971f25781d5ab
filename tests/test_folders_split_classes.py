"""Splits that keep classes, patients and sites honest (family ``folders``): a classification site's
seeded split is stratified by class within groups, a class that cannot be in every split is named
with the reason, check-data prints each split's samples, groups and per-class counts, and the
subject identifiers a user left out of the groups (a labels.csv column, repeated file stems, a patient
in several sites of a groups_csv) are warned about. Counts are worked out by hand in the comments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedmedbench.data import folders as F
from fedmedbench.data.folders.inspect import inspect_folders
from fedmedbench.data.folders.splits import _seeded_split
from fedmedbench.data.store import SPLITS, open_client


def _png(path: Path, value: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(path)


def _classification(root: Path, rows: list[dict]) -> None:
    """Tiny PNGs for each row (site, image, label and any other column) and the labels.csv listing them."""
    for k, row in enumerate(rows):
        _png(root / row["image"], k % 250)
    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)


def _meta(sizes: dict[str, int], images_per_group: int = 1) -> pd.DataFrame:
    """A classification site's meta table: ``sizes[class]`` groups of that class."""
    rows = [
        {"group": f"s/{label}{g}", "label": label, "source": f"s/{label}{g}_{k}.png"}
        for label, n in sizes.items()
        for g in range(n)
        for k in range(images_per_group)
    ]
    return pd.DataFrame(rows)


def _classes_per_split(meta: pd.DataFrame, rows: np.ndarray, names: np.ndarray) -> dict[str, set[str]]:
    labels = meta["label"].to_numpy()[rows]
    return {s: set(labels[names == s]) for s in SPLITS}


HAM_LIKE = {"nv": 20, "bkl": 5, "akiec": 3, "df": 3}  # 31 lesions: the rare classes have 3 each


def test_every_class_with_a_group_per_split_is_in_every_split_for_every_seed():
    options = F.FoldersOptions.from_dict({"root": ".", "kind": "classification", "classes": list(HAM_LIKE)})
    meta = _meta(HAM_LIKE, images_per_group=2)
    results = []
    for seed in range(8):
        rows, names = _seeded_split("s", meta, options, "seeded", seed)
        assert sorted(rows) == list(range(len(meta)))
        groups = pd.DataFrame({"group": meta["group"].to_numpy()[rows], "split": names})
        assert (groups.groupby("group")["split"].nunique() == 1).all()  # a lesion in one split
        # 31 groups: val and test get round(0.2 x 31) = 6 each, train 19, as without classes
        assert groups.drop_duplicates("group")["split"].value_counts().reindex(SPLITS).tolist() == [19, 6, 6]
        assert _classes_per_split(meta, rows, names) == {s: set(HAM_LIKE) for s in SPLITS}, seed
        results.append((rows, names))
    again = _seeded_split("s", meta, options, "seeded", 3)
    assert np.array_equal(again[0], results[3][0]) and np.array_equal(again[1], results[3][1])  # same seed, same split
    assert len({tuple(names[np.argsort(rows)]) for rows, names in results}) > 1  # the seed matters


# 13 groups of one image: a 6, b 4, c 1, d 2. Val and test get round(0.2 x 13) = 3 each, train 7.
# One group of each class goes to train (a, b, d, c), then to test (a, b, d: test is full), then to
# val (a, b); the 4 left fill train's 3 places and val's 1 by each class's share: train a 3, b 2,
# c 1, d 1; val a 2, b 1; test a 1, b 1, d 1, whatever the seed (no two classes of one size).
FEW = {"a": 6, "b": 4, "c": 1, "d": 2}
FEW_SPLIT = {"train": {"a": 3, "b": 2, "c": 1, "d": 1}, "val": {"a": 2, "b": 1}, "test": {"a": 1, "b": 1, "d": 1}}
NOTES = [
    "class 2 'c' is in train only, none in val and test (its images are 1 group(s), fewer than the 3 splits)",
    "class 3 'd' is in train and test only, none in val (its images are 2 group(s), fewer than the 3 splits)",
]


def _few(root: Path) -> dict:
    _classification(
        root,
        [{"site": "s", "image": f"s/{label}{g}.png", "label": label} for label, n in FEW.items() for g in range(n)],
    )
    return {"root": str(root), "kind": "classification", "classes": list(FEW)}


@pytest.mark.parametrize("seed", [0, 1, 2, 5])
def test_a_rare_class_goes_to_train_first_and_the_split_log_says_why_it_is_not_everywhere(tmp_path, seed):
    options = {**_few(tmp_path / "data"), "seed": seed}
    F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)
    logged = []
    table = F.split(tmp_path / "store", tmp_path / "split.csv", "", options=options, log=logged.append)
    meta = open_client(tmp_path / "store", "s").meta
    labels = meta["label"].to_numpy()[table["row"].to_numpy()]
    got = {s: pd.Series(labels[table["split"].to_numpy() == s]).value_counts().to_dict() for s in SPLITS}
    assert got == FEW_SPLIT
    assert logged[1:] == [f"folders s: warning: {note}" for note in NOTES]
    report = inspect_folders(options)
    assert report.warnings == [f"site s: {note}" for note in NOTES]
    assert report.site("s").split == {"train": 7, "val": 3, "test": 3}


def test_check_data_prints_each_split_with_its_classes_and_marks_the_missing(tmp_path):
    report = inspect_folders(_few(tmp_path / "data"))
    lines = report.lines()
    start = lines.index("    images per class: a 6, b 4, c 1, d 2")
    assert lines[start + 1 : start + 4] == [
        "    train: 7 images, 7 groups; images per class: a 3, b 2, c 1, d 1",
        "    val: 3 images, 3 groups; images per class: a 2, b 1, c 0, d 0",  # val is not marked
        "    test: 3 images, 3 groups; images per class: a 1, b 1, c 0 (missing), d 1",
    ]


def test_check_data_counts_the_images_holding_each_segmentation_class_per_split(tmp_path):
    root = tmp_path / "data"
    (root / "s" / "masks").mkdir(parents=True)
    for k in range(5):  # 5 images, only the first one's mask has lesion pixels
        _png(root / "s" / "images" / f"i{k}.png", 40 * k)
        mask = np.zeros((8, 8), np.uint8)
        mask[:2, :2] = 255 if k == 0 else 0
        Image.fromarray(mask).save(root / "s" / "masks" / f"i{k}.png")
    options = {"root": str(root), "mask_values": {0: 0, 255: 1}, "classes": ["background", "lesion"]}
    for seed in range(4):
        lines = [
            line
            for line in inspect_folders({**options, "seed": seed}).lines()
            if line.startswith(("    train:", "    val:", "    test:"))
        ]
        # 5 groups: 3/1/1 images; every image holds background, one split holds the lesion image
        assert [line.split(";")[0] for line in lines] == [
            "    train: 3 images, 3 groups",
            "    val: 1 image, 1 group",
            "    test: 1 image, 1 group",
        ]
        lesion = [int(line.split("lesion ")[1].split()[0]) for line in lines]
        assert sum(lesion) == 1 and all(f"background {n}" in line for line, n in zip(lines, (3, 1, 1)))
        for line, n in zip(lines, lesion):  # a train or test split without the lesion is marked
            assert line.endswith("lesion 0 (missing)") == (n == 0 and not line.startswith("    val:")), line


def test_a_labels_csv_column_naming_the_lesion_is_warned_about_without_a_group(tmp_path):
    root = tmp_path / "data"
    rows = [
        {
            "site": "s",
            "image": f"s/ISIC_{k:02d}.png",
            "label": ("nv", "mel")[k % 2],
            "lesion_id": f"HAM_{k // 2:02d}",
            "age": str(30 + k),
        }
        for k in range(12)
    ]  # 12 photographs of 6 lesions, metadata columns kept
    _classification(root, rows)
    options = {"root": str(root), "kind": "classification", "classes": ["nv", "mel"]}
    report = inspect_folders(options)
    assert report.problems == []
    assert [w for w in report.warnings if "labels.csv column" in w] == [
        "every image is its own group, but labels.csv column 'lesion_id' looks like a subject identifier and 6 of its values "
        "are on several images (e.g. HAM_00 on 2 images); if it names the patient (or lesion), rename the column to group "
        "(or set groups_csv) so that each one's images stay in one split"
    ]
    assert F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None) == {"s": 12}
    # as the warning says: the column as group keeps each lesion in one split, and the warning goes
    pd.DataFrame(rows).rename(columns={"lesion_id": "group"}).to_csv(root / "labels.csv", index=False)
    report = inspect_folders(options)
    assert report.site("s").groups == 6 and not [w for w in report.warnings if "labels.csv column" in w]
    # a subject column whose every value is one image's says nothing
    pd.DataFrame([{**r, "lesion_id": f"L{k}"} for k, r in enumerate(rows)]).to_csv(root / "labels.csv", index=False)
    assert not [w for w in inspect_folders(options).warnings if "labels.csv column" in w]


def test_a_file_stem_repeated_in_two_folders_is_warned_about_and_the_pattern_given_groups_them(tmp_path):
    root = tmp_path / "data"
    rows = [
        {"site": "s", "image": f"s/day{day}/ISIC_{k}.png", "label": ("a", "b")[k % 2]}
        for day in (1, 2)
        for k in range(5)
    ]
    _classification(root, rows)
    options = {"root": str(root), "kind": "classification", "classes": ["a", "b"]}
    report = inspect_folders(options)
    assert report.warnings == [
        "site s: every image is its own group, but 5 file stem(s) name several images (e.g. ISIC_0: day1/ISIC_0.png and "
        "day2/ISIC_0.png); if a stem names a patient or lesion, set group_pattern: '([^/.]+)\\.[^/]*$' (the file name "
        "before its suffix) so that its images stay in one split"
    ]
    grouped = inspect_folders({**options, "group_pattern": r"([^/.]+)\.[^/]*$"})
    assert grouped.site("s").groups == 5 and not [w for w in grouped.warnings if "file stem" in w]


def test_a_patient_in_three_sites_of_a_groups_csv_is_named_with_the_sites(tmp_path):
    example = F.write_example(tmp_path / "data", n_classes=2)
    rows = [
        {"site": site, "image": f"images/{stem}.png", "group": "P1" if k == 0 else f"{site}-{k // 2}"}
        for site, stems in example["files"].items()
        for k, stem in enumerate(stems)
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "groups.csv", index=False)
    report = inspect_folders({**example["options"], "groups_csv": str(tmp_path / "groups.csv")})
    assert report.problems == []
    assert report.warnings == [
        "groups_csv groups.csv: 1 patient(s) (groups) are in more than one site: P1 in sites siteA, siteB, siteC; federated "
        "learning assumes sites do not share patients (a patient's images in two clients are seen in training by one and "
        "tested by the other): keep each patient's images in one site, or give distinct patients distinct group names"
    ]


def test_a_labels_csv_path_from_the_site_folder_is_refused_naming_both_paths(tmp_path):
    root = tmp_path / "data"
    _classification(root, [{"site": "s", "image": f"s/i{k}.png", "label": "ab"[k % 2]} for k in range(6)])
    pd.DataFrame([{"site": "s", "image": f"i{k}.png", "label": "ab"[k % 2]} for k in range(6)]).to_csv(
        root / "labels.csv", index=False
    )
    options = {"root": str(root), "kind": "classification", "classes": ["a", "b"]}
    message = (
        f"{root}/labels.csv line 2: image i0.png is not under the data root ({root}/i0.png does not exist) but under "
        f"site s's folder ({root}/s/i0.png); labels.csv takes paths from the data root: write s/i0.png"
    )
    assert inspect_folders(options).problems == [message]
    with pytest.raises(F.FoldersDataError) as error:
        F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)
    assert str(error.value) == message and not (tmp_path / "store").exists()
