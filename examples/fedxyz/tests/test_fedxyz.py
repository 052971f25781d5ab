"""fedxyz trains for two rounds on a tiny synthetic three-site federation (seconds on a CPU)."""

import json

import pandas as pd

from fedmedbench.fl.engine import run_training
from fedmedbench.testing import tiny_run_config

from fedxyz.method import DEFAULTS


def test_fedxyz_trains_two_rounds(tmp_path):
    # The run's parameters are the method's own DEFAULTS: rename, add or remove one and this test holds.
    cfg = tiny_run_config("fedxyz.method", tmp_path / "data")
    final = run_training(cfg, tmp_path / "run", progress=False)
    assert final["selection"]["rounds"] == 2
    assert set(final["test"]) == set(cfg["clients"])
    assert all(0.0 <= scores["dice_paper"] <= 1.0 for scores in final["test"].values())
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    assert sorted(history["round"].unique()) == [1, 2]
    assert json.loads((tmp_path / "run" / "final.json").read_text())["config"]["method_params"] == DEFAULTS
