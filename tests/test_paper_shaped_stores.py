"""benchmarks/paper_shaped_stores.py: stores of the papers' shapes and counts where the paper config
(with the overlay it writes) looks for its data, so that `estimate` can time the paper's jobs on a
GPU node without the real data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedmedbench import config as cfgmod

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "paper_shaped_stores.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_stores_have_the_papers_shapes_and_counts_where_the_config_looks(tmp_path):
    out = tmp_path / "paper-shaped"
    done = run("--out", str(out), "--tasks", "prostate", "skin", "--scale", "0.05")
    assert done.returncode == 0, done.stderr
    config = cfgmod.load_config(ROOT / "config" / "config.yaml", out / "overlay.yaml")

    prostate = cfgmod.resolve_run(config, "prostate", "fedavg", 0)
    store, split = Path(prostate["data"]["store"]), pd.read_csv(prostate["data"]["split"])
    assert store.is_relative_to(out)
    images = np.load(store / "HK" / "images.npy", mmap_mode="r")
    # HK: 157 annotated slices, 5 % -> 64/16/20 of (100, 25, 32) = (5, 1 -> at least 2, 2)
    assert images.shape == (5 + 2 + 2, 384, 384, 3) and images.dtype == np.uint8
    assert np.load(store / "HK" / "labels.npy", mmap_mode="r").shape == (9, 384, 384)
    hk = split[split.client == "HK"].split.value_counts().to_dict()
    assert hk == {"train": 5, "val": 2, "test": 2}

    skin = cfgmod.resolve_run(config, "skin", "fedavg", 0)
    split = pd.read_csv(skin["data"]["split"])
    assert set(split.client) == {"A", "B", "C", "D", "OOD"}
    # The OOD cohort: test rows only (427 x 5 % = 21); client A: 2091/298/598 x 5 %.
    assert split[split.client == "OOD"].split.value_counts().to_dict() == {"test": 21}
    assert split[split.client == "A"].split.value_counts().to_dict() == {"train": 105, "val": 15, "test": 30}
    labels = np.load(Path(skin["data"]["store"]) / "A" / "labels.npy")
    assert set(labels.tolist()) == {0, 1, 2}


def test_an_existing_store_is_refused_in_one_line(tmp_path):
    out = tmp_path / "paper-shaped"
    assert run("--out", str(out), "--tasks", "nuclei", "--scale", "0.05").returncode == 0
    before = sorted(p.name for p in (out / "data" / "nuclei" / "harmofl" / "store").iterdir())
    again = run("--out", str(out), "--tasks", "nuclei", "--scale", "0.05")
    assert again.returncode == 1
    assert again.stderr.strip().count("\n") == 0 and "already exists" in again.stderr
    assert sorted(p.name for p in (out / "data" / "nuclei" / "harmofl" / "store").iterdir()) == before


def test_a_paper_run_refuses_to_train_on_random_pixels_in_one_line(tmp_path):
    out = tmp_path / "paper-shaped"
    assert run("--out", str(out), "--tasks", "prostate", "--scale", "0.02").returncode == 0
    store = out / "data" / "prostate" / "harmofl" / "store"
    assert json.loads((store / "info.json").read_text())["pixels"] == "random"
    # The paper config with the overlay: its prostate data are not marked synthetic.
    config = cfgmod.load_config(ROOT / "config" / "config.yaml", out / "overlay.yaml")
    run_config = json.dumps(cfgmod.resolve_run(config, "prostate", "fedavg", 0))  # as the workflow's train job gets it
    train = subprocess.run([sys.executable, "-m", "fedmedbench", "train", "--run-config", run_config, "--out", str(tmp_path / "run")],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    assert train.returncode == 1
    lines = train.stderr.strip().splitlines()
    assert len(lines) == 1, train.stderr
    assert lines[0].endswith(
        f"DataError: {store}: its pixels are random (info.json: written by benchmarks/paper_shaped_stores.py to time jobs) "
        "and this run's data are not marked synthetic: training on it would report noise as results; remove "
        f"{store.parent} and run the workflow to build the store from the real data, or time jobs with `fedmedbench estimate`"
    )
    assert not (tmp_path / "run").exists()


def test_random_pixels_are_refused_unless_the_data_are_synthetic(tmp_path):
    from fedmedbench.data.store import mark_random_pixels, random_pixels, write_client
    from fedmedbench.errors import DataError
    from fedmedbench.fl.data import refuse_random_pixels

    store = tmp_path / "store"
    write_client(
        store,
        "A",
        np.zeros((2, 8, 8, 1), np.uint8),
        np.zeros(2, np.int64),
        pd.DataFrame({"id": ["a", "b"], "group": ["a", "b"], "source": ["x", "y"]}),
    )
    assert random_pixels(store) is False
    refuse_random_pixels({"data": {"store": str(store), "synthetic": False}})  # a real store: no word
    mark_random_pixels(store, "a test")
    assert random_pixels(store) is True
    refuse_random_pixels({"data": {"store": str(store), "synthetic": True}})  # the demo's own data: allowed
    with pytest.raises(DataError, match=r"its pixels are random \(info.json: written by a test to time jobs\)"):
        refuse_random_pixels({"data": {"store": str(store), "synthetic": False}})
    (store / "info.json").write_text("{not json")
    with pytest.raises(DataError, match=rf"^{store / 'info.json'}: not a JSON object"):
        random_pixels(store)


@pytest.mark.parametrize(("out", "says"), [
    ("results", "--out results: it holds {cwd}/results/paper, the folder the run of config/config.yaml reads its data from"),
    ("results/paper", "--out results/paper: it is {cwd}/results/paper, the folder the run of config/config.yaml reads its data from"),
    ("results/demo", "--out results/demo: it is {cwd}/results/demo, the folder the run of workflow/profiles/demo/demo.yaml reads its data from"),
    ("results/paper/mine", "--out results/paper/mine: it is inside {cwd}/results/paper, the folder the run of config/config.yaml reads its data from"),
    ("shaped", "--out shaped: put it one folder deeper (e.g. --out results/shaped): the folder that holds it becomes a results folder, which may not be the working directory ({cwd}) or a folder above it"),
    ("results/with space", "--out 'results/with space': its last name 'with space' must be a plain name (letters, digits and _ . + -, not starting with '.'): it names the run"),
])  # fmt: skip
def test_an_out_the_pipeline_reads_is_refused_and_nothing_is_written(tmp_path, out, says):
    (tmp_path / "results").mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", out, "--tasks", "nuclei", "--scale", "0.02"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "paper_shaped_stores.py: " + says.format(cwd=tmp_path) + (
        ""
        if "plain name" in says or "deeper" in says
        else "; give a folder of its own, e.g. --out results/paper-shaped"
    )
    assert "results_dir" not in done.stderr
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("*")] == [Path("results")]  # nothing written


def test_an_existing_store_of_a_later_task_is_refused_before_any_store_is_written(tmp_path):
    out = tmp_path / "paper-shaped"
    (out / "data" / "skin" / "prrfl" / "store").mkdir(parents=True)  # skin, asked for after prostate
    failed = run("--out", str(out), "--tasks", "prostate", "skin", "--scale", "0.02")
    assert failed.returncode == 1 and failed.stderr.strip() == (
        f"paper_shaped_stores.py: {out}/data/skin/prrfl/store already exists: remove it or pick another --out"
    )
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "data",
        "data/skin",
        "data/skin/prrfl",
        "data/skin/prrfl/store",
    ]


def test_a_failure_part_way_removes_the_stores_already_written(tmp_path):
    out = tmp_path / "paper-shaped"
    (out / "data" / "skin" / "prrfl" / "split.csv").mkdir(parents=True)  # skin's split cannot be written
    failed = run("--out", str(out), "--tasks", "prostate", "skin", "--scale", "0.02")
    assert failed.returncode == 1
    message = failed.stderr.strip()  # the temporary beside it could not be renamed onto it
    assert "\n" not in message and message.startswith("paper_shaped_stores.py: [Errno 21] Is a directory: ")
    assert message.endswith(f"-> '{out}/data/skin/prrfl/split.csv'")
    # prostate's store and split, written first, are gone with their folders; skin's store too.
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "data",
        "data/skin",
        "data/skin/prrfl",
        "data/skin/prrfl/split.csv",
    ]
