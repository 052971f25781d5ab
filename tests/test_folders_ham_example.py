"""The own-data guide's classification example (docs/data.md, "Example: HAM10000 dermoscopy") run on
the real HAM10000 files of ../shared/realdata/ham10000 (124 JPEGs of 123 lesions from the four
sources, PROVENANCE.md): the script, YAML and commands are read out of the Markdown, as the TNBC and
prostate examples are, and (slow) the training command is run as printed, to the table. Skipped where
../shared is absent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fedmedbench.data.store import SPLITS, open_client, read_split_csv
from tests.conftest import realdata_dir
from tests.test_folders_guide import _config, _run_commands, guide_block

ROOT = Path(__file__).resolve().parents[1]
HAM = realdata_dir() / "ham10000"
DATAVERSE_METADATA = HAM / "flamby" / "datasets" / "fed_isic2019" / "HAM10000_metadata"  # with `dataset`
KAGGLE_METADATA = HAM / "HAM10000_metadata.csv"  # without it
realdata = pytest.mark.skipif(not HAM.exists(), reason="../shared/realdata/ham10000 not beside the checkout")


def test_the_guide_has_the_ham_blocks():
    assert "your HAM10000 download" in (Path(__file__).resolve().parents[1] / "docs" / "data.md").read_text()
    for name in ("ham-layout", "ham-config", "ham-commands", "ham-train"):
        assert guide_block(name)


def _layout(tmp_path: Path, metadata: Path) -> tuple[Path, str]:
    (tmp_path / "ham_sites.py").write_text(guide_block("ham-layout"))
    done = subprocess.run(
        [sys.executable, "ham_sites.py", str(metadata), str(HAM), "ham-sites"],
        cwd=tmp_path,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    return tmp_path / "ham-sites", done.stdout.strip()


@pytest.mark.shared
@realdata
def test_the_ham_example_keeps_lesions_whole_and_every_class_with_three_lesions_in_every_split(tmp_path, capsys):
    root, said = _layout(tmp_path, DATAVERSE_METADATA)
    assert said == "124 images of 123 lesions in 4 sites"
    meta = pd.read_csv(DATAVERSE_METADATA).set_index("image_id")
    config_path, config = _config("ham-config", tmp_path, root)
    status, lines, store = _run_commands("ham-commands", config_path, config, tmp_path, capsys)
    assert status == 0, lines  # warnings only: the rare classes
    assert lines[0].startswith(f"data.ham: classification data in {root}: 4 site(s); classes 0 akiec, 1 bcc, ")
    classes = config["data"]["ham"]["classes"]
    split = read_split_csv(tmp_path / "split.csv")
    assert len(split) == 124
    image_id = split["id"].str.extract(r"images/(ISIC_\d+)\.jpg")[0]
    split = split.assign(label=meta.loc[image_id, "dx"].to_numpy(), lesion=meta.loc[image_id, "lesion_id"].to_numpy())
    assert (split["group"] == split["client"] + "/" + split["lesion"]).all()  # the lesion is the group
    assert (split.groupby("group")["split"].nunique() == 1).all()  # each lesion in one split
    for site, n in (
        ("rosendahl", 28),
        ("vidir_modern", 23),
        ("vidir_molemax", 65),
        ("vienna_dias", 8),
    ):  # PROVENANCE.md
        rows = split[split["client"] == site]
        assert len(rows) == n and open_client(store, site).images.shape == (n, 32, 32, 3)
        assert any(line.startswith(f"  {site}: {n} images, {rows['group'].nunique()} groups; ") for line in lines), (
            lines
        )
        lesions = rows.drop_duplicates("group")["label"].value_counts()
        for label, count in lesions.items():
            present = set(rows.loc[rows["label"] == label, "split"])
            assert "train" in present, (site, label)  # every class of a source is trained on
            if count >= len(SPLITS):
                assert present == set(SPLITS), (site, label, count)
            else:  # named, with the reason
                note = f"site {site}: class {classes.index(label)} {label!r} is in "
                assert any(
                    line.startswith(f"  warning: {note}") and "fewer than the 3 splits" in line for line in lines
                ), (note, lines)
    # the case: rosendahl's two akiec lesions were both cut into test; now one trains
    akiec = split[(split["client"] == "rosendahl") & (split["label"] == "akiec")]
    assert sorted(akiec["split"]) == ["test", "train"]


@pytest.mark.shared
@realdata
def test_without_a_dataset_column_the_sites_are_the_body_sites(tmp_path):
    root, said = _layout(tmp_path, KAGGLE_METADATA)
    meta = pd.read_csv(KAGGLE_METADATA)
    meta = meta[meta["image_id"].isin([p.stem for p in (HAM / "HAM10000_images").glob("*.jpg")])]
    assert said == f"124 images of 123 lesions in {meta['localization'].nunique()} sites"
    labels = pd.read_csv(root / "labels.csv")
    assert list(labels.columns) == ["site", "image", "label", "group"]
    assert sorted(labels["site"].unique()) == sorted(meta["localization"].str.replace(" ", "_").unique())
    assert all((root / image).is_file() for image in labels["image"])  # paths from the data root


@pytest.mark.shared
@pytest.mark.slow
@realdata
def test_the_ham_example_trains_to_its_table_as_printed(tmp_path):
    """The guide's training command, as printed, in a copy of the workflow beside the guide's ham.yaml:
    FedAvg and FedProx trained on the four sources and the table written, with a row per method and a
    column per source."""
    root, _ = _layout(tmp_path, DATAVERSE_METADATA)
    repo = tmp_path / "repo"
    for name in ("config", "workflow", "src", "resources"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    config_path, config = _config("ham-config", repo, root)
    config_path.rename(repo / "ham.yaml")
    command = guide_block("ham-train")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-e", "-c", command], cwd=repo, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, (command, done.stderr[-3000:])
    table = (repo / "results" / "ham" / "tables" / "ham_table.md").read_text().splitlines()
    header = next(line for line in table if line.startswith("| Method"))
    assert [c.strip() for c in header.split("|")[1:-1]] == [
        "Method",
        "rosendahl",
        "vidir_modern",
        "vidir_molemax",
        "vienna_dias",
        "Avg",
    ]
    rows = [line.split("|")[1].strip() for line in table if line.startswith("| ") and line != header]
    assert rows == ["fedavg", "fedprox"]
    for run in rows:  # every round of the guide's config was trained
        history = pd.read_csv(repo / "results" / "ham" / "train" / "ham" / run / "seed0" / "history.csv")
        assert history["round"].max() == config["tasks"]["ham"]["rounds"], history
