"""`fedmedbench check-data` (fedmedbench.data.folders.inspect): what the pipeline will understand of a user's
own data, before anything trains. Numbers on folders' example data (counts, splits, class pixel
shares computed by hand from what write_example drew), one line per problem on bad data (exit 1, no
traceback), the same summary at the head of the preprocessing log, and the real samples of
../shared/realdata arranged as `folders` layouts with symlinks (skipped where ../shared is absent)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from fedmedbench.cli import main
from fedmedbench.config import model_size_problem
from fedmedbench.data import folders as F
from fedmedbench.data.folders.inspect import inspect_folders
from fedmedbench.data.store import SPLITS
from tests.conftest import SHARED_ENV, realdata_dir, shared_dir

ROOT = Path(__file__).resolve().parents[1]
UNET = partial(model_size_problem, {"name": "unet"})  # what the CLI passes for a task's UNet
SITES = ["siteA", "siteB", "siteC"]
REALDATA = realdata_dir()
# Tests of the real samples are marked `shared` (.ci/run runs them again with ../shared hidden).
realdata = pytest.mark.skipif(not REALDATA.exists(), reason="../shared/realdata not beside the checkout")


def _splits(report, site) -> tuple[int, int, int]:
    return tuple(report.site(site).split[s] for s in SPLITS)


def _check_data(tmp_path, data: dict, *extra: str, capsys) -> tuple[int, list[str]]:
    """`check-data` in process on an overlay holding ``data``: (exit status, printed lines)."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"data": data}))
    with pytest.raises(SystemExit) as exit_:
        main(["check-data", "--config", str(overlay), *extra])
    return exit_.value.code, capsys.readouterr().out.splitlines()


# --- the numbers of folders' example data --------------------------------------------------------


def test_segmentation_example_counts_splits_sizes_channels_and_class_shares(tmp_path):
    example = F.write_example(tmp_path / "data")
    report = inspect_folders(example["options"], "mine", size_problem=UNET)
    assert report.problems == [] and report.warnings == []
    # val and test get max(1, round(0.2 n)) of n = 6, 8, 10 images (each its own group), train the rest
    splits = {"siteA": (4, 1, 1), "siteB": (4, 2, 2), "siteC": (6, 2, 2)}
    for site, n in example["counts"].items():
        got = report.site(site)
        assert (got.files, got.samples, got.groups, _splits(report, site)) == (n, n, n, splits[site])
        assert got.sizes == {(32, 32): n}
        assert got.channels == {"grey" if site == "siteA" else "colour": n}  # write_example: the first site grey
        pixels = example["class_pixels"][site]
        assert got.class_pixels == pixels and got.mask_values == {0: pixels[0], 128: pixels[1], 255: pixels[2]}
        assert got.class_fractions == pytest.approx([p / (n * 32 * 32) for p in pixels])
    # siteA: 5033, 771 and 340 of 6 x 32 x 32 = 6144 pixels: 81.92 %, 12.55 %, 5.53 %
    assert example["class_pixels"]["siteA"] == [5033, 771, 340]
    lines = report.lines()
    assert lines[0].startswith(
        f"data.mine: segmentation data in {tmp_path / 'data'}: 3 site(s); classes 0 background, 1 ring, 2 core; "
        "mask_values {0: 0, 128: 1, 255: 2}; seeded fractions 0.6/0.2/0.2 (seed 0)"
    )
    assert lines[1:4] == [
        "  siteA: 6 images, 6 groups; train/val/test = 4/1/1 images; H x W 32x32 (6 images); grey (6 images)",
        "    mask values: 0 -> 0 background, 128 -> 1 ring, 255 -> 2 core",
        "    pixels per class: background 81.92%, ring 12.55%, core 5.53%",
    ]
    assert lines[-1] == "data.mine: no problem found"


def test_nifti_example_counts_slices_per_split_and_the_unet_size_rule(tmp_path):
    example = F.write_example(tmp_path / "data", image_format="nifti", counts=(3, 4, 5))
    report = inspect_folders(example["options"], size_problem=UNET)
    # 5 slices per volume; a volume is one group: 3, 4, 5 groups cut 1/1/1, 2/1/1, 3/1/1
    for site, volumes, split in (("siteA", 3, (5, 5, 5)), ("siteB", 4, (10, 5, 5)), ("siteC", 5, (15, 5, 5))):
        got = report.site(site)
        assert (got.files, got.volumes, got.samples, got.groups, _splits(report, site)) == (
            volumes,
            volumes,
            5 * volumes,
            volumes,
            split,
        )
        assert got.sizes == {(36, 32): 5 * volumes} and got.channels == {
            "grey": volumes
        }  # NIfTI (32, 36, 5): H = j, W = i
        assert got.class_pixels == example["class_pixels"][site]
        assert sorted(got.mask_values) == [0, 1, 2]
    # H = 36 is not a multiple of 16: the one problem
    assert report.problems == [
        "the images (image_size not set: their size as stored): 36x32 (H x W) is not a multiple of 16, "
        "which the UNet needs (it halves the resolution 4 times); nearest valid sizes: 32 or 48 for H 36"
    ]
    assert inspect_folders(example["options"]).problems == []  # no model constraint given
    assert inspect_folders({**example["options"], "image_size": 32}, size_problem=UNET).problems == []
    assert inspect_folders({**example["options"], "image_size": 40}, size_problem=UNET).problems == [
        "image_size: 40 is not a multiple of 16, which the UNet needs (it halves the resolution 4 times); nearest valid sizes: 32 or 48"
    ]


def test_classification_example_images_per_class_and_groups(tmp_path):
    example = F.write_example(tmp_path / "data", kind="classification")
    report = inspect_folders(example["options"], "cls")
    # 3 classes over 3, 4, 5 patients: no class has a patient for each split, each is named (3 per site)
    assert report.problems == [] and len(report.warnings) == 9
    assert all(" only, none in " in w and "fewer than the 3 splits" in w for w in report.warnings), report.warnings
    # two images per patient: 3, 4, 5 groups cut 1/1/1, 2/1/1, 3/1/1 groups = 2/2/2, 4/2/2, 6/2/2 images
    for site, n, split in (("siteA", 6, (2, 2, 2)), ("siteB", 8, (4, 2, 2)), ("siteC", 10, (6, 2, 2))):
        got = report.site(site)
        assert (got.files, got.groups, _splits(report, site)) == (n, n // 2, split)
        assert got.class_images == example["class_counts"][site]
        assert got.class_fractions == pytest.approx([c / n for c in example["class_counts"][site]])
    assert report.lines()[1:3] == [
        "  siteA: 6 images, 3 groups; train/val/test = 2/2/2 images; H x W 32x32 (6 images); colour (6 images)",
        "    images per class: benign 2, malignant 2, normal 2",
    ]


@pytest.mark.parametrize("kind", ["segmentation", "nifti", "classification"])
@pytest.mark.parametrize("seed", [0, 3])
def test_the_split_shown_is_the_split_the_pipeline_makes(tmp_path, kind, seed):
    kwargs = {
        "nifti": {"image_format": "nifti", "counts": (3, 4, 5)},
        "classification": {"kind": "classification"},
    }.get(kind, {})
    options = {**F.write_example(tmp_path / "data", **kwargs)["options"], "seed": seed}
    store = tmp_path / "store"
    F.preprocess({}, store, "", options=options, log=lambda _: None)
    table = F.split(store, tmp_path / "split.csv", "", options=options, log=lambda _: None)
    report = inspect_folders(options)
    for site in SITES:
        counts = table[table["client"] == site]["split"].value_counts()
        assert report.site(site).split == {s: int(counts.get(s, 0)) for s in SPLITS}


def test_a_user_split_csv_is_counted_and_a_cut_patient_is_a_warning(tmp_path):
    example = F.write_example(tmp_path / "data", kind="classification")
    parts = ("train", "val", "test", "train", "train", "train")  # images 1 and 2 of patient00 in val and test
    rows = [
        {"site": site, "image": path, "split": parts[k % 6]}
        for site in SITES
        for k, path in enumerate(example["files"][site])
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "cut.csv", index=False)
    report = inspect_folders({**example["options"], "split_csv": str(tmp_path / "cut.csv")})
    # images k = 0 .. n-1 go to parts[k % 6]: n = 6, 8, 10 give 4/1/1, 5/2/1, 6/2/2
    assert [_splits(report, s) for s in SITES] == [(4, 1, 1), (5, 2, 1), (6, 2, 2)]
    assert report.problems == []
    assert (
        report.warnings[0]
        == "site siteA: 2 group(s) of cut.csv are in more than one split (e.g. siteA/patient00); kept as given"
    )
    assert f"split_csv {tmp_path / 'cut.csv'}" in report.lines()[0]


# --- bad data: one line per problem ----------------------------------------------------------------


def _bad_segmentation_data(tmp_path) -> dict:
    """Four sites, four problems: siteA an image (and mask) of another size, siteB a grey image among
    colour ones, siteC a mask value outside mask_values, siteD two images for three splits."""
    example = F.write_example(tmp_path / "data", sites=("siteA", "siteB", "siteC", "siteD"), counts=(6, 8, 10, 2))
    root = Path(example["options"]["root"])
    Image.fromarray(np.full((40, 40), 90, np.uint8)).save(root / "siteA/images/siteA_001.png")
    Image.fromarray(np.zeros((40, 40), np.uint8)).save(root / "siteA/masks/siteA_001.png")
    Image.open(root / "siteB/images/siteB_003.png").convert("L").save(root / "siteB/images/siteB_003.png")
    mask = np.asarray(Image.open(root / "siteC/masks/siteC_002.png")).copy()
    mask[0, :5] = 77  # an anti-aliased edge
    Image.fromarray(mask).save(root / "siteC/masks/siteC_002.png")
    return example["options"]


def test_bad_data_gives_one_line_per_problem(tmp_path):
    options = _bad_segmentation_data(tmp_path)
    root = Path(options["root"])
    report = inspect_folders(options, "mine", size_problem=UNET)
    expected = [
        f"site siteB: mixed channels: 1 grey and 7 colour images (e.g. {root}/siteB/images/siteB_003.png is grey, "
        f"{root}/siteB/images/siteB_000.png is colour); preprocessing needs one kind per site",
        f"{root}/siteC/masks/siteC_002.png: mask value(s) 77 not in mask_values {{0: 0, 128: 1, 255: 2}} (map every pixel value "
        "of the masks to a class index, e.g. {0: 0, 255: 1})",
        "site siteD: 2 group(s) (2 images) are too few for fractions 0.6/0.2/0.2: train/val/test would get 0/1/1 groups, "
        "each needs at least one (need 3 groups)",
        "2 image sizes (H x W) across the sites (32x32 (25), 40x40 (1)) and no image_size: preprocessing needs one size; "
        "set image_size to resize every image to one square size",
    ]
    assert report.problems == expected
    assert report.site("siteC").mask_values[77] == 5  # still counted and shown
    assert (
        "    mask values: 0 -> 0 background, 77 -> (not in mask_values), 128 -> 1 ring, 255 -> 2 core" in report.lines()
    )
    # the other numbers are still there: siteA's six images, with their two sizes
    assert report.site("siteA").sizes == {(32, 32): 5, (40, 40): 1} and report.site("siteD").split is None


def test_check_data_exits_1_with_one_line_per_problem_and_no_traceback(tmp_path):
    options = _bad_segmentation_data(tmp_path)
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"data": {"mine": {"family": "folders", **options}}}))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedmedbench",
            "check-data",
            "--config",
            "config/config.yaml",
            str(overlay),
            "--dataset",
            "mine",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stdout.splitlines()
    assert len([line for line in lines if line.startswith("  problem: ")]) == 4
    assert lines[-1] == "data.mine: 4 problem(s), 0 warning(s)"


def test_a_class_without_pixels_is_a_problem_and_a_site_without_one_a_warning(tmp_path, capsys):
    example = F.write_example(tmp_path / "data", n_classes=2)  # masks 0 / 255
    root = Path(example["options"]["root"])
    for mask in (root / "siteB/masks").iterdir():  # siteB: background only
        Image.fromarray(np.zeros((32, 32), np.uint8)).save(mask)
    section = {
        "family": "folders",
        "root": str(root),
        "mask_values": {0: 0, 255: 1, 128: 2},
        "classes": ["bg", "lesion", "other"],
    }
    status, lines = _check_data(tmp_path, {"mine": section}, capsys=capsys)
    assert status == 1
    assert [line for line in lines if "problem:" in line] == [
        "  problem: class 2 'other' has no pixel in any site (mask_values {0: 0, 128: 2, 255: 1} map no value found to it)"
    ]
    assert [line for line in lines if "warning:" in line] == [
        "  warning: site siteB: no foreground pixel (class >= 1) in the test split: its foreground Dice is undefined",
        "  warning: site siteB: no pixel of class 1 'lesion'",
    ]
    # warnings alone do not fail
    status, lines = _check_data(
        tmp_path, {"mine": {**section, "mask_values": {0: 0, 255: 1}, "classes": ["bg", "lesion"]}}, capsys=capsys
    )
    assert status == 0 and lines[-1] == "data.mine: 0 problem(s), 2 warning(s)"


def test_an_unlisted_image_a_missing_mask_and_bad_options_are_named(tmp_path, capsys):
    example = F.write_example(tmp_path / "cls", kind="classification")
    root = Path(example["options"]["root"])
    shutil.copy(root / "siteA/img_000.png", root / "siteA/extra.png")
    report = inspect_folders(example["options"])
    assert report.problems == [
        f"{root}: 1 image(s) under the data root are not in labels.csv, e.g. siteA/extra.png; "
        "list them in labels.csv or move them out of the data root"
    ]
    assert report.site("siteB").files == 8  # the sites are still summarised
    seg = F.write_example(tmp_path / "seg")
    seg_root = Path(seg["options"]["root"])
    (seg_root / "siteB/masks/siteB_003.png").unlink()
    report = inspect_folders(seg["options"])
    assert report.problems == [
        f"{seg_root}/siteB/images/siteB_003.png: image without a mask (expected {seg_root}/siteB/masks/siteB_003.<ext>)"
    ]
    assert report.site("siteC").files == 10 and report.site("siteB").split is None
    status, lines = _check_data(
        tmp_path, {"mine": {"family": "folders", "root": str(seg_root), "mask_value": {0: 0}}}, capsys=capsys
    )
    assert status == 1 and len(lines) == 1
    assert lines[0].startswith("data.mine: problem: data.mine: unknown key 'mask_value' (did you mean 'mask_values'?)")


def test_check_data_on_a_config_points_built_in_families_to_their_counts(tmp_path, capsys):
    example = F.write_example(tmp_path / "data")
    counts = tmp_path / "results" / "x" / "data" / "prostate" / "harmofl" / "counts.json"
    counts.parent.mkdir(parents=True)
    counts.write_text(json.dumps({"BIDMC": 261, "HK": 157}))
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "results_dir": str(tmp_path / "results"),
                "run_name": "x",
                "data": {"mine": {"family": "folders", **example["options"]}},
            }
        )
    )
    with pytest.raises(SystemExit) as exit_:
        main(["check-data", "--config", str(ROOT / "config" / "config.yaml"), str(overlay)])
    lines = capsys.readouterr().out.splitlines()
    assert exit_.value.code == 0
    assert lines[0] == (
        f"data.prostate: built-in family prostate: its preprocessing checks the release's layout and counts of record; "
        f"built: {counts} (418 samples: BIDMC 261, HK 157)"
    )
    assert lines[2].startswith(
        "data.nuclei: built-in family nuclei: its preprocessing checks the release's layout and counts "
        f"of record; not built yet (counts will be in {tmp_path / 'results/x/data/nuclei/harmofl/counts.json'})"
    )
    assert lines[5].startswith("data.mine: segmentation data in ") and lines[-1] == "data.mine: no problem found"


def test_check_data_checks_the_size_against_each_task_model(tmp_path, capsys):
    seg = F.write_example(tmp_path / "seg", size=40)  # 40 is no multiple of 16
    cls = F.write_example(tmp_path / "cls", kind="classification")
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "seg": {"family": "folders", **seg["options"]},
                    "cls": {"family": "folders", **cls["options"], "image_size": 8},
                },
                "tasks": {
                    "segtask": {"dataset": "seg", "kind": "segmentation"},
                    "clstask": {"dataset": "cls", "kind": "classification"},
                },
            }
        )
    )
    with pytest.raises(SystemExit) as exit_:
        main(["check-data", "--config", str(overlay)])
    problems = [line for line in capsys.readouterr().out.splitlines() if "problem:" in line]
    assert exit_.value.code == 1 and problems == [  # data sections in the overlay's (sorted) order
        "  problem: image_size: " + model_size_problem({"name": "densenet"}, 8, 8, "clstask"),
        "  problem: the images (image_size not set: their size as stored): 40 is not a multiple of 16, which the UNet of task "
        "'segtask' needs (it halves the resolution 4 times); nearest valid sizes: 32 or 48",
    ]
    assert "8 is below" in problems[0] and "DenseNet of task 'clstask'" in problems[0]


def test_every_test_reads_shared_through_conftest():
    """One place builds the path to ../shared (tests/conftest.py, overridable for CI), and a module
    that uses it marks its tests `shared`, so that .ci/run re-runs exactly those without it."""
    for path in sorted((ROOT / "tests").glob("*.py")):
        if path.name in ("conftest.py", "test_check_data.py"):  # the helper, and the test of its default
            continue
        text = path.read_text()
        assert not re.search(r"""["']shared["']\s*/|/\s*["']shared["']|parents\[2\]""", text), (
            f"{path.name}: use tests.conftest.shared_dir()"
        )
        if re.search(r"\b(realdata_dir|shared_dir)\(", text):
            assert "@pytest.mark.shared" in text, f"{path.name} reads ../shared but marks no test `shared`"


def test_unknown_dataset_is_one_line(tmp_path, capsys):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"data": {"mine": {"family": "folders", "root": str(tmp_path)}}}))
    assert main(["check-data", "--config", str(overlay), "--dataset", "mien"]) == 1
    assert "--dataset: 'mien' is not a section of data (did you mean 'mine'?); have: mine" in capsys.readouterr().err


def test_the_preprocessing_log_starts_with_the_summary(tmp_path):
    example = F.write_example(tmp_path / "data", n_classes=2)
    logged = []
    F.preprocess({}, tmp_path / "store", "", options=example["options"], log=logged.append)
    head = inspect_folders(example["options"]).lines()
    assert logged[: len(head)] == head and len(head) == 20  # head + 3 x (3 site lines + 3 split lines) + verdict
    assert logged[len(head)].startswith("folders siteA: 6 images")


def test_the_shared_folder_follows_its_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(SHARED_ENV, str(tmp_path / "nowhere"))
    assert shared_dir() == tmp_path / "nowhere" and realdata_dir() == tmp_path / "nowhere" / "realdata"
    monkeypatch.delenv(SHARED_ENV)
    assert shared_dir() == ROOT.parent / "shared"


# --- the real samples (../shared/realdata), as `folders` layouts of symlinks ------------------------


def _provenance_mask_values() -> dict[str, dict[int, int]]:
    """Pixels per mask value of each real mask, as PROVENANCE*.md records them (read there with
    Pillow + numpy by whoever staged the files): an oracle independent of our readers."""
    values = {}
    for md in sorted(REALDATA.glob("PROVENANCE*.md")):
        for line in md.read_text().splitlines():
            found = re.match(r"\| `([^`]+)` \|.*?(?:unique values \{([^}]*)\}|; values ((?:\d+:\d+,?)+))", line)
            if found:
                values[found.group(1)] = {
                    int(k): int(v) for k, v in re.findall(r"(\d+):\s*(\d+)", found.group(2) or found.group(3))
                }
    return values


def _link(target: Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


TNBC_TILES = (7, 3, 5, 8, 4, 3, 3, 4, 6, 4, 3)  # tiles of patients 01 .. 11 (PROVENANCE-2.md)
TNBC_SITES = {"siteA": (1, 2, 3, 4), "siteB": (5, 6, 7, 8), "siteC": (9, 10, 11)}


def _tnbc_layout(tmp_path, sites=tuple(TNBC_SITES)) -> tuple[dict, dict[str, list[str]]]:
    """TNBC's 50 tiles as three sites of patients, images/ and masks/ of symlinks, and a split CSV by
    patient: per site the last patient tests, the one before validates, the others train."""
    tnbc, root = REALDATA / "tnbc" / "dataset" / "TNBC", tmp_path / "tnbc"
    rows, masks = [], {}
    for site in sites:
        patients = TNBC_SITES[site]
        masks[site] = []
        for p in patients:
            split = "test" if p == patients[-1] else "val" if p == patients[-2] else "train"
            for image in sorted((tnbc / f"Slide_{p:02d}").glob("*.png")):
                _link(image, root / site / "images" / image.name)
                _link(tnbc / f"GT_{p:02d}" / image.name, root / site / "masks" / image.name)
                rows.append({"site": site, "image": f"images/{image.name}", "split": split})
                masks[site].append(f"tnbc/dataset/TNBC/GT_{p:02d}/{image.name}")
    pd.DataFrame(rows).to_csv(tmp_path / "tnbc_split.csv", index=False)
    options = {
        "root": str(root),
        "mask_values": {0: 0, 255: 1},
        "classes": ["background", "nucleus"],
        "split_csv": str(tmp_path / "tnbc_split.csv"),
    }
    return options, masks


@pytest.mark.shared
@realdata
def test_real_tnbc_complete_release_as_three_sites_of_patients(tmp_path):
    options, masks = _tnbc_layout(tmp_path)
    report = inspect_folders(options, "tnbc", size_problem=UNET)
    assert report.problems == [] and report.warnings == [], report.lines()
    tiles = dict(zip(range(1, 12), TNBC_TILES))
    oracle = _provenance_mask_values()
    for site, patients in TNBC_SITES.items():
        got, n = report.site(site), sum(tiles[p] for p in patients)
        train = sum(tiles[p] for p in patients[:-2])
        assert (got.files, got.groups, _splits(report, site)) == (
            n,
            n,
            (train, tiles[patients[-2]], tiles[patients[-1]]),
        )
        assert got.sizes == {(512, 512): n} and got.channels == {"colour": n}  # 47 RGBA and 3 RGB tiles: all colour
        expected = Counter()
        for key in masks[site]:
            expected.update(oracle[key])
        assert got.mask_values == dict(expected) and set(got.mask_values) == {0, 255}
        assert got.class_pixels == [expected[0], expected[255]] and sum(got.class_fractions) == pytest.approx(1)
    assert [report.site(s).files for s in TNBC_SITES] == [23, 14, 13]  # 7+3+5+8, 4+3+3+4, 6+4+3
    # Its time (about 1 s on an idle 2-core machine: headers only for the images) is benchmarks/
    # bench_check_data.py's: a test asserts no wall-clock time (it would fail on a loaded machine).


@pytest.mark.shared
@realdata
def test_real_tnbc_layout_of_symlinks_preprocesses_with_the_summary_first(tmp_path):
    options, _ = _tnbc_layout(tmp_path, sites=("siteB", "siteC"))  # 27 tiles: fast enough
    options = {**options, "image_size": 64}
    logged = []
    counts = F.preprocess({}, tmp_path / "store", "", options=options, log=logged.append)
    assert counts == {"siteB": 14, "siteC": 13}
    head = inspect_folders(options).lines()
    assert logged[: len(head)] == head and head[-1] == "folders data: no problem found"
    table = F.split(tmp_path / "store", tmp_path / "split.csv", "", options=options, log=lambda _: None)
    # patients 05, 06 train (4 + 3 tiles), 07 validates (3), 08 tests (4)
    assert table.groupby("client")["split"].value_counts().loc["siteB"].to_dict() == {"train": 7, "test": 4, "val": 3}


RIF_CLASSES = ["background", "rim", "cup"]  # DoFE masks: 255 background, 128 rim (disc minus cup), 0 cup


@pytest.mark.shared
@realdata
def test_real_rif_fundus_domains_as_four_sites(tmp_path):
    fundus, root = REALDATA / "rif_fundus" / "data" / "Fundus", tmp_path / "rif"
    masks = {}
    for domain in sorted(d.name for d in fundus.glob("Domain*")):
        masks[domain] = []
        for mask in sorted(fundus.glob(f"{domain}/*/ROIs/mask/*.png")):  # the release's train and test pairs together
            _link(mask.parent.parent / "image" / mask.name, root / domain / "images" / mask.name)
            _link(mask, root / domain / "masks" / mask.name)
            masks[domain].append(mask.relative_to(REALDATA).as_posix())
    options = {"root": str(root), "mask_values": {0: 2, 128: 1, 255: 0}, "classes": RIF_CLASSES}
    report = inspect_folders(options, "rif", size_problem=UNET)
    assert report.problems == [] and report.warnings == [], report.lines()
    assert [s.site for s in report.sites] == ["Domain1", "Domain2", "Domain3", "Domain4"]
    oracle = _provenance_mask_values()
    for domain in masks:
        got = report.site(domain)
        # 3 train + 3 test pairs per domain; 6 images: val/test max(1, round(1.2)) = 1, train 4
        assert (got.files, got.groups, _splits(report, domain)) == (6, 6, (4, 1, 1))
        assert got.sizes == {(800, 800): 6} and got.channels == {"colour": 6}
        expected = Counter()
        for key in masks[domain]:
            expected.update(oracle[key])
        # PROVENANCE counts the 3 identical channels of the RGB masks: 3 x 800 x 800 per mask
        assert {v: 3 * n for v, n in got.mask_values.items()} == dict(expected) and set(got.mask_values) == {
            0,
            128,
            255,
        }
        assert got.class_pixels == [got.mask_values[255], got.mask_values[128], got.mask_values[0]]
        assert sum(got.class_pixels) == 6 * 800 * 800 and sum(got.class_fractions) == pytest.approx(1)
    assert "    mask values: 0 -> 2 cup, 128 -> 1 rim, 255 -> 0 background" in report.lines()


HAM_METADATA = "ham10000/flamby/datasets/fed_isic2019/HAM10000_metadata"


@pytest.mark.shared
@realdata
def test_real_ham10000_images_as_sites_of_their_source(tmp_path):
    images, root = REALDATA / "ham10000" / "HAM10000_images", tmp_path / "ham"
    present = sorted(p.stem for p in images.glob("*.jpg"))
    meta = pd.read_csv(REALDATA / HAM_METADATA)
    meta = meta[meta["image_id"].isin(present)].sort_values("image_id")
    assert len(meta) == len(present) == 124
    for image_id in meta["image_id"]:
        _link(images / f"{image_id}.jpg", root / "images" / f"{image_id}.jpg")
    # site = the HAM source (the metadata's `dataset`), group = the lesion: its images never span two splits
    pd.DataFrame(
        {
            "site": meta["dataset"],
            "image": "images/" + meta["image_id"] + ".jpg",
            "label": meta["dx"],
            "group": meta["lesion_id"],
        }
    ).to_csv(root / "labels.csv", index=False)
    classes = sorted(meta["dx"].unique())
    assert classes == ["akiec", "bcc", "bkl", "df", "mel", "nv", "vasc"]
    report = inspect_folders({"root": str(root), "kind": "classification", "classes": classes}, "ham")
    assert report.problems == [], report.lines()
    missing = []
    for site, rows in meta.groupby("dataset"):
        got, per_class = report.site(site), rows["dx"].value_counts()
        assert (got.files, got.groups, sum(got.split.values())) == (len(rows), rows["lesion_id"].nunique(), len(rows))
        assert got.class_images == [int(per_class.get(c, 0)) for c in classes]
        assert got.sizes == {(450, 600): len(rows)} and got.channels == {"colour": len(rows)}  # 600 x 450 JPEGs
        absent = [f"{k} {c!r}" for k, c in enumerate(classes) if c not in per_class]
        missing += (
            [f"site {site}: no image of class{'es' if len(absent) > 1 else ''} {', '.join(absent)}"] if absent else []
        )
    assert [s.site for s in report.sites] == ["rosendahl", "vidir_modern", "vidir_molemax", "vienna_dias"]
    assert [report.site(s).files for s in ("rosendahl", "vidir_modern", "vidir_molemax", "vienna_dias")] == [
        28,
        23,
        65,
        8,
    ]
    # label skew, a fact and not a problem: rosendahl lacks df, vasc; vidir_modern akiec; vidir_molemax
    # akiec, bcc, mel; vienna_dias has only nv
    assert (
        [w for w in report.warnings if "no image of class" in w]
        == missing
        == [
            "site rosendahl: no image of classes 3 'df', 6 'vasc'",
            "site vidir_modern: no image of class 0 'akiec'",
            "site vidir_molemax: no image of classes 0 'akiec', 1 'bcc', 4 'mel'",
            "site vienna_dias: no image of classes 0 'akiec', 1 'bcc', 2 'bkl', 3 'df', 4 'mel', 6 'vasc'",
        ]
    )


@pytest.mark.shared
@realdata
def test_real_isic_images_of_many_sizes(tmp_path):
    isic, root = REALDATA / "isic2017", tmp_path / "isic"
    records = [json.loads(p.read_text()) for p in sorted(isic.glob("ISIC_*.json"))]
    rows, sizes = [], {"isicA": Counter(), "isicB": Counter()}
    for k, record in enumerate(records):
        site = ("isicA", "isicB")[k % 2]
        _link(isic / f"{record['name']}.jpg", root / site / f"{record['name']}.jpg")
        rows.append(
            {"site": site, "image": f"{site}/{record['name']}.jpg", "label": record["meta"]["clinical"]["diagnosis"]}
        )
        acquisition = record["meta"]["acquisition"]
        sizes[site][(acquisition["pixelsY"], acquisition["pixelsX"])] += 1  # the archive's size: an independent oracle
    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)
    options = {"root": str(root), "kind": "classification", "classes": ["melanoma", "nevus"]}
    report = inspect_folders(options, "isic")
    for site in sizes:
        got = report.site(site)
        labels = Counter(r["label"] for r in rows if r["site"] == site)
        assert got.files == got.groups == 25 and got.class_images == [labels["melanoma"], labels["nevus"]]
        assert got.sizes == sizes[site] and got.channels == {"colour": 25}
    every = sizes["isicA"] + sizes["isicB"]
    assert len(every) == 6 and sum(every.values()) == 50
    assert len(report.problems) == 1 and report.problems[0].startswith(
        "6 image sizes (H x W) across the sites (1129x1504 (26), "
    )
    assert inspect_folders({**options, "image_size": 224}).problems == []  # resized: nothing in the way


@pytest.mark.shared
@realdata
def test_real_monuseg_test_set_with_masks_drawn_from_its_xml(tmp_path):
    """MoNuSeg's 14 test TIFFs (1000 x 1000 H&E) as two sites, their masks drawn from the XML outlines
    with the nuclei family's own rasteriser (folders reads mask images, not outlines): the native size
    is a problem for the UNet (1000 is no multiple of 16), image_size 256 is not."""
    from fedmedbench.data.nuclei.raw import xml_to_mask

    monuseg, root = REALDATA / "monuseg" / "datasets" / "MoNuSegTestData", tmp_path / "monuseg"
    tiffs = sorted(monuseg.glob("*.tif"))
    assert len(tiffs) == 14
    expected = {}
    for k, tiff in enumerate(tiffs):
        site = "siteA" if k < 7 else "siteB"
        _link(tiff, root / site / "images" / tiff.name)
        mask, _ = xml_to_mask(tiff.with_suffix(".xml"), (1000, 1000))
        (root / site / "masks").mkdir(parents=True, exist_ok=True)
        Image.fromarray((mask > 0).astype(np.uint8) * 255).save(root / site / "masks" / f"{tiff.stem}.png")
        counts = expected.setdefault(site, Counter())
        counts.update({0: int((mask == 0).sum()), 255: int((mask > 0).sum())})
    options = {"root": str(root), "mask_values": {0: 0, 255: 1}, "classes": ["background", "nucleus"]}
    report = inspect_folders(options, "monuseg", size_problem=UNET)
    for site in ("siteA", "siteB"):
        got = report.site(site)
        assert got.files == 7 and got.sizes == {(1000, 1000): 7} and got.channels == {"colour": 7}
        assert got.mask_values == dict(expected[site]) and got.class_pixels == [expected[site][0], expected[site][255]]
        assert 0.05 < got.class_fractions[1] < 0.5  # nuclei cover a visible share of each tile
    assert len(report.problems) == 1 and "1000 is not a multiple of 16" in report.problems[0], report.problems
    resized = inspect_folders({**options, "image_size": 256}, "monuseg", size_problem=UNET)
    assert resized.problems == [], resized.problems
    # Its time (headers only for the 14 TIFFs; the masks are read in full): benchmarks/bench_check_data.py.
