"""Rows that say which rule made them: the PRR-FL official flow under the tables' selection
rule, the FedNova = FedAvg sentence (computed, never assumed), one spread across clients per table,
and titles that claim no count the demo's data do not have."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fedmedbench import config as fmb
from fedmedbench.data.store import write_split_csv
from fedmedbench.fl.engine import run_training
from fedmedbench.report.compare import compare, load_paper_table, write_report
from fedmedbench.report.equivalences import fednova_fedavg_note, local_steps_per_round
from fedmedbench.report.tables import seed_summary, write_table
from tests.conftest import tiny_run_config, write_tiny_task

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "workflow" / "profiles" / "demo" / "demo.yaml"


# --- PRR-FL: the official flow under the tables' selection rule ------------------------------------------
def test_prrfl_official_flow_under_the_tables_selection_rule():
    cfg = fmb.load_config(ROOT / "config" / "config.yaml")
    paper = fmb.resolve_run(cfg, "skin", "prrfl", 0)
    official = fmb.resolve_run(cfg, "skin", "prrfl-official", 0)
    tablesel = fmb.resolve_run(cfg, "skin", "prrfl-official_tablesel", 0)
    # the same method as the official row ...
    assert tablesel["method_params"] == official["method_params"] != paper["method_params"]
    # ... selected as every other row of the tables (and as the paper row)
    assert (
        (tablesel["selection_scope"], tablesel["selection_window"])
        == (paper["selection_scope"], paper["selection_window"])
        == ("per_client", 1.0)
    )
    assert (official["selection_scope"], official["selection_window"]) == ("pooled", 0.2)
    differ = {k for k in official if official[k] != tablesel[k]}
    assert differ == {"selection_scope", "selection_window", "run", "variant"}
    for name in ("prrfl_table2_f1", "prrfl_table2_auc", "prrfl_table3_ood"):
        exp = fmb.experiment(cfg, name)
        runs = list(exp.runs)
        assert runs.index("prrfl") < runs.index("prrfl-official_tablesel") < runs.index("prrfl-official")
        assert exp.paper_id_map()["prrfl-official_tablesel"] == "prrfl"
        assert exp.label("prrfl-official_tablesel") == "Ours (PRR-FL, official flow, per-client selection)"
        assert any("selection difference" in note for note in exp.notes)


def test_demo_ood_title_claims_no_real_cohort_size():
    assert "427" in fmb.experiment(fmb.load_config(ROOT / "config" / "config.yaml"), "prrfl_table3_ood").title
    demo = fmb.experiment(fmb.load_config(ROOT / "config" / "config.yaml", DEMO), "prrfl_table3_ood")
    assert "427" not in demo.title and "synthetic" in demo.title


# --- one spread across clients per table ---------------------------------------------------------------
def final(run, seed, values, clients=("A", "B", "C")):
    return {"task": "t", "method": run.split("-")[0], "run": run, "seed": seed, "clients": list(clients), "client_labels": list(clients),
            "test": {c: {"dice_paper": v} for c, v in zip(clients, values)}}  # fmt: skip


def test_table_with_std_column_prints_no_second_spread_across_clients(tmp_path):
    finals = [final("fedlwr", 0, [0.90, 0.80, 0.70]), final("fedlwr", 1, [0.92, 0.84, 0.70])]
    with_std = seed_summary(finals, "dice_paper", std_row=True).set_index("client_label")
    # per-seed averages 80 and 82: their sample std sqrt(2); not the clients' ddof=1 std sqrt(111)
    assert with_std.loc["Avg", "mean"] == pytest.approx(81.0)
    assert with_std.loc["Avg", "std"] == pytest.approx(math.sqrt(2))
    assert with_std.loc["Std", "mean"] == pytest.approx((math.sqrt(200 / 3) + math.sqrt(248 / 3)) / 2)
    plain = seed_summary(finals, "dice_paper").set_index("client_label")
    assert plain.loc["Avg", "std"] == pytest.approx(math.sqrt(111))  # HarmoFL's Avg parenthesis unchanged
    one_seed = seed_summary(finals[:1], "dice_paper", std_row=True)
    write_table(one_seed, tmp_path / "t", [("fedlwr", "Fed-LWR")], caption="c")
    line = [x for x in (tmp_path / "t.md").read_text().splitlines() if x.startswith("| Fed-LWR")][0]
    # one seed: A, B, C and Avg have no spread (–); Std = population std of 90, 80, 70 = 8.16
    assert line.count("(–)") == 4 and "8.16" in line and "10.00" not in line  # 10.00 = the ddof=1 std


def test_report_header_says_std_is_averaged_over_seeds(tmp_path):
    finals = [final("fedavg", 0, [0.90, 0.80, 0.70])]
    paper = load_paper_table(ROOT / "resources" / "paper_tables" / "fedlwr_table3_ablation.csv")
    comp = compare(
        seed_summary(finals, "dice_paper", std_row=True),
        paper,
        {"fedavg": "fedavg"},
        client_map={"A": "Site1", "B": "Site2", "C": "Site3"},
    )
    section = {"title": "t", "comparison": comp, "metric_note": "m"}
    text = write_report([section], tmp_path / "r.md", True, {"seeds": [0], "rounds": 1}).read_text()
    assert "population standard deviation (ddof=0) across clients, averaged over seeds" in text


# --- FedNova = FedAvg, said where the finals show it ---------------------------------------------------------
def test_note_only_for_identical_rows_with_equal_local_steps(tmp_path):
    store, split = write_tiny_task(tmp_path, n=(12, 14, 13))  # train 8 / 10 / 9
    labels = {"fednova": "FedNova", "fedavg": "FedAvg"}

    def pair(truncate, nova_values, avg_values, batch=4):
        cfg = {"data": {"split": str(split)}, "batch_size": batch, "local_epochs": 2, "truncate_to_smallest": truncate}
        return [
            {**final(r, 0, v), "method": r, "config": cfg}
            for r, v in (("fednova", nova_values), ("fedavg", avg_values))
        ]

    same = [0.5, 0.25, 0.125]
    assert local_steps_per_round(pair(True, same, same)[0]) == {"A": 4, "B": 4, "C": 4}  # 2 epochs x ceil(8 / 4)
    assert local_steps_per_round(pair(False, same, same)[0]) == {"A": 4, "B": 6, "C": 6}
    (note,) = fednova_fedavg_note(pair(True, same, same), labels)
    assert (
        note.startswith("FedNova and FedAvg are identical on every site and seed")
        and "local steps per round (4)" in note
    )
    assert fednova_fedavg_note(pair(True, same, [0.5, 0.25, 0.1250001]), labels) == []  # one site differs
    assert (
        fednova_fedavg_note(pair(False, same, same), labels) == []
    )  # equal scores, unequal steps: no reason we can state
    seeds_differ = pair(True, same, same)
    seeds_differ[1] = {**seeds_differ[1], "seed": 1}
    assert fednova_fedavg_note(seeds_differ, labels) == []


@pytest.mark.parametrize("truncate", [True, False])
def test_note_from_real_runs(tmp_path, truncate):
    """Tiny FedNova and FedAvg runs (SGD with momentum, as Camelyon17): with truncation every client takes
    2 steps in its round and the two runs are one computation; without it (8 / 12 / 10 samples: 2 / 3 / 3
    steps) they differ and no sentence is printed."""
    store, split = write_tiny_task(tmp_path / "data", n=(12, 16, 14))
    finals = []
    for method in ("fednova", "fedavg"):
        cfg = tiny_run_config(store, split, method, rounds=1, augment="none", truncate_to_smallest=truncate,
                              optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9}, method_params={"proximal_mu": 0.0, "server_momentum": 0.0} if method == "fednova" else {})  # fmt: skip
        run_training(cfg, tmp_path / method, device="cpu", progress=False)
        finals.append(json.loads((tmp_path / method / "final.json").read_text()))
    notes = fednova_fedavg_note(finals, {"fednova": "FedNova", "fedavg": "FedAvg"})
    if truncate:
        assert finals[0]["test"] == finals[1]["test"]
        assert len(notes) == 1 and "(2)" in notes[0]
    else:
        assert finals[0]["test"] != finals[1]["test"] and notes == []


def test_equivalences_module_does_not_import_torch():
    code = "import sys, fedmedbench.report.equivalences; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_split_counts_for_unequal_sizes_use_the_split_file(tmp_path):
    """``local_steps_per_round`` reads the split file the run trained on; drop_last floors."""
    rows = pd.DataFrame(
        [
            {"client": c, "split": "train", "row": i, "id": f"{c}{i}", "group": f"{c}{i}"}
            for c, n in (("A", 9), ("B", 5))
            for i in range(n)
        ]
    )
    write_split_csv(rows, tmp_path / "split.csv")
    base = {
        "clients": ["A", "B"],
        "config": {"data": {"split": str(tmp_path / "split.csv")}, "batch_size": 4, "local_epochs": 1},
    }
    assert local_steps_per_round(base) == {"A": 3, "B": 2}
    assert local_steps_per_round({**base, "config": {**base["config"], "drop_last": True}}) == {"A": 2, "B": 1}
    assert local_steps_per_round({**base, "config": {**base["config"], "data": {}}}) is None


def test_qualitative_predictions_come_from_the_evaluation_batches(tmp_path):
    """A network with batch statistics at test time (the official HarmoFL BN) predicts an image from its
    batch: the figure's predictions are those of the evaluation's batches (4 here), not of a batch of the
    first ``qualitative_samples`` (2) images alone."""
    import torch

    from fedmedbench.fl.data import eval_batches, load_clients
    from fedmedbench.fl.evaluation import predict_samples
    from fedmedbench.models import build_model
    from fedmedbench.runconfig import RunConfig

    store, split = write_tiny_task(tmp_path, n=(12,))
    rows = pd.read_csv(split)
    rows["split"] = ["train"] * 4 + ["val"] * 2 + ["test"] * 6
    write_split_csv(rows, split)
    cfg = RunConfig.from_dict(
        tiny_run_config(
            store,
            split,
            clients=("A",),
            eval_batch_size=4,
            qualitative_samples=2,
            model={"name": "unet", "init_features": 2, "bn": "stateless"},
        )
    )
    (client,) = load_clients(store, split, ["A"], False)
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    saved = predict_samples(model, client.test, cfg, torch.device("cpu"))
    x, y, _ = next(eval_batches(client.test, 4, cfg.intensity_scale))
    with torch.no_grad():
        in_batch, alone = model(x).argmax(1)[:2], model(x[:2]).argmax(1)
    assert torch.equal(saved["pred"], in_batch.to(torch.uint8)) and torch.equal(saved["label"], y[:2].to(torch.uint8))
    assert not torch.equal(in_batch, alone)  # the batch changes the prediction: the test can fail
