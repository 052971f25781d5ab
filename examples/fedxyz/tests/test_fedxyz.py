"""fedxyz trains for two rounds on a tiny synthetic three-site federation (seconds on a CPU)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.data.store import write_client, write_split_csv
from fedmedbench.fl.engine import run_training


def tiny_federation(root: Path):
    """Three sites of 16x16 images with a bright square; the label is the square."""
    rng = np.random.default_rng(0)
    rows = []
    for site in ("siteA", "siteB", "siteC"):
        images = rng.integers(0, 60, (10, 16, 16, 3), dtype=np.uint8)
        labels = np.zeros((10, 16, 16), np.uint8)
        for i in range(10):
            y, x = rng.integers(2, 8, 2)
            labels[i, y : y + 6, x : x + 6] = 1
            images[i, y : y + 6, x : x + 6] += 150
        meta = pd.DataFrame({"id": [f"{site}/{i}" for i in range(10)], "group": [f"{site}/{i}" for i in range(10)], "source": "synthetic"})
        write_client(root / "store", site, images, labels, meta)
        parts = ["train"] * 6 + ["val"] * 2 + ["test"] * 2
        rows += [{"client": site, "split": s, "row": i, "id": f"{site}/{i}", "group": f"{site}/{i}"} for i, s in enumerate(parts)]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv"


def test_fedxyz_trains_two_rounds(tmp_path):
    store, split = tiny_federation(tmp_path / "data")
    cfg = {
        "task": "tiny", "method": "fedxyz", "method_module": "fedxyz.method", "run": "fedxyz", "seed": 0,
        "kind": "segmentation", "clients": ["siteA", "siteB", "siteC"],
        "data": {"store": str(store), "split": str(split), "synthetic": True},
        "model": {"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2},
        "loss": "dice_ce", "optimizer": {"name": "adam", "lr": 1e-2},
        "rounds": 2, "local_epochs": 1, "batch_size": 4, "intensity_scale": 1 / 255,
        "selection_metric": "dice_paper", "method_params": {"mu": 0.01},
    }
    final = run_training(cfg, tmp_path / "run", progress=False)
    assert final["selection"]["rounds"] == 2
    assert set(final["test"]) == {"siteA", "siteB", "siteC"}
    assert all(0.0 <= scores["dice_paper"] <= 1.0 for scores in final["test"].values())
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    assert sorted(history["round"].unique()) == [1, 2]
    assert json.loads((tmp_path / "run" / "final.json").read_text())["config"]["method_params"] == {"mu": 0.01}
