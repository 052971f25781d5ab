"""A degenerate model is never a score: a model that predicts one class on a whole test
split, or a test split without foreground, is flagged in the training log, final.json, every table
cell that uses it (with a footnote) and the report; methods equal on every site get a note; every
caption names its metric in words; a report on a user's own data is no reproduction report."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fedmedbench import cli
from fedmedbench.data import folders as F
from fedmedbench.data.store import open_client, write_client, write_split_csv
from fedmedbench.finals import write_final
from fedmedbench.metrics import ClassificationMeter, SegmentationMeter
from fedmedbench.report.flags import collect_flags
from fedmedbench.report.metric_names import metric_label
from fedmedbench.report.tables import seed_summary, write_table
from tests.conftest import tiny_run_config

ROOT = Path(__file__).resolve().parents[1]


def all_background(shape: tuple[int, ...], num_classes: int) -> torch.Tensor:
    """Logits whose argmax is class 0 on every pixel."""
    logits = torch.zeros(shape[0], num_classes, *shape[1:])
    logits[:, 0] = 5.0
    return logits


# --- the metric accumulator sees what the model predicted --------------------------------------------


def test_an_all_background_model_on_folders_data_gets_foreground_dice_0_and_dice_paper_the_background_share(tmp_path):
    """On the `folders` example (3 classes: background, two nested shapes), an all-background
    prediction scores dice_fg 0 while dice_paper, which averages background in, reads ~30 %: per
    image Dice_bg = 2 f / (1 + f) for background fraction f, the two foreground classes 0."""
    example = F.write_example(tmp_path / "data")
    store = tmp_path / "store"
    F.preprocess({}, store, "", options=example["options"], log=lambda _: None)
    site = open_client(store, "siteA")
    labels = torch.from_numpy(np.asarray(site.labels).astype(np.int64))
    n, pixels = len(labels), labels[0].numel()
    meter = SegmentationMeter(3)
    meter.update(all_background(tuple(labels.shape), 3), labels, list(site.meta["group"]), 0.0)
    scores = meter.compute()

    background = (labels == 0).flatten(1).double().mean(1).numpy()  # f per image
    expected = float(np.mean(2 * background / (1 + background) / 3))
    assert scores["dice_fg"] == 0.0
    assert scores["dice_paper"] == pytest.approx(expected, abs=1e-12)
    assert 0.25 < scores["dice_paper"] < 0.34  # "~30 %" for an all-background model
    counts = meter.class_counts()
    assert counts == {"samples": n, "predicted": [n * pixels, 0, 0], "truth": example["class_pixels"]["siteA"]}
    assert meter.flags() == {"collapsed": f"predicts class 0 (background) on every pixel of all {n} test images"}


def test_a_sound_prediction_is_not_flagged_and_a_split_without_foreground_is():
    truth = torch.zeros(3, 4, 4, dtype=torch.long)
    truth[:, 1:3, 1:3] = 1
    perfect = torch.nn.functional.one_hot(truth, 2).movedim(-1, 1).float()
    meter = SegmentationMeter(2)
    meter.update(perfect, truth, ["a", "b", "c"], 0.0)
    assert meter.flags() == {} and meter.class_counts()["predicted"] == [36, 12]

    empty = torch.zeros(2, 4, 4, dtype=torch.long)
    meter = SegmentationMeter(2)
    meter.update(perfect[:2], empty, ["a", "b"], 0.0)  # the model draws squares, the truth has none
    assert meter.flags() == {"no_foreground": "no foreground pixel in any of its 2 test images"}
    assert np.isnan(meter.compute()["dice_fg"])


def test_a_classifier_that_predicts_one_label_for_every_sample_is_flagged():
    target = torch.tensor([0, 1, 2, 1, 0])
    one_label = torch.tensor([[0.0, 3.0, 0.0]]).repeat(5, 1)
    meter = ClassificationMeter(3)
    meter.update(one_label[:2], target[:2], None, 0.0)
    meter.update(one_label[2:], target[2:], None, 0.0)
    assert meter.flags() == {"collapsed": "predicts class 1 for all 5 test samples"}
    assert meter.class_counts() == {"samples": 5, "predicted": [0, 5, 0], "truth": [2, 2, 1]}
    assert meter.compute()["accuracy"] == pytest.approx(0.4)

    single = ClassificationMeter(3)  # one sample: one label is no collapse
    single.update(one_label[:1], target[:1], None, 0.0)
    varied = ClassificationMeter(3)
    varied.update(torch.nn.functional.one_hot(target, 3).float(), target, None, 0.0)
    assert single.flags() == {} and varied.flags() == {}


# --- a training run: the log and final.json -------------------------------------------------------------


class AllBackground(torch.nn.Module):
    """Stands in for a model that collapsed: background everywhere (a bias Adam cannot turn in one round)."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.tensor([8.0, 0.0]))

    def forward(self, x):
        return self.bias.view(1, 2, 1, 1) + 0 * x[:, :1]


def write_task_without_test_foreground(root: Path):
    """Clients A and B with a bright square per image; client C's 2 test images hold no foreground."""
    rng = np.random.default_rng(0)
    rows = []
    for name, count in (("A", 8), ("B", 8), ("C", 8)):
        images = rng.integers(0, 60, (count, 16, 16, 3), dtype=np.uint8)
        labels = np.zeros((count, 16, 16), np.uint8)
        labels[:, 4:10, 4:10] = 1
        if name == "C":
            labels[-2:] = 0
        meta = pd.DataFrame(
            {
                "id": [f"{name}/s{i}" for i in range(count)],
                "group": [f"{name}/s{i}" for i in range(count)],
                "source": "synthetic",
            }
        )
        write_client(root / "store", name, images, labels, meta)
        parts = ["train"] * (count - 4) + ["val"] * 2 + ["test"] * 2
        rows += [
            {"client": name, "split": s, "row": i, "id": f"{name}/s{i}", "group": f"{name}/s{i}"}
            for i, s in enumerate(parts)
        ]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv"


def test_a_collapsed_run_is_flagged_in_the_log_and_final_json(tmp_path, monkeypatch, caplog):
    from fedmedbench.fl import engine

    store, split = write_task_without_test_foreground(tmp_path / "data")
    monkeypatch.setattr(engine, "build_model", lambda spec: AllBackground())
    cfg = tiny_run_config(store, split, rounds=1, augment="none")
    with caplog.at_level(logging.WARNING, logger="fedmedbench.engine"):
        final = engine.run_training(cfg, tmp_path / "run", progress=False)

    collapsed = "predicts class 0 (background) on every pixel of all 2 test images"
    assert final["flags"] == {
        "A": {"collapsed": collapsed},
        "B": {"collapsed": collapsed},
        "C": {"collapsed": collapsed, "no_foreground": "no foreground pixel in any of its 2 test images"},
    }
    assert json.loads((tmp_path / "run" / "final.json").read_text())["flags"] == final["flags"]
    # 2 images of 256 pixels, 36 of them foreground in A's: all predicted background
    assert final["test_class_counts"]["A"] == {"samples": 2, "predicted": [512, 0], "truth": [440, 72]}
    assert final["test_class_counts"]["C"] == {"samples": 2, "predicted": [512, 0], "truth": [512, 0]}
    assert final["test"]["A"]["dice_fg"] == 0.0
    assert final["test"]["A"]["dice_paper"] == pytest.approx((2 * 220 / (256 + 220)) / 2)  # Dice_bg / 2 classes
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        f"client A: collapsed: the selected model (round 1) {collapsed}; its test scores are flagged in final.json, the tables and the report"
        in warnings
    )
    assert any(m.startswith("client C: no foreground: ") for m in warnings)


# --- tables: marks, footnotes, ties, the metric in words ------------------------------------------------


def final_json(
    run: str, seed: int, values, flags=None, metric="dice_fg", split_name="val", labels=("A", "B", "C")
) -> dict:
    clients = ["siteA", "siteB", "siteC"]
    scores = {c: {metric: v, "loss": 0.1} for c, v in zip(clients, values)}
    return {
        "task": "mysites", "method": run.split("-")[0], "run": run, "seed": seed, "clients": clients,
        "client_labels": list(labels), "synthetic": False, "primary_metric": metric,
        "selection": {"split": split_name, "metric": metric, "per_client": False, "best_round": 3, "rounds": 3},
        "test": scores, "val": scores, "flags": flags or {},
        "metric_descriptions": {metric: "per-case foreground Dice", "loss": "task loss"},
    }  # fmt: skip


COLLAPSED = {"siteB": {"collapsed": "predicts class 0 (background) on every pixel of all 12 test images"}}
FOOTNOTE = "FedAvg, B, seed 0: predicts class 0 (background) on every pixel of all 12 test images (a collapsed model: its score measures no skill)."


def test_a_collapsed_models_cells_carry_a_mark_and_the_footnote_names_run_site_and_seed(tmp_path):
    finals = [final_json("fedavg", 0, [0.9, 0.0, 0.7], COLLAPSED), final_json("fedprox", 0, [0.8, 0.6, 0.7])]
    rows = [("fedavg", "FedAvg"), ("fedprox", "FedProx")]
    write_table(
        seed_summary(finals, "dice_fg"),
        tmp_path / "t",
        rows,
        "My sites",
        metric="dice_fg",
        flags=collect_flags(finals, dict(rows)),
    )
    md = (tmp_path / "t.md").read_text()
    assert md.startswith("**My sites**\n\nMetric: foreground Dice, in %.\n\n| Method | A | B | C | Avg |")
    # B (the collapsed site) and the Avg that averages it are marked; FedProx is not
    assert "| FedAvg | 90.00 (–) | 0.00 (–) † | 70.00 (–) | 53.33 (47.26) † |" in md
    assert "| FedProx | 80.00 (–) | 60.00 (–) | 70.00 (–) | **70.00 (10.00)** |" in md
    assert f"\n† {FOOTNOTE}\n" in md and "\nA marked Avg or Std averages a marked site.\n" in md
    assert "dice_fg" not in md

    tex = (tmp_path / "t.tex").read_text()
    assert r"\caption{My sites. Metric: foreground Dice, in \%.}" in tex
    assert r"0.00 (--)\textsuperscript{\dag}" in tex and r"\textsuperscript{\dag} FedAvg, B, seed 0:" in tex
    csv = pd.read_csv(tmp_path / "t.csv", keep_default_na=False)
    assert list(csv.columns) == ["row", "run", "client", "mean", "std", "n_seeds", "note"]
    note = csv.set_index(["run", "client"])["note"]
    assert note[("fedavg", "B")] == FOOTNOTE and note[("fedavg", "Avg")] == "† averages a flagged site"
    assert note[("fedavg", "A")] == "" and note[("fedprox", "Avg")] == ""


def test_the_table_command_marks_a_collapsed_run_read_from_final_json(tmp_path):
    paths = []
    for final in (final_json("fedavg", 0, [0.9, 0.0, 0.7], COLLAPSED), final_json("fedavg", 1, [0.9, 0.2, 0.7])):
        paths.append(tmp_path / f"seed{final['seed']}" / "final.json")
        paths[-1].parent.mkdir()
        write_final(paths[-1], final)
    experiment = {
        "title": "Mine",
        "task": "mysites",
        "runs": ["fedavg"],
        "labels": {"fedavg": "FedAvg"},
        "seeds": [0, 1],
        "metric": "dice_fg",
    }
    assert (
        cli.main(
            ["table", "--experiment", json.dumps(experiment), "--out-prefix", str(tmp_path / "tab"), *map(str, paths)]
        )
        == 0
    )
    md = (tmp_path / "tab.md").read_text()
    # seed 1 is sound, seed 0 is not; a flagged Avg is never bold, even as the table's only row
    assert "| FedAvg | 90.00 (0.00) | 10.00 (14.14) † | 70.00 (0.00) | 56.67 (41.63) † |" in md
    assert f"† {FOOTNOTE}" in md


def test_methods_equal_on_every_site_get_a_note_and_a_last_digit_apart_do_not(tmp_path):
    finals = [
        final_json("fedavg", 0, [0.9, 0.8, 0.7]),
        final_json("fednova", 0, [0.9, 0.8, 0.7]),  # FedNova = FedAvg with equal local steps
        final_json("fedprox", 0, [0.9, 0.8, 0.7001]),  # 70.01: apart in the last printed digit
        final_json("moon", 0, [0.9, 0.8, 0.70004]),  # 70.00 when printed: equal to the last digit
    ]
    rows = [("fedavg", "FedAvg"), ("fednova", "FedNova"), ("fedprox", "FedProx"), ("moon", "MOON")]
    write_table(seed_summary(finals, "dice_fg"), tmp_path / "t", rows, "Ties", metric="dice_fg")
    md = (tmp_path / "t.md").read_text()
    assert "\nNote: FedAvg, FedNova and MOON are identical on every site (to the last printed digit).\n" in md
    assert md.count("identical on every site") == 1  # FedProx differs in one digit: not named
    csv = pd.read_csv(tmp_path / "t.csv", keep_default_na=False).set_index(["run", "client"])["note"]
    assert csv[("fednova", "A")] == "identical on every site to FedAvg, MOON" and csv[("fedprox", "A")] == ""

    write_table(seed_summary(finals[2:3] + finals[:1], "dice_fg"), tmp_path / "u", rows[2:3] + rows[:1], "No tie")
    assert "identical" not in (tmp_path / "u.md").read_text()
    assert list(pd.read_csv(tmp_path / "u.csv").columns) == ["row", "run", "client", "mean", "std", "n_seeds"]


def test_collapsed_flags_follow_the_validation_selection_and_no_foreground_the_split():
    flags = {
        "siteC": {
            "collapsed": "predicts class 0 (background) on every pixel of all 2 test images",
            "no_foreground": "no foreground pixel in any of its 2 test images",
        }
    }
    on_val = collect_flags([final_json("fedavg", 0, [0.9, 0.8, 0.0], flags)])
    on_test = collect_flags([final_json("fedavg", 0, [0.9, 0.8, 0.0], flags, split_name="test (official Fed-LWR)")])
    assert [kind for kind, _ in on_val[("fedavg", "C")]] == ["collapsed", "no_foreground"]
    # another round's test scores: the selected model's collapse says nothing about them
    assert on_test == {
        ("fedavg", "C"): [
            (
                "no_foreground",
                "C: no foreground pixel in any of its 2 test images (foreground Dice is undefined there and Dice incl. background scores only the background).",
            )
        ]
    }


# --- the report: a user's own data, and flags beside the paper -------------------------------------------


def write_finals(tmp_path: Path, finals: list[dict]) -> list[str]:
    paths = []
    for final in finals:
        path = tmp_path / final["run"] / f"seed{final['seed']}" / "final.json"
        path.parent.mkdir(parents=True)
        write_final(path, final)
        paths.append(str(path))
    return paths


def test_a_report_on_a_users_own_data_has_the_per_site_table_and_claims_no_reproduction(tmp_path):
    paths = write_finals(
        tmp_path, [final_json("fedavg", 0, [0.9, 0.0, 0.7], COLLAPSED), final_json("fedprox", 0, [0.8, 0.6, 0.7])]
    )
    experiment = {
        "title": "Your data: test Dice (%) per site",
        "task": "mysites",
        "runs": ["fedavg", "fedprox"],
        "labels": {"fedavg": "FedAvg", "fedprox": "FedProx"},
        "seeds": [0],
        "metric": "dice_fg",
    }
    argv = [
        "report",
        "--experiments",
        json.dumps({"mine": experiment}),
        "--paper-tables",
        str(tmp_path / "none"),
        "--out",
        str(tmp_path / "report.md"),
        *paths,
    ]
    assert cli.main(argv) == 0
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# fedmedbench report\n")
    assert "reproduction" not in text.lower().replace("this report reproduces no paper", "")
    assert "this report reproduces no paper" in text and "Published numbers" not in text
    assert "| paper |" not in text and "Δ" not in text and "n/a" not in text
    assert "Metric: foreground Dice, in %. Per-case foreground Dice." in text and "`dice_fg`" not in text
    assert "| Method | A | B | C | Avg |" in text
    assert "| FedAvg | 90.00 (–) | 0.00 (–) † | 70.00 (–) | 53.33 (47.26) † |" in text
    assert f"† {FOOTNOTE}" in text


def test_a_reproduction_report_marks_a_flagged_cell_beside_the_paper(tmp_path):
    paper = tmp_path / "paper"
    paper.mkdir()
    (paper / "t.csv").write_text(
        "paper,table,task,method,method_id,client,metric,mean,std\n"
        + "".join(f"P,1,mysites,FedAvg,fedavg,{c},dice,80.00,1.00\n" for c in ("A", "B", "C", "Avg"))
    )
    paths = write_finals(tmp_path, [final_json("fedavg", 0, [0.9, 0.0, 0.7], COLLAPSED, metric="dice_paper")])
    experiment = {
        "title": "Paper table",
        "task": "mysites",
        "runs": ["fedavg"],
        "labels": {"fedavg": "FedAvg"},
        "seeds": [0],
        "metric": "dice_paper",
        "paper_table": "t.csv",
    }
    argv = [
        "report",
        "--experiments",
        json.dumps({"t": experiment}),
        "--paper-tables",
        str(paper),
        "--out",
        str(tmp_path / "report.md"),
        *paths,
    ]
    assert cli.main(argv) == 0
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# fedmedbench reproduction report\n") and "Δ = ours − paper" in text
    assert "Metric: Dice (incl. background), in %." in text
    assert "| FedAvg | B | 0.00 (–) † | 80.00 (1.00) | -80.00 |" in text
    assert "| FedAvg | A | 90.00 (–) | 80.00 (1.00) | +10.00 |" in text
    assert f"† {FOOTNOTE}" in text


# --- configuration and the captions of `snakemake --report` ---------------------------------------------


def test_a_folders_segmentation_table_defaults_to_foreground_dice(tmp_path):
    from fedmedbench import config as cfgmod

    F.write_example(tmp_path / "data")
    base = cfgmod.load_config(ROOT / "config" / "config.yaml")
    change = {
        "data": {"mysites": {"family": "folders", "root": str(tmp_path / "data"), "kind": "segmentation", "mask_values": {0: 0, 128: 1, 255: 2}}},
        "tasks": {"mysites": {"dataset": "mysites", "kind": "segmentation"}},
        "experiments": {
            "mine": {"title": "mine", "task": "mysites", "runs": ["fedavg"], "seeds": [0]},
            "paper_dice": {"title": "mine", "task": "mysites", "runs": ["fedavg"], "seeds": [0], "metric": "dice_paper"},
        },
    }  # fmt: skip
    config = cfgmod.deep_merge(base, change)
    cfgmod.complete_user_data(config)
    cfgmod.validate(config)
    assert config["tasks"]["mysites"]["selection_metric"] == "dice_fg"
    assert (
        config["experiments"]["mine"]["metric"] == "dice_fg"
        and config["experiments"]["paper_dice"]["metric"] == "dice_paper"
    )
    assert (
        config["experiments"]["fedlwr_table1_prostate"]["metric"] == "dice_paper"
    )  # the papers' experiments as written


def render_caption(name: str, config: dict, experiment: str | None = None, metric: str | None = None) -> str:
    """A workflow/report/*.rst caption as Snakemake renders it (Jinja, then reStructuredText)."""
    from types import SimpleNamespace

    from docutils.core import publish_parts
    from jinja2 import Environment

    text = (ROOT / "workflow" / "report" / name).read_text()
    snakemake = SimpleNamespace(
        config=config,
        wildcards=SimpleNamespace(experiment=experiment),
        params=SimpleNamespace(metric=metric) if metric else SimpleNamespace(),
    )
    rendered = Environment(trim_blocks=True, lstrip_blocks=True).from_string(text).render(snakemake=snakemake)
    publish_parts(rendered, writer="html")  # valid reStructuredText
    return " ".join(rendered.split())


def test_the_snakemake_report_captions_tell_a_users_experiment_from_a_reproduction():
    papers = {"run_name": "demo", "experiments": {"harmofl": {"paper_table": "harmofl.csv"}, "mine": {}}}
    own = {"run_name": "yourdata", "selected_experiments": ["mine"], "experiments": papers["experiments"]}
    assert "no claim to reproduce a paper" in render_caption("table.rst", own, "mine", metric_label("dice_fg"))
    assert "Metric: foreground Dice, in %." in render_caption("table.rst", own, "mine", metric_label("dice_fg"))
    assert render_caption("table.rst", papers, "harmofl").startswith("Paper-layout table:")
    assert "this report reproduces none" in render_caption("report.rst", own)
    assert render_caption("report.rst", papers).startswith("Our numbers next to the published ones")
    assert "nothing here reproduces a paper" in render_caption("workflow.rst", own)
    assert render_caption("workflow.rst", papers).startswith("fedmedbench reproduces HarmoFL")
