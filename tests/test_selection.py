"""Model selection on validation; test evaluated once for the selected models, curves every k rounds."""

import json

import pandas as pd

from fedmedbench.fl import engine
from tests.conftest import interrupt_after_round, tiny_run_config


def test_reported_test_scores_are_the_selected_models_and_curves_are_sparse(tmp_path, tiny_task):
    store, split = tiny_task
    every_round = engine.run_training(
        tiny_run_config(store, split, "fedavg", rounds=5, curve_every=1), tmp_path / "dense", progress=False
    )
    sparse = engine.run_training(
        tiny_run_config(store, split, "fedavg", rounds=5, curve_every=3), tmp_path / "sparse", progress=False
    )

    # The same selection and the same test numbers, whether or not test was evaluated every round...
    assert sparse["selection"]["best_round"] == every_round["selection"]["best_round"]
    assert sparse["test"] == every_round["test"]
    # ... and they are the test scores of the selected round.
    history = pd.read_csv(tmp_path / "dense" / "history.csv")
    at_best = history[(history["round"] == every_round["selection"]["best_round"]) & (history.split == "test")]
    for client, scores in every_round["test"].items():
        for metric, value in scores.items():
            assert at_best[(at_best.client == client) & (at_best.metric == metric)].value.item() == value
    # Test curves every 3 rounds and at the last one; validation every round (selection).
    sparse_history = pd.read_csv(tmp_path / "sparse" / "history.csv")
    assert sorted(sparse_history[sparse_history.split == "test"]["round"].unique()) == [3, 5]
    assert sorted(sparse_history[sparse_history.split == "val"]["round"].unique()) == [1, 2, 3, 4, 5]


def test_per_client_selection_picks_each_clients_round(tmp_path, tiny_task):
    store, split = tiny_task
    final = engine.run_training(
        tiny_run_config(store, split, "solo", rounds=4, curve_every=1), tmp_path / "solo", progress=False
    )
    history = pd.read_csv(tmp_path / "solo" / "history.csv")
    for client, best_round in final["selection"]["best_round"].items():
        val = history[(history.client == client) & (history.split == "val") & (history.metric == "dice_paper")]
        assert best_round == int(val.loc[val.value.idxmax(), "round"])  # first best (ties keep the earlier round)
        test = history[(history.client == client) & (history.split == "test") & (history["round"] == best_round)]
        assert final["test"][client]["dice_paper"] == test[test.metric == "dice_paper"].value.item()


def test_selected_models_are_written_only_when_the_selection_changes(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=4)
    interrupt_after_round(cfg, tmp_path / "run", monkeypatch, round_index=3)
    files = sorted(p.name for p in (tmp_path / "run").glob("selection-v*.pt"))
    assert 1 <= len(files) <= 2  # the ones the checkpoint and its .prev refer to
    engine.run_training(cfg, tmp_path / "run", progress=False)
    assert not list((tmp_path / "run").glob("selection-v*.pt")) and not list((tmp_path / "run").glob("checkpoint*"))
    assert json.loads((tmp_path / "run" / "final.json").read_text())["selection"]["rounds"] == 4
