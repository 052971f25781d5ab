"""Patient groups of a user's own data (``group_pattern``, ``groups_csv``) and how a CSV names an
image (``split_csv``, ``groups_csv``): the split keeps every group whole, checked patient by patient
on TNBC-style tile names (``01_1.png`` .. ``11_3.png``, 7, 3, 5, 8, 4, 3, 3, 4, 6, 4, 3 tiles), with
counts worked out by hand; bad options and rows are one line naming the file and what to do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedmedbench.data import folders as F
from fedmedbench.data.folders.inspect import inspect_folders
from fedmedbench.data.store import SPLITS, open_client
from fedmedbench.errors import ConfigError, DataError

TILES = dict(zip([f"{p:02d}" for p in range(1, 12)], (7, 3, 5, 8, 4, 3, 3, 4, 6, 4, 3)))  # TNBC's patients
PATTERN = r"^images/(\d+)_"


def _tiles(root: Path, site: str, patients=TILES) -> list[str]:
    """TNBC-style tiles <patient>_<k>.png with 0/255 masks; the tile's grey level is its patient."""
    names = []
    for patient, n in patients.items():
        for k in range(1, n + 1):
            name = f"{patient}_{k}.png"
            for folder in ("images", "masks"):
                (root / site / folder).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((8, 8), 10 * int(patient), np.uint8)).save(root / site / "images" / name)
            mask = np.zeros((8, 8), np.uint8)
            mask[2:5, 2:5] = 255
            Image.fromarray(mask).save(root / site / "masks" / name)
            names.append(name)
    return names


def _options(root: Path, **more) -> dict:
    return {"root": str(root), "mask_values": {0: 0, 255: 1}, **more}


def _build(tmp_path: Path, options: dict, permutation: str = "default", seed: int | None = None) -> pd.DataFrame:
    F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)
    return F.split(
        tmp_path / "store",
        tmp_path / "split.csv",
        "",
        options=options,
        permutation=permutation,
        seed=seed,
        log=lambda _: None,
    )


def _patients(table: pd.DataFrame) -> pd.DataFrame:
    """Per patient (the tile name's prefix, read from the id): its splits and tiles."""
    patient = table["id"].str.extract(r"/(\d+)_\d+$")[0]
    return table.assign(patient=patient).groupby("patient")["split"].agg(["nunique", "first", "size"])


def test_group_pattern_keeps_each_patient_in_one_split_sorted_by_hand(tmp_path):
    _tiles(tmp_path / "data", "s")
    table = _build(tmp_path, _options(tmp_path / "data", group_pattern=PATTERN), permutation="sorted")
    per = _patients(table)
    assert (per["nunique"] == 1).all() and per["size"].to_dict() == TILES
    # 11 patients: val and test get round(0.2 x 11) = 2 each, train 7; sorted, the first 7 train
    assert per["first"].to_dict() == {
        **{p: "train" for p in ("01", "02", "03", "04", "05", "06", "07")},
        "08": "val",
        "09": "val",
        "10": "test",
        "11": "test",
    }
    # tiles: train 7+3+5+8+4+3+3 = 33, val 4+6 = 10, test 4+3 = 7
    assert table["split"].value_counts().reindex(SPLITS).tolist() == [33, 10, 7]
    assert sorted(table["group"].unique()) == [f"s/{p}" for p in TILES]
    # the store holds the groups, as check-data shows them
    assert sorted(open_client(tmp_path / "store", "s").meta["group"].unique()) == [f"s/{p}" for p in TILES]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_seeded_split_by_patient_and_without_it(tmp_path, seed):
    _tiles(tmp_path / "data", "s")
    table = _build(tmp_path, _options(tmp_path / "data", group_pattern=PATTERN, seed=seed))
    per = _patients(table)
    assert (per["nunique"] == 1).all()  # every patient's tiles in exactly one split
    assert per.groupby("first").size().reindex(SPLITS).tolist() == [7, 2, 2]  # patients per split
    for name in SPLITS:  # tiles per split: the tiles of the patients in it
        assert (table["split"] == name).sum() == per.loc[per["first"] == name, "size"].sum()
    report = inspect_folders(_options(tmp_path / "data", group_pattern=PATTERN, seed=seed))
    assert report.site("s").split == table["split"].value_counts().reindex(SPLITS).to_dict()
    # by tile (no pattern), patients are cut: the issue group_pattern solves
    by_tile = F.split(
        tmp_path / "store", tmp_path / "t.csv", "", options=_options(tmp_path / "data", seed=seed), log=lambda _: None
    )
    assert by_tile["group"].nunique() == 11  # the store was built with the pattern: its groups stay
    by_tile_store = tmp_path / "store_by_tile"
    F.preprocess({}, by_tile_store, "", options=_options(tmp_path / "data", seed=seed), log=lambda _: None)
    cut = _patients(
        F.split(
            by_tile_store, tmp_path / "t2.csv", "", options=_options(tmp_path / "data", seed=seed), log=lambda _: None
        )
    )
    assert (cut["nunique"] > 1).sum() >= 3, cut


def test_check_data_prints_the_groups_per_split(tmp_path):
    _tiles(tmp_path / "data", "a", {p: TILES[p] for p in ("01", "02", "03", "04")})
    _tiles(tmp_path / "data", "b", {p: TILES[p] for p in ("05", "06", "07")})
    report = inspect_folders(_options(tmp_path / "data", group_pattern=PATTERN))
    assert report.problems == [] and report.warnings == []
    lines = report.lines()
    # site a: 4 patients of 7+3+5+8 = 23 tiles, split 2/1/1 patients
    a = report.site("a")
    assert (a.files, a.groups, sum(a.split.values())) == (23, 4, 23)
    shown = [
        line for line in lines if line.startswith("    groups (group_pattern '^images/(\\d+)_'; images per group): ")
    ]
    assert len(shown) == 2
    text = shown[0].split("): ", 1)[1]
    placed = {}
    for part in text.split("; "):
        name, groups = part.split(" ", 1)
        for group in groups.split(", "):
            patient, n = group.split(" ")
            placed[patient] = (name, int(n.strip("()")))
    assert {p: n for p, (_, n) in placed.items()} == {"01": 7, "02": 3, "03": 5, "04": 8}
    assert sorted(s for s, _ in placed.values()) == ["test", "train", "train", "val"]
    assert a.split == {s: sum(n for name, n in placed.values() if name == s) for s in SPLITS}


def test_one_warning_line_when_every_image_is_its_own_group_but_names_share_prefixes(tmp_path):
    _tiles(tmp_path / "data", "a", {p: TILES[p] for p in ("01", "02", "03", "04")})
    _tiles(tmp_path / "data", "b", {p: TILES[p] for p in ("05", "06", "07")})
    report = inspect_folders(_options(tmp_path / "data"))
    # a: 23 tiles, 4 prefixes; b: 3+3+3... 4+3+3 = 10 tiles, 3 prefixes; one line for both sites
    assert report.warnings == [
        "sites a, b: every image is its own group, but the file names share prefixes (a: 23 images, 4 prefixes before the "
        "last '_', e.g. 01_1 and 01_2 share '01'); if a prefix names a patient, set group_pattern: '([^/]+)_[^_/]*$' so "
        "that each patient's images stay in one split"
    ]
    assert report.problems == []
    # names of one scheme (siteA_000, ...): one shared prefix is no sign of patients
    example = F.write_example(tmp_path / "example")
    assert inspect_folders(example["options"]).warnings == []
    # the suggested pattern finds the patients
    fixed = inspect_folders(_options(tmp_path / "data", group_pattern="([^/]+)_[^_/]*$"))
    assert (fixed.site("a").groups, fixed.site("b").groups, fixed.warnings) == (4, 3, [])


def test_an_image_the_pattern_does_not_match_is_one_line_naming_it(tmp_path):
    root = tmp_path / "data"
    _tiles(root, "s")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "s/images/scan.png")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "s/masks/scan.png")
    options = _options(root, group_pattern=PATTERN)
    message = (
        f"{root}/s/images/scan.png: group_pattern '^images/(\\d+)_' finds no group in 'images/scan.png' (the image's "
        "path under its site folder; the pattern is searched anywhere in it and its first (...) is the group); "
        "fix the pattern or the file name"
    )
    with pytest.raises(DataError) as err:
        F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)
    assert str(err.value) == message and not (tmp_path / "store").exists()
    report = inspect_folders(options)
    assert report.problems == [message] and report.site("s").split is None
    # an optional group that captures nothing is named too
    with pytest.raises(DataError, match=r"captures an empty group in 'images/scan.png'"):
        F.preprocess(
            {}, tmp_path / "store", "", options=_options(root, group_pattern=r"^images/(\d*)"), log=lambda _: None
        )


def _groups_csv(tmp_path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path = tmp_path / "groups.csv"
    pd.DataFrame(rows, columns=["site", "image", "group"]).to_csv(path, index=False)
    return path


def _every_form(names: list[str]) -> list[tuple[str, str, str]]:
    """One row per tile, its image named in each accepted form in turn; the group is P + patient."""
    forms = (
        lambda n: f"images/{n}",
        lambda n: f"s/images/{n}",
        lambda n: n,
        lambda n: n[:-4],
        lambda n: f"./images/{n}",
    )
    return [("s", forms[k % 5](n), f"P{n[:2]}") for k, n in enumerate(names)]


def test_groups_csv_accepts_every_image_form_and_keeps_groups_whole(tmp_path):
    names = _tiles(tmp_path / "data", "s")
    csv = _groups_csv(tmp_path, _every_form(names))
    table = _build(tmp_path, _options(tmp_path / "data", groups_csv=str(csv)), permutation="sorted")
    per = table.groupby("group")["split"].agg(["nunique", "size"])
    assert (per["nunique"] == 1).all() and per["size"].to_dict() == {f"s/P{p}": n for p, n in TILES.items()}
    assert table["split"].value_counts().reindex(SPLITS).tolist() == [33, 10, 7]  # as with the pattern: P01..P07 train


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda rows: rows[:-1],
            "groups.csv: 1 image(s) of site s have no group, e.g. images/11_3.png; every image needs a row",
        ),
        (
            lambda rows: rows + [("s", "images/99_1.png", "P99")],
            "groups.csv line 52: image images/99_1.png is not an image of site s in the data; the image column takes the path "
            "under the site folder, e.g. images/01_1.png (also accepted: the path from the data root, s/images/01_1.png, or the "
            "file name or stem where no other image of the site has it)",
        ),
        (
            lambda rows: [("s", rows[0][1], "")] + rows[1:],
            "groups.csv line 2: empty group for image images/01_1.png of site s",
        ),
        (
            lambda rows: rows + [rows[0]],
            "groups.csv line 52: image images/01_1.png of site s is listed twice (lines 2 and 52)",
        ),
        (lambda rows: [("t", *rows[0][1:])] + rows[1:], "groups.csv line 2: site 't' is not in the data"),
    ],
)
def test_a_bad_groups_csv_is_one_line(tmp_path, edit, message):
    names = _tiles(tmp_path / "data", "s")
    csv = _groups_csv(tmp_path, edit(_every_form(names)))
    options = _options(tmp_path / "data", groups_csv=str(csv))
    with pytest.raises(DataError) as err:
        F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)
    assert str(err.value).startswith(str(tmp_path / "groups.csv")) and message in str(err.value)
    assert "\n" not in str(err.value) and not (tmp_path / "store").exists()
    assert inspect_folders(options).problems == [str(err.value)]
    pd.DataFrame({"site": ["s"], "image": ["images/01_1.png"]}).to_csv(csv, index=False)
    with pytest.raises(DataError, match=r"groups.csv: missing column\(s\) \['group'\]; expected site, image, group"):
        F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)


def _classification(root: Path) -> None:
    """Two sites of patients in sub-folders: site a 3 patients x 2 images, b 3 x 1, one name shared."""
    rows = []
    for site, per in (("a", 2), ("b", 1)):
        for p in range(3):
            for k in range(per):
                path = root / site / f"patient{p}" / f"x{k}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.full((8, 8, 3), 40 * p, np.uint8)).save(path)
                rows.append({"site": site, "image": f"{site}/patient{p}/x{k}.png", "label": ("no", "yes")[p % 2]})
    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)


def test_classification_group_pattern_and_an_ambiguous_name(tmp_path):
    root = tmp_path / "data"
    _classification(root)
    options = {"root": str(root), "kind": "classification", "classes": ["no", "yes"], "group_pattern": "^(patient\\d)/"}
    table = _build(tmp_path, options)
    assert table.groupby("client")["group"].nunique().to_dict() == {"a": 3, "b": 3}
    assert (table.groupby("group")["split"].nunique() == 1).all()
    assert sorted(table[table["client"] == "a"]["group"].unique()) == ["a/patient0", "a/patient1", "a/patient2"]
    # a split CSV naming x0.png: site a has three (one per patient folder), site b one per patient too
    split = tmp_path / "split.csv"
    pd.DataFrame({"site": ["a"], "image": ["x0.png"], "split": ["train"]}).to_csv(split, index=False)
    with pytest.raises(DataError) as err:
        F.split(
            tmp_path / "store",
            tmp_path / "s2.csv",
            "",
            options={**options, "split_csv": str(split)},
            log=lambda _: None,
        )
    assert str(err.value) == (
        f"{split} line 2: image x0.png is ambiguous: 3 images of site a have this file name "
        "(patient0/x0.png and patient1/x0.png); write the path under the site folder, e.g. patient0/x0.png"
    )
    # a labels.csv group column and group_pattern: one way only
    labels = pd.read_csv(root / "labels.csv").assign(group="g")
    labels.to_csv(root / "labels.csv", index=False)
    with pytest.raises(
        DataError, match=r"labels.csv: has a group column and group_pattern is set; give the groups one way"
    ):
        F.preprocess({}, tmp_path / "store2", "", options=options, log=lambda _: None)


def test_split_csv_takes_file_names_and_stems_and_shows_an_example_of_the_site(tmp_path):
    names = _tiles(tmp_path / "data", "s", {p: TILES[p] for p in ("01", "02", "03", "04", "05")})  # 27 tiles
    options = _options(tmp_path / "data", group_pattern=PATTERN)
    F.preprocess({}, tmp_path / "store", "", options=options, log=lambda _: None)
    parts = {"01": "train", "02": "train", "03": "train", "04": "val", "05": "test"}
    forms = (lambda n: n, lambda n: n[:-4], lambda n: f"images/{n}")  # file name, stem, path under the site folder
    rows = [{"site": "s", "image": forms[k % 3](n), "split": parts[n[:2]]} for k, n in enumerate(names)]
    pd.DataFrame(rows).to_csv(tmp_path / "split.csv", index=False)
    with_csv = {**options, "split_csv": str(tmp_path / "split.csv")}
    table = F.split(tmp_path / "store", tmp_path / "out.csv", "", options=with_csv, log=lambda _: None)
    assert table["split"].value_counts().reindex(SPLITS).tolist() == [7 + 3 + 5, 8, 4]
    assert list(table["id"]) == [f"s/{n[:-4]}" for n in names]  # the CSV's order
    rows[3]["image"] = "01_9"
    pd.DataFrame(rows).to_csv(tmp_path / "split.csv", index=False)
    with pytest.raises(DataError) as err:
        F.split(tmp_path / "store", tmp_path / "out2.csv", "", options=with_csv, log=lambda _: None)
    assert str(err.value) == (
        f"{tmp_path / 'split.csv'} line 5: image 01_9 is not an image of site s in the data; the image "
        "column takes the path under the site folder, e.g. images/01_1.png (also accepted: the path "
        "from the data root, s/images/01_1.png, or the file name or stem where no other image of the "
        "site has it)"
    )


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"group_pattern": "^(\\d+"},
            "folders.group_pattern: '^(\\d+' is not a regular expression (missing ), unterminated subpattern",
        ),
        (
            {"group_pattern": "^\\d+_"},
            "folders.group_pattern: '^\\d+_' has no capture group; put the part that names the group",
        ),
        ({"group_pattern": 5}, "folders.group_pattern: expected a regular expression with one capture group"),
        (
            {"group_pattern": "(a)", "groups_csv": "g.csv"},
            "folders: group_pattern and groups_csv are both set; give the groups one way",
        ),
        ({"groups_csv": ""}, 'folders.groups_csv: expected a CSV file path, got ""'),
        ({"mask_suffix": "a/b"}, "folders.mask_suffix: expected the text a mask's name adds to its image's name"),
        (
            {"kind": "classification", "classes": ["a", "b"], "mask_suffix": "_m"},
            "folders.mask_suffix: only for kind segmentation",
        ),
    ],
)
def test_bad_group_options_are_one_config_error(options, message):
    with pytest.raises(ConfigError) as err:
        F.FoldersOptions.from_dict({"root": "d", **options})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_config_schema_accepts_the_group_options(tmp_path):
    from fedmedbench import config as cfgmod

    _tiles(tmp_path / "data", "s")
    base = cfgmod.load_config(Path(__file__).resolve().parents[1] / "config" / "config.yaml")
    config = cfgmod.deep_merge(base, {
        "data": {"mine": {"family": "folders", **_options(tmp_path / "data", group_pattern=PATTERN, mask_suffix="", image_size=16)}},
        "tasks": {"mine": {"dataset": "mine", "kind": "segmentation"}},
    })  # fmt: skip
    cfgmod.complete_user_data(config)
    cfgmod.validate(config)
    assert config["tasks"]["mine"]["clients"] == ["s"]
