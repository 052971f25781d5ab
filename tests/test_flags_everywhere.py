"""No score without its flag: a collapsed model (one class predicted everywhere) is marked wherever a
number of it is printed or drawn, not only in the main tables. The summary lines of ``train`` and
``federation local`` carry the mark after a WARNING line naming run, site and seed; a test-only
cohort (PRR-FL's unseen institution) is checked for collapse like the test clients, and Table 3, its
bars and the report mark it; a convergence figure, the bar charts and their source CSVs say which
selected model collapsed."""

from __future__ import annotations

import ast
import contextlib
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedmedbench import cli
from fedmedbench.report import figures
from tests.conftest import tiny_run_config, toy_run_config, write_tiny_task

try:  # final.json sealed with its digest, as a training job writes it
    from fedmedbench.finals import write_final
except ImportError:  # a tree whose finals carry no digest

    def write_final(path, final):
        Path(path).write_text(json.dumps(final))


REPO = Path(__file__).resolve().parents[1]
COLLAPSED_A = "predicts class 0 for all 12 test samples"


def final_json(run="fedprox", seed=0, flags=None, ood=None, select_on="val", b=0.9) -> dict:
    """A hand-made final.json: two sites, A collapsed (``flags``)."""
    scores = {"A": {"accuracy": 0.6, "f1_macro": 0.25}, "B": {"accuracy": b, "f1_macro": 0.8}}
    final = {
        "task": "skin", "method": run, "run": run, "seed": seed, "clients": ["A", "B"], "client_labels": ["Site A", "Site B"],
        "synthetic": True, "primary_metric": "accuracy",
        "selection": {"split": select_on, "metric": "accuracy", "per_client": False, "best_round": 2, "rounds": 3},
        "test": scores, "val": scores, "metric_descriptions": {"accuracy": "accuracy", "f1_macro": "macro F1"},
        "flags": {"A": {"collapsed": COLLAPSED_A}} if flags is None else flags,
    }  # fmt: skip
    if ood is not None:
        final["ood"] = ood
    return final


# --- the summary lines: `train` and `federation local` ---------------------------------------------------


def test_train_prints_the_mark_on_its_last_line_after_a_warning_naming_run_site_and_seed(tmp_path, monkeypatch, capsys):
    from fedmedbench.fl import engine

    monkeypatch.setattr(engine, "run_training", lambda *args, **kwargs: final_json())
    assert cli.main(["train", "--run-config", "{}", "--out", str(tmp_path / "run"), "--no-progress"]) in (0, None)
    out, err = capsys.readouterr()
    assert (
        out.strip().splitlines()[-1]
        == "skin/fedprox/seed0: mean test accuracy 0.7500 (selected on val: 2) † (collapsed on 1 of 2 sites: see the WARNING lines)"
    )
    assert (
        f"WARNING: run fedprox (task skin), site Site A, seed 0: collapsed: {COLLAPSED_A} (a collapsed model: its score measures no skill)"
        in err.splitlines()
    )


def test_train_prints_a_sound_run_bare(tmp_path, monkeypatch, capsys):
    from fedmedbench.fl import engine

    monkeypatch.setattr(engine, "run_training", lambda *args, **kwargs: final_json(flags={}))
    cli.main(["train", "--run-config", "{}", "--out", str(tmp_path / "run"), "--no-progress"])
    out, err = capsys.readouterr()
    assert out.strip().splitlines()[-1] == "skin/fedprox/seed0: mean test accuracy 0.7500 (selected on val: 2)"
    assert "WARNING" not in err


def test_federation_local_prints_the_mark_and_the_warning(tmp_path, monkeypatch, capsys):
    pytest.importorskip("flwr")
    from fedmedbench.federation import local

    final = final_json()
    final.update(task="prostate", run="fedavg", method="fedavg", client_labels=["A", "B"])
    final["flags"] = {"A": {"collapsed": "predicts class 0 (background) on every pixel of all 4 test images"}}

    class Federation:  # the run's outputs as a finished run leaves them
        address = "127.0.0.1:1"

        def stream(self, run_config, log, echo=None):
            Path(run_config["out"], "final.json").write_text(json.dumps(final))
            return 0

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(local, "prepare_data", lambda *args: None)
    monkeypatch.setattr(local, "local_federation", lambda *args, **kwargs: contextlib.nullcontext(Federation()))
    args = {"config": ["config/config.yaml", "workflow/profiles/demo/demo.yaml"], "task": "prostate", "run": "fedavg", "seed": 0, "sites": 2, "rounds": 1,
            "results": str(tmp_path / "results"), "cold": False, "restart": False}  # fmt: skip
    import argparse

    local._run_local(argparse.Namespace(**args))
    out, err = capsys.readouterr()
    line = next(line for line in out.splitlines() if "mean test" in line)
    assert (
        line
        == "prostate/fedavg/seed0: mean test accuracy 0.7500 over 2 sites (selected on val: 2) † (collapsed on 1 of 2 sites: see the WARNING lines)"
    )
    assert (
        "WARNING: run fedavg (task prostate), site A, seed 0: collapsed: predicts class 0 (background) on every pixel of all 4 test images"
        in err
    )


def test_no_command_prints_a_mean_test_score_past_the_flags():
    """Every print of a run's mean test score in the package goes through ``print_score_summary``:
    a print() call whose text says "mean test" is one that could print a collapsed score bare."""
    bare = []
    for path in sorted((REPO / "src" / "fedmedbench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                text = " ".join(
                    c.value
                    for arg in node.args
                    for c in ast.walk(arg)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
                if "mean test" in text:
                    bare.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert bare == []


def test_the_summary_mark_covers_no_foreground_and_drops_a_collapse_not_selected_on_val(capsys):
    from fedmedbench.report.flags import print_score_summary, score_warnings, summary_mark

    final = final_json(
        flags={"A": {"no_foreground": "no foreground pixel in any of its 2 test images"}, "B": {"collapsed": "x"}},
        select_on="test",
    )
    assert summary_mark(final) == "‡ (no foreground in test on 1 of 2 sites: see the WARNING lines)"
    assert score_warnings(final) == ["WARNING: run fedprox (task skin), site Site A, seed 0: no foreground: no foreground pixel in any of its 2 test images "
                                     "(foreground Dice is undefined there and Dice incl. background scores only the background)"]  # fmt: skip
    print_score_summary(final, "line")
    out, err = capsys.readouterr()
    assert (
        out == "line ‡ (no foreground in test on 1 of 2 sites: see the WARNING lines)\n" and err.count("WARNING") == 1
    )


# --- the collapse check covers the test-only cohorts --------------------------------------------------------


class Constant(torch.nn.Module):
    """A classifier that predicts ``label`` for every sample (or, ``label=None``, the sample's own class
    read from its first pixel)."""

    def __init__(self, label):
        super().__init__()
        self.label = label
        self.bias = torch.nn.Parameter(torch.zeros(3))

    def forward(self, x):
        if self.label is None:
            truth = (x[:, 0, 0, 0] * 255).round().long() % 3
            return self.bias + 5.0 * torch.nn.functional.one_hot(truth, 3).float()
        return self.bias + 5.0 * torch.nn.functional.one_hot(torch.full((len(x),), self.label), 3).float()


def cohort_split(n=10):
    from fedmedbench.fl.data import SplitData

    labels = np.arange(n) % 3
    images = np.zeros((n, 4, 4, 3), np.uint8)
    images[:, 0, 0, 0] = labels  # the sound model reads the class from here
    return SplitData(images, labels.astype(np.int64), np.arange(n), np.array([f"g{i}" for i in range(n)]))


def test_a_cohort_whose_ensemble_and_one_model_collapse_is_flagged_per_scoring():
    from fedmedbench.fl.evaluation import score_cohort

    cfg = toy_run_config(model={"name": "densenet", "num_classes": 3}, intensity_scale=1 / 255)
    # Two models predicting class 0 outvote the sound one everywhere: the ensemble predicts 0 too.
    scores = score_cohort(
        {"A": Constant(0), "B": Constant(0), "C": Constant(None)}, cohort_split(), cfg, torch.device("cpu")
    )
    assert scores["per_model"]["C"]["accuracy"] == 1.0 and scores["ensemble"]["accuracy"] == pytest.approx(0.4)
    assert scores["flags"] == {
        "ensemble": {"collapsed": "predicts class 0 for all 10 test samples"},
        "per_model": {
            "A": {"collapsed": "predicts class 0 for all 10 test samples"},
            "B": {"collapsed": "predicts class 0 for all 10 test samples"},
        },
    }
    from fedmedbench.metrics import cohort_flag_texts

    assert cohort_flag_texts(scores["flags"]) == {
        "collapsed": "the ensemble predicts class 0 for all 10 test samples; client A's model predicts class 0 for all 10 test samples; "
                     "client B's model predicts class 0 for all 10 test samples"
    }  # fmt: skip
    sound = score_cohort({"C": Constant(None)}, cohort_split(), cfg, torch.device("cpu"))
    assert "flags" not in sound  # no key where nothing is flagged: a sound run's final.json is as before


class AllBackground(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor([8.0, 0.0]))

    def forward(self, x):
        return self.bias.view(1, 2, 1, 1) + 0 * x[:, :1]


def test_a_run_whose_cohort_collapses_says_so_in_final_json_and_its_log(tmp_path, monkeypatch, caplog):
    from fedmedbench.fl import engine

    store, split = write_tiny_task(tmp_path / "data")
    monkeypatch.setattr(engine, "build_model", lambda spec: AllBackground())
    cfg = tiny_run_config(store, split, clients=("A", "B"), ood_clients=["C"], rounds=1, augment="none")
    with caplog.at_level(logging.WARNING, logger="fedmedbench.engine"):
        final = engine.run_training(cfg, tmp_path / "run", progress=False)
    why = "predicts class 0 (background) on every pixel of all 2 test images"
    assert final["ood"]["C"]["flags"] == {
        "ensemble": {"collapsed": why},
        "per_model": {"A": {"collapsed": why}, "B": {"collapsed": why}},
    }
    assert final["flags"]["C"] == {"collapsed": f"the ensemble {why}; client A's model {why}; client B's model {why}"}
    assert json.loads((tmp_path / "run" / "final.json").read_text())["flags"] == final["flags"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(m.startswith(f"test-only cohort C: collapsed: the ensemble {why}") for m in warnings)
    from fedmedbench.report.flags import score_warnings

    assert (
        f"WARNING: run fedavg (task tiny), site C, seed 0: collapsed: the ensemble {why}; client A's model {why}; client B's model {why} (a collapsed model: its score measures no skill)"
        in score_warnings(final)
    )


def test_a_federated_cohorts_reply_may_carry_its_flags_and_nothing_else_unknown():
    pytest.importorskip("flwr")
    from fedmedbench.federation.messages import check_ood
    from fedmedbench.fl.rounds import SiteError

    scores = {"accuracy": 0.6}
    reply = {"mean": scores, "ensemble": scores, "per_model": {"A": scores}}
    check_ood("ood: cohort C", reply, ["A"])
    check_ood(
        "ood: cohort C",
        {**reply, "flags": {"ensemble": {"collapsed": "predicts class 0 for all 10 test samples"}}},
        ["A"],
    )
    with pytest.raises(SiteError, match=r"^ood: cohort C: the reply's flags .* are not"):
        check_ood("ood: cohort C", {**reply, "flags": {"the ensemble": "x"}}, ["A"])


# --- Table 3, its bars and the report ---------------------------------------------------------------------


def ood_final(run, seed, ensemble_collapsed=False, model_collapsed=()):
    why = "predicts class 0 for all 10 test samples"
    flags = {}
    if ensemble_collapsed:
        flags["ensemble"] = {"collapsed": why}
    if model_collapsed:
        flags["per_model"] = {c: {"collapsed": why} for c in model_collapsed}
    cohort = {"mean": {"f1_macro": 0.4, "auc_macro": 0.7, "accuracy": 0.7}, "ensemble": {"f1_macro": 0.25, "auc_macro": 0.6, "accuracy": 0.6},
              "per_model": {c: {"f1_macro": 0.4, "auc_macro": 0.7, "accuracy": 0.7} for c in ("A", "B")}}  # fmt: skip
    if flags:
        cohort["flags"] = flags
    final = final_json(run, seed, flags={}, ood={"OOD": cohort})
    return final


def write_finals(tmp_path, finals) -> list[str]:
    paths = []
    for f in finals:
        path = tmp_path / "train" / f["run"] / f"seed{f['seed']}" / "final.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_final(path, f)
        paths.append(str(path))
    return paths


OOD_EXPERIMENT = {"kind": "ood_table", "title": "PRR-FL Table 3", "task": "skin", "cohort": "OOD", "runs": ["fedavg", "fedprox", "fedbn"],
                  "labels": {"fedavg": "FedAvg", "fedprox": "FedProx", "fedbn": "FedBN"}, "seeds": [0], "paper_table": "prrfl_table3_ood.csv"}  # fmt: skip


def test_table3_and_its_bars_mark_a_collapsed_ensemble_and_a_mean_that_averages_a_collapsed_model(tmp_path):
    finals = [
        ood_final("fedavg", 0),
        ood_final("fedprox", 0, ensemble_collapsed=True),
        ood_final("fedbn", 0, ensemble_collapsed=True, model_collapsed=("B",)),
    ]
    paths = write_finals(tmp_path, finals)
    cli.main(
        [
            "ood-table",
            "--experiment",
            json.dumps(OOD_EXPERIMENT),
            "--out-prefix",
            str(tmp_path / "t3"),
            "--figure-prefix",
            str(tmp_path / "t3_bars"),
            *paths,
        ]
    )
    md = (tmp_path / "t3.md").read_text()
    assert "| FedAvg | 40.00 (–) | 70.00 (–) | 25.00 (–) | 60.00 (–) |" in md
    assert "| FedProx | 40.00 (–) | 70.00 (–) | 25.00 (–) † | 60.00 (–) † |" in md
    assert "| FedBN | 40.00 (–) † | 70.00 (–) † | 25.00 (–) † | 60.00 (–) † |" in md
    assert (
        "† FedProx, cohort OOD, seed 0: the ensemble predicts class 0 for all 10 test samples (a collapsed model: its score measures no skill)."
        in md
    )
    assert (
        "† FedBN, cohort OOD, seed 0: the mean of the models averages a flagged one: client B's model predicts class 0 for all 10 test samples"
        in md
    )
    bars = pd.read_csv(tmp_path / "t3_bars.csv", keep_default_na=False).set_index(["series", "x"])["collapsed"]
    assert bars[("F1 (ensemble)", "FedProx")].startswith("FedProx, cohort OOD, seed 0: the ensemble predicts class 0")
    assert bars[("F1", "FedBN")].startswith("FedBN, cohort OOD, seed 0: the mean of the models averages a flagged one")
    assert bars[("F1", "FedProx")] == "" and bars[("F1 (ensemble)", "FedAvg")] == ""


def test_the_reports_table3_marks_the_collapsed_cells(tmp_path):
    finals = [ood_final("fedavg", 0), ood_final("fedprox", 0, ensemble_collapsed=True)]
    paths = write_finals(tmp_path, finals)
    experiment = {**OOD_EXPERIMENT, "runs": ["fedavg", "fedprox"]}
    cli.main(["report", "--experiments", json.dumps({"prrfl_table3_ood": experiment}), "--paper-tables", str(REPO / "resources" / "paper_tables"),
              "--out", str(tmp_path / "report.md"), *paths])  # fmt: skip
    report = (tmp_path / "report.md").read_text()
    assert "| FedProx | OOD F1 (ensemble) | 25.00 (–) † | 38.14 |" in report
    assert "| FedAvg | OOD F1 (ensemble) | 25.00 (–) | 37.76 |" in report
    assert (
        "\n† FedProx, cohort OOD, seed 0: the ensemble predicts class 0 for all 10 test samples (a collapsed model: its score measures no skill).\n"
        in report
    )


# --- the convergence figure and the bar charts -------------------------------------------------------------


@pytest.fixture
def drawn(monkeypatch):
    """Figures stay open after ``save_figure`` (which closes them); closed at the end of the test."""
    close = figures.plt.close
    kept = []
    monkeypatch.setattr(figures.plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for fig in kept:
        close(fig)


def history(values, clients=("A", "B")):
    rows = [
        {"round": r, "client": c, "split": s, "metric": "accuracy", "value": v}
        for r, per in enumerate(values, start=1)
        for c, v in zip(clients, per)
        for s in ("val", "test")
    ]
    rows += [
        {"round": r, "client": c, "split": "train", "metric": "loss", "value": 0.5}
        for r in range(1, len(values) + 1)
        for c in clients
    ]
    return pd.DataFrame(rows)


def test_a_convergence_figure_whose_selected_model_collapsed_says_so_on_its_face_and_in_its_csv(tmp_path, drawn):
    finals = {"fedavg": [final_json("fedavg", flags={}, b=0.8)], "fedprox": [final_json("fedprox")]}
    histories = {
        "fedavg": [history([[0.5, 0.7], [0.6, 0.8], [0.6, 0.8]])],
        "fedprox": [history([[0.5, 0.7], [0.6, 0.9], [0.6, 0.8]])],
    }
    figures.convergence(
        histories,
        "accuracy",
        tmp_path / "conv",
        "Convergence",
        labels={"fedavg": "FedAvg", "fedprox": "FedProx"},
        finals=finals,
    )
    data = pd.read_csv(tmp_path / "conv.csv", keep_default_na=False)
    selected = data[data["kind"] == "selected"].set_index("series")["collapsed"]
    assert (
        selected["FedProx †"]
        == f"FedProx, Site A, seed 0: {COLLAPSED_A} (a collapsed model: its score measures no skill)."
    )
    assert selected["FedAvg"] == ""
    assert set(data.loc[data["kind"] == "curve", "series"]) == {"FedAvg", "FedProx †"}
    legend = drawn[-1].axes[0].get_legend()
    texts = [t.get_text() for t in legend.get_texts()] + [legend.get_title().get_text()]
    assert "FedProx †" in texts and "FedAvg" in texts
    assert (
        "† selected model collapsed (one class on a whole test split): FedProx: Site A seed 0"
        in legend.get_title().get_text()
    )


def test_the_figure_command_reads_the_flags_beside_the_histories(tmp_path):
    paths = []
    for run, flags, b in (("fedavg", {}, 0.8), ("fedprox", None, 0.9)):
        folder = tmp_path / "train" / run / "seed0"
        folder.mkdir(parents=True)
        write_final(folder / "final.json", final_json(run, flags=flags, b=b))
        history([[0.5, 0.7], [0.6, b], [0.6, 0.8]]).to_csv(folder / "history.csv", index=False)
        paths.append(str(folder / "history.csv"))
    experiment = {
        "title": "Mine: test accuracy",
        "task": "skin",
        "runs": ["fedavg", "fedprox"],
        "seeds": [0],
        "metric": "accuracy",
    }
    cli.main(["figure", "--experiment", json.dumps(experiment), "--out-prefix", str(tmp_path / "conv"), *paths])
    data = pd.read_csv(tmp_path / "conv.csv", keep_default_na=False)
    marked = data.loc[data["collapsed"] != "", ["series", "kind"]].drop_duplicates().values.tolist()
    assert marked == [["fedprox †", "selected"]]


def test_a_fairness_bar_of_a_collapsed_model_says_so_in_its_csv(tmp_path):
    from fedmedbench.report.fedlwr import fairness_bars
    from fedmedbench.report.flags import collect_flags
    from fedmedbench.report.tables import seed_summary

    finals = [final_json("fedavg", flags={}, b=0.8), final_json("fedprox")]
    summary = seed_summary(finals, "accuracy", std_row=True)
    labels = {"fedavg": "FedAvg", "fedprox": "FedProx"}
    fairness_bars(
        summary,
        ["fedavg", "fedprox"],
        tmp_path / "bars",
        "Bars",
        "accuracy",
        labels=labels,
        flags=collect_flags(finals, labels),
    )
    data = pd.read_csv(tmp_path / "bars.csv", keep_default_na=False)
    marked = data[data["collapsed"] != ""]
    assert marked[["x"]].values.ravel().tolist() == ["Site A"] and marked["series"].iloc[0].startswith("FedProx †")
    assert (
        marked["collapsed"].iloc[0]
        == f"FedProx, Site A, seed 0: {COLLAPSED_A} (a collapsed model: its score measures no skill)."
    )


def test_a_sweep_point_that_averages_a_collapsed_model_is_marked_in_its_csv(tmp_path, drawn):
    from fedmedbench.report.sweeps import sweep_figure, sweep_flags, sweep_points

    finals = [final_json("fedprox-mu0.01", flags={}, b=0.8), final_json("fedprox-mu1")]
    series = {"FedProx": {0.01: "fedprox-mu0.01", 1.0: "fedprox-mu1"}}
    collapsed = sweep_flags(finals, series, {"fedprox-mu1": "FedProx (mu 1)"})
    assert collapsed == {
        "FedProx": {
            1.0: f"FedProx (mu 1), Site A, seed 0: {COLLAPSED_A} (a collapsed model: its score measures no skill)."
        }
    }
    sweep_figure(
        sweep_points(finals, series, "accuracy", "clients_std"),
        tmp_path / "sweep",
        "Sweep",
        "mu",
        "accuracy (%)",
        log_x=True,
        error="clients_std",
        collapsed=collapsed,
    )
    data = pd.read_csv(tmp_path / "sweep.csv", keep_default_na=False).set_index("x")["collapsed"]
    assert data[1.0].startswith("FedProx (mu 1), Site A, seed 0") and data[0.01] == ""
    assert "†: averages a collapsed model" in drawn[-1].axes[0].get_legend().get_title().get_text()
