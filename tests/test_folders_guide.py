"""The own-data guide's two worked examples (docs/data.md, "Your own data") run on the real files of
../shared/realdata: the layout scripts, YAML and commands are read out of the Markdown (the blocks
marked `<!-- tested: NAME -->`), so the guide and this test cannot drift. Skipped where ../shared is absent."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedmedbench import config as cfgmod
from fedmedbench.cli import main
from fedmedbench.data.store import SPLITS, open_client, read_split_csv
from tests.conftest import realdata_dir

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "data.md"
REALDATA = realdata_dir()
realdata = pytest.mark.skipif(not REALDATA.exists(), reason="../shared/realdata not beside the checkout")


def guide_block(name: str) -> str:
    """The code block that follows `<!-- tested: name -->` in the guide."""
    found = re.search(rf"<!-- tested: {re.escape(name)} -->\n```\w+\n(.*?)\n```", GUIDE.read_text(), re.DOTALL)
    assert found, f"docs/data.md has no block marked 'tested: {name}'"
    return found.group(1)


def test_the_guide_blocks_exist_and_its_options_table_lists_every_option():
    from dataclasses import fields

    from fedmedbench.data.folders import FoldersOptions

    for name in (
        "tnbc-layout",
        "tnbc-config",
        "tnbc-commands",
        "prostate-layout",
        "prostate-config",
        "prostate-commands",
    ):
        assert guide_block(name)
    table = GUIDE.read_text().split("### Options", 1)[1].split("###", 1)[0]
    listed = re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)
    assert sorted(listed) == sorted(f.name for f in fields(FoldersOptions))


def _config(name: str, tmp_path: Path, root: Path) -> tuple[Path, dict]:
    """The guide's YAML with its placeholder root pointing at the layout in tmp_path, written there."""
    text = guide_block(name)
    placeholder = re.search(r"root: (/path/to/\S+)", text).group(1)
    config = yaml.safe_load(text.replace(placeholder, str(root)))
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


def _run_commands(name: str, config_path: Path, config: dict, tmp_path: Path, capsys) -> tuple[int, list[str], Path]:
    """The guide's two commands: check-data as printed (in process), and the split target of the
    snakemake line built by the steps its rules run (`fedmedbench preprocess` and `split`, in process)."""
    check, build = guide_block(name).splitlines()
    args = shlex.split(check)
    assert args[:4] == ["python", "-m", "fedmedbench", "check-data"]
    args = [str(config_path) if a.endswith(".yaml") else a for a in args[3:]]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    lines = capsys.readouterr().out.splitlines()
    dataset = next(iter(config["data"]))
    # The snakemake target: the split of the data section's one protocol under results/<run_name>/.
    target = shlex.split(build)[3]
    assert target == f"results/{config['run_name']}/data/{dataset}/{cfgmod.USER_PROTOCOL}/split.csv", build
    options = json.dumps(cfgmod.folders_options(config, dataset))
    store, split = tmp_path / "store", tmp_path / "split.csv"
    assert main(["preprocess", "folders", "--protocol", "default", "--out", str(store), "--options", options]) in (
        0,
        None,
    )
    assert main(
        ["split", "folders", "--protocol", "default", "--store", str(store), "--out", str(split), "--options", options]
    ) in (0, None)
    return exit_.value.code, lines, store


TNBC_TILES = dict(zip([f"{p:02d}" for p in range(1, 12)], (7, 3, 5, 8, 4, 3, 3, 4, 6, 4, 3)))  # PROVENANCE-2.md
TNBC_SITES = {"siteA": ("01", "02", "03", "04"), "siteB": ("05", "06", "07", "08"), "siteC": ("09", "10", "11")}


@pytest.mark.shared
@realdata
def test_the_tnbc_example_keeps_every_patient_in_one_split(tmp_path, capsys):
    tnbc = REALDATA / "tnbc" / "dataset" / "TNBC"
    script = guide_block("tnbc-layout")
    script = script.replace(re.search(r"TNBC=(\S+)", script).group(1), shlex.quote(str(tnbc)))
    subprocess.run(["bash", "-euc", script], cwd=tmp_path, check=True, timeout=60)
    root = tmp_path / "tnbc-sites"
    assert sorted(p.name for p in root.iterdir()) == list(TNBC_SITES)
    config_path, config = _config("tnbc-config", tmp_path, root)
    status, lines, store = _run_commands("tnbc-commands", config_path, config, tmp_path, capsys)
    assert status == 0, lines
    assert lines[-1] == "data.tnbc: no problem found"
    # 4, 4, 3 patients of 7+3+5+8 = 23, 4+3+3+4 = 14, 6+4+3 = 13 tiles
    for site, n, groups in (("siteA", 23, 4), ("siteB", 14, 4), ("siteC", 13, 3)):
        assert any(line.startswith(f"  {site}: {n} images, {groups} groups; ") for line in lines), lines
    assert (
        sum(line.startswith("    groups (group_pattern '^images/(\\d+)_'; images per group): ") for line in lines) == 3
    )
    split = read_split_csv(tmp_path / "split.csv")
    assert len(split) == 50
    for site, patients in TNBC_SITES.items():
        rows = split[split["client"] == site]
        per_patient = rows.groupby("group")["split"].agg(["nunique", "size"])
        assert list(per_patient.index) == [f"{site}/{p}" for p in patients]
        assert (per_patient["nunique"] == 1).all()  # every patient in exactly one split
        assert per_patient["size"].to_dict() == {f"{site}/{p}": TNBC_TILES[p] for p in patients}
        # val and test get max(1, round(0.2 x 4 or 3)) = 1 patient each, train the rest
        assert rows.groupby("split")["group"].nunique().reindex(SPLITS).tolist() == [len(patients) - 2, 1, 1]
        images = open_client(store, site).images
        assert images.shape == (sum(TNBC_TILES[p] for p in patients), 256, 256, 3)
    # the tile's patient is the prefix of its file name, as the store's source keeps it
    meta = pd.concat([open_client(store, s).meta for s in TNBC_SITES])
    assert (meta["group"].str.split("/").str[1] == meta["source"].str.extract(r"images/(\d+)_")[0]).all()


def _without_group_pattern(config: dict) -> dict:
    section = dict(next(iter(config["data"].values())))
    section.pop("group_pattern")
    return {k: v for k, v in section.items() if k != "family"}


@pytest.mark.shared
@realdata
def test_without_group_pattern_tnbc_warns_and_cuts_patients(tmp_path):
    """The issue the option solves, on the real release: by tile, patients straddle the splits."""
    from fedmedbench.data import folders as F
    from fedmedbench.data.folders.inspect import inspect_folders
    from fedmedbench.data.folders.splits import _seeded_split

    tnbc, root = REALDATA / "tnbc" / "dataset" / "TNBC", tmp_path / "tnbc"
    for p in TNBC_TILES:
        for image in sorted((tnbc / f"Slide_{p}").glob("*.png")):
            for folder, source in (("images", image), ("masks", tnbc / f"GT_{p}" / image.name)):
                (root / "all" / folder).mkdir(parents=True, exist_ok=True)
                (root / "all" / folder / image.name).symlink_to(source)
    _, config = _config("tnbc-config", tmp_path, root)
    options = _without_group_pattern(config)
    report = inspect_folders(options)
    assert report.warnings == [
        "site all: every image is its own group, but the file names share prefixes (all: 50 images, 11 prefixes before "
        "the last '_', e.g. 01_1 and 01_2 share '01'); if a prefix names a patient, set group_pattern: '([^/]+)_[^_/]*$' "
        "so that each patient's images stay in one split"
    ]
    # folders' own seeded cut of the groups check-data found (one per tile): patients straddle the splits
    tiles = sorted(p.name for p in (root / "all" / "images").iterdir())
    meta = pd.DataFrame({"group": [f"all/{t}" for t in tiles]})
    rows, names = _seeded_split("all", meta, F.FoldersOptions.from_dict(options), "seeded", 0)
    patients = (
        pd.DataFrame({"patient": [tiles[r][:2] for r in rows], "split": names}).groupby("patient")["split"].nunique()
    )
    assert len(patients) == 11 and (patients > 1).sum() >= 5, (
        patients
    )  # most patients have tiles in two or three splits
    suggested = re.search(r"group_pattern: '([^']+)'", report.warnings[0]).group(1)
    assert (
        inspect_folders({**options, "group_pattern": suggested}).site("all").groups == 11
    )  # the suggestion finds the patients


PROSTATE_SITES = {  # protocol -> cases (PROVENANCE-3.md and the headers: grid, in-plane spacing)
    "grid320_0.600mm": ("Case00", "Case08", "Case12", "Case26"),
    "grid320_0.625mm": ("Case02", "Case03", "Case04", "Case15", "Case16", "Case27"),
    "grid384_0.500mm": ("Case29", "Case33", "Case35", "Case38"),
}
PROSTATE_SLICES = {
    "grid320_0.600mm": 15 + 17 + 15 + 15,
    "grid320_0.625mm": 24 + 20 * 5,
    "grid384_0.500mm": 19 + 19 + 21 + 19,
}


@pytest.mark.shared
@realdata
def test_the_prostate_example_makes_sites_by_protocol_with_one_gland_class(tmp_path, capsys):
    import SimpleITK as sitk

    release = REALDATA / "prostate_nci_isbi2013" / "data" / "Prostate"
    (tmp_path / "prostate_sites.py").write_text(guide_block("prostate-layout"))
    subprocess.run(
        [sys.executable, "prostate_sites.py", str(release), "prostate-sites"], cwd=tmp_path, check=True, timeout=120
    )
    root = tmp_path / "prostate-sites"
    for site, cases in PROSTATE_SITES.items():
        assert sorted(p.name for p in (root / site / "images").iterdir()) == [f"{c}.nii.gz" for c in cases]
        assert sorted(p.name for p in (root / site / "masks").iterdir()) == [f"{c}_Segmentation.nii.gz" for c in cases]
    config_path, config = _config("prostate-config", tmp_path, root)
    status, lines, store = _run_commands("prostate-commands", config_path, config, tmp_path, capsys)
    assert status == 0 and lines[-1] == "data.prostate_protocols: no problem found", lines
    assert "    mask values: 0 -> 0 background, 1 -> 1 gland, 2 -> 1 gland" in lines
    split = read_split_csv(tmp_path / "split.csv")
    for site, cases in PROSTATE_SITES.items():
        rows = split[split["client"] == site]
        assert len(rows) == PROSTATE_SLICES[site]
        assert (rows.groupby("group")["split"].nunique() == 1).all()  # every case (patient) in one split
        assert sorted(rows["group"].unique()) == [f"{site}/{c}" for c in cases]
        assert rows.groupby("split")["group"].nunique().reindex(SPLITS).tolist() == [len(cases) - 2, 1, 1]
        # the gland: zones 1 and 2 of the release's masks, together class 1 (the oracle: SimpleITK on the masks)
        labels = open_client(store, site).labels
        assert labels.shape == (PROSTATE_SLICES[site], 256, 256) and set(np.unique(labels)) == {0, 1}
        zones = {
            case: sitk.GetArrayFromImage(sitk.ReadImage(str(release / "masks" / f"{case}_Segmentation.nii.gz")))
            for case in cases
        }
        assert all(set(np.unique(z)) == {0, 1, 2} for z in zones.values())
        meta = open_client(store, site).meta
        for case, zone in zones.items():
            slices = labels[(meta["group"] == f"{site}/{case}").to_numpy()]
            gland = (zone > 0).reshape(len(zone), -1).any(1)  # slices with gland in the 320 or 384 grid
            assert (slices.reshape(len(slices), -1).any(1) == gland).all(), case
            # resized 320 or 384 -> 256 (nearest): the gland's share of the slice stays within 2 %
            share_store, share_raw = slices.mean(), (zone > 0).mean()
            assert share_store > 0 and abs(share_store - share_raw) < 0.02 * share_raw + 1e-4, (
                case,
                share_store,
                share_raw,
            )
