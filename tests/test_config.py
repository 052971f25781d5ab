"""Config loading, schema validation and run resolution."""

from pathlib import Path

import pytest
import yaml

from fedmedbench import config as fmb

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "workflow" / "profiles" / "demo" / "demo.yaml"


def test_paper_config_holds_the_papers_settings():
    cfg = fmb.load_config(ROOT / "config" / "config.yaml")
    run = fmb.resolve_run(cfg, "prostate", "fedprox", 2)
    assert run["rounds"] == 500 and run["batch_size"] == 16 and run["optimizer"]["lr"] == 1e-4
    assert run["optimizer"]["betas"] == [0.9, 0.99] and run["optimizer"]["weight_decay"] == 1e-4
    assert run["model"]["init_features"] == 32 and run["method_params"] == {"mu": 0.01}
    assert run["data"]["store"] == "results/paper/data/prostate/harmofl/store"
    assert cfg["experiments"]["harmofl_table1_prostate"]["seeds"] == [0, 1, 2]


def test_demo_overlay_shrinks_the_run(tmp_path):
    cfg = fmb.load_config(ROOT / "config" / "config.yaml", DEMO)
    run = fmb.resolve_run(cfg, "prostate", "fedavg", 0)
    assert run["model"]["init_features"] < 32 and run["rounds"] < 50 and run["data"]["synthetic"] is True
    assert run["model"]["name"] == "unet"  # deep merge keeps what the overlay does not set


def test_variants_change_params_or_run_settings(tmp_path):
    cfg = fmb.load_config(ROOT / "config" / "config.yaml")
    cfg["methods"]["fedprox"]["variants"] = {"mu0.1": {"mu": 0.1}, "e4": {"local_epochs": 4}}
    assert fmb.resolve_run(cfg, "prostate", "fedprox-mu0.1", 0)["method_params"]["mu"] == 0.1
    e4 = fmb.resolve_run(cfg, "prostate", "fedprox-e4", 0)
    assert e4["local_epochs"] == 4 and e4["method_params"]["mu"] == 0.01 and e4["variant"] == "e4"
    with pytest.raises(ValueError, match="no variant 'nope'"):
        fmb.resolve_run(cfg, "prostate", "fedprox-nope", 0)


def test_typo_in_config_fails_with_its_location(tmp_path):
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["tasks"]["prostate"]["optimizer"]["name"] = "adamm"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ValueError, match=r"tasks\.prostate\.optimizer\.name"):
        fmb.load_config(bad)


def test_experiments_are_typed_with_their_defaults_in_one_place():
    cfg = fmb.load_config(ROOT / "config" / "config.yaml")
    table = fmb.experiment(cfg, "harmofl_table1_prostate")
    assert table.kind == "table" and table.select_on == "val" and table.std_row is False
    assert table.label("fedavg") == "FedAvg" and table.label("unlisted") == "unlisted"
    assert fmb.Experiment.from_dict({"title": "t", "seeds": [0], "runs": ["fedprox-mu0.1"]}).paper_id_map() == {
        "fedprox-mu0.1": "fedprox"
    } and table.task_names() == ("prostate",)
    sweep = fmb.experiment(cfg, "harmofl_fig5b_local_epochs")
    runs = [run for series in sweep.series.values() for run in series.values()]
    assert sweep.kind == "sweep" and sweep.run_names() == list(dict.fromkeys(runs))
    assert fmb.experiment_runs(cfg, "harmofl_table1_prostate")[:2] == [
        ("prostate", "fedavg", 0),
        ("prostate", "fedavg", 1),
    ]
    with pytest.raises(fmb.ConfigError, match="std_rwo.*std_row"):
        fmb.Experiment.from_dict({"title": "t", "seeds": [0], "std_rwo": True})


def test_an_overlay_narrows_a_sweep_with_x_values(tmp_path):
    """The demo draws Fig. 5b at 1, 2 and 4 local epochs: the 8-epoch runs are neither trained nor drawn."""
    cfg = fmb.load_config(ROOT / "config" / "config.yaml", DEMO)
    sweep = fmb.experiment(cfg, "harmofl_fig5b_local_epochs")
    assert {x for runs in sweep.sweep_series().values() for x in runs} == {"1", "2", "4"}
    assert sweep.run_names() == [
        "fedavg",
        "fedavg-e2",
        "fedavg-e4",
        "fedbn",
        "fedbn-e2",
        "fedbn-e4",
        "harmofl",
        "harmofl-e2",
        "harmofl-e4",
    ]
    assert (
        len(fmb.experiment(fmb.load_config(ROOT / "config" / "config.yaml"), "harmofl_fig5b_local_epochs").run_names())
        == 12
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"experiments": {"harmofl_fig5b_local_epochs": {"x_values": ["1", "3"]}}}))
    with pytest.raises(
        fmb.ConfigError,
        match=r"harmofl_fig5b_local_epochs\.x_values: \['3'\] are not x values of its series; have: 1, 2, 4, 8",
    ):
        fmb.load_config(ROOT / "config" / "config.yaml", bad)
