"""benchmarks/paper_shaped_stores.py: stores of the papers' shapes and counts where the paper config
(with the overlay it writes) looks for its data, so that `estimate` can time the paper's jobs on a
GPU node without the real data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

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
