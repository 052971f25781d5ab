"""Method invariants from specs/methods.md, checked bit for bit on a tiny task."""

import json

import pytest

from fedmedbench.fl.engine import run_training
from tests.conftest import assert_same_models, strip, tiny_run_config, train


def test_fedprox_with_mu_zero_is_bitwise_fedavg(tmp_path, tiny_task):
    store, split = tiny_task
    fedavg = train(tmp_path, "fedavg", tiny_run_config(store, split, "fedavg"))
    fedprox = train(tmp_path, "fedprox", tiny_run_config(store, split, "fedprox", method_params={"mu": 0.0}))
    assert strip(fedavg[0]) == strip(fedprox[0])
    assert fedavg[2] == fedprox[2]  # every round's numbers
    assert_same_models(fedavg[1], fedprox[1])
    # ... while a real proximal term changes the training (so this test can fail).
    strong = train(tmp_path, "fedprox_strong", tiny_run_config(store, split, "fedprox", method_params={"mu": 10.0}))
    assert strong[2] != fedavg[2]


def test_fedavg_with_one_client_equals_solo(tmp_path, tiny_task):
    store, split = tiny_task
    fedavg = train(tmp_path, "fedavg", tiny_run_config(store, split, "fedavg", clients=["B"]))
    solo = train(tmp_path, "solo", tiny_run_config(store, split, "solo", clients=["B"]))
    assert fedavg[0]["test"] == solo[0]["test"] and fedavg[0]["val"] == solo[0]["val"]
    assert fedavg[2] == solo[2]
    assert_same_models(fedavg[1], solo[1])


def test_solo_clients_do_not_share(tmp_path, tiny_task):
    store, split = tiny_task
    solo, best, _ = train(tmp_path, "solo", tiny_run_config(store, split, "solo"))
    assert solo["selection"]["per_client"] is True
    weights = {k for k, v in best["models"]["base"].items() if v.is_floating_point()}
    assert weights <= set(best["models"]["diffs"]["B"])  # every weight and statistic differs


def test_fedavg_clients_share_one_model(tmp_path, tiny_task):
    store, split = tiny_task
    final, best, _ = train(tmp_path, "fedavg", tiny_run_config(store, split, "fedavg"))
    assert best["models"]["diffs"] == {"B": {}, "C": {}}
    assert isinstance(final["selection"]["best_round"], int)
    assert 1 <= final["selection"]["best_round"] <= 3
    assert set(final["test"]["A"]) == {"dice_paper", "dice_fg", "loss"}
    assert not (tmp_path / "fedavg" / "checkpoint.pt").exists()


def test_training_learns_the_tiny_task(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=12, augment="none")
    final, _, history = train(tmp_path, "fedavg", cfg)
    mean_fg = sum(v["dice_fg"] for v in final["val"].values()) / 3
    assert mean_fg > 0.5, final["val"]


def test_bn_buffers_local_keeps_client_statistics(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", aggregation={"weighting": "samples", "bn_buffers": "local"})
    _, best, _ = train(tmp_path, "local_bn", cfg)
    differing = set(best["models"]["diffs"]["B"])
    assert differing and all(k.endswith(("running_mean", "running_var", "num_batches_tracked")) for k in differing)


def test_final_json_is_plain_json(tmp_path, tiny_task):
    store, split = tiny_task
    run_training(tiny_run_config(store, split, "fedavg", rounds=1), tmp_path / "r", progress=False)
    final = json.loads((tmp_path / "r" / "final.json").read_text())
    assert final["clients"] == ["A", "B", "C"] and final["synthetic"] is True


def test_unknown_method_is_a_clear_error(tmp_path, tiny_task):
    store, split = tiny_task
    with pytest.raises(ValueError, match="unknown method 'fedfoo'"):
        run_training(tiny_run_config(store, split, "fedfoo"), tmp_path / "x", progress=False)


def test_predictions_of_the_selected_round_are_saved(tmp_path, tiny_task):
    import numpy as np

    store, split = tiny_task
    run_training(
        tiny_run_config(store, split, "fedavg", rounds=2, qualitative_samples=2), tmp_path / "p", progress=False
    )
    with np.load(tmp_path / "p" / "predictions.npz") as saved:
        assert saved["A|image"].shape == (2, 16, 16, 3) and saved["A|image"].dtype == np.uint8
        assert saved["B|label"].shape == saved["B|pred"].shape == (2, 16, 16)
        assert set(np.unique(saved["C|pred"])) <= {0, 1}
