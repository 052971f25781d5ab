"""What a reviewer sent back, one test per rule, read from the saved figures' artists and their source
CSVs (report/figures.py SourceData): synthetic data said on the face and in the CSV; no error bar or
band outside the metric's feasible range; one error definition per paper figure; every series
distinguishable and a collapsed run marked; the selected round marked on the convergence curve; no
flagged row bold as best; MRI in grey; legible layer labels; legends no taller than the plot; a key
and a score per qualitative panel; n stated. And the folder check (report/figure_check.py) over a
folder of every figure kind, and over a demo's folder when FEDMEDBENCH_FIGURES names one."""

from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib.collections import PolyCollection
from matplotlib.container import ErrorbarContainer

from fedmedbench.report import fedlwr, figure_check, figures, metric_names, prrfl, qualitative, sweeps
from fedmedbench.report.figures import SOURCE_COLUMNS, SYNTHETIC_MARK
from fedmedbench.report.flags import collect_flags
from fedmedbench.report.tables import AVG, SYNTHETIC_NOTE, seed_summary, write_table

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ("A", "B", "C")


@pytest.fixture
def drawn(monkeypatch):
    """Figures stay open after ``save_figure`` (which closes them); closed at the end of the test."""
    close = figures.plt.close
    kept = []
    monkeypatch.setattr(figures.plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for fig in kept:
        close(fig)


def history(values_by_round, metric="dice_paper", clients=CLIENTS):
    rows = []
    for rnd, values in enumerate(values_by_round, start=1):
        for client, v in zip(clients, values):
            for split in ("test", "val"):
                rows.append({"round": rnd, "client": client, "split": split, "metric": metric, "value": v})
    return pd.DataFrame(rows)


def final(run, seed, values, metric="dice_paper", best_round=2, flags=None):
    return {"run": run, "method": run.split("-")[0], "seed": seed, "clients": list(CLIENTS), "client_labels": list(CLIENTS),
            "test": {c: {metric: v} for c, v in zip(CLIENTS, values)}, "flags": flags or {},
            "selection": {"split": "val", "metric": metric, "per_client": isinstance(best_round, dict), "best_round": best_round, "rounds": 4}}  # fmt: skip


def retro_history(offset=0.0, rounds=3, epochs=2):
    rows = [{"round": r, "client": "C", "split": "test_local", "metric": "accuracy", "value": 0.5 + 0.03 * r + 0.01 * e + offset, "epoch": e}
            for r in range(1, rounds + 1) for e in range(epochs + 1)]  # fmt: skip
    return pd.DataFrame(rows)


def cka_history():
    rows = []
    for rnd in (1, 2):
        for k, client in enumerate(CLIENTS):
            for i, layer in enumerate(("enc.0.0", "enc.0.1", "enc.1.0", "enc.1.1", "head")):
                rows.append(
                    {
                        "round": rnd,
                        "client": client,
                        "split": "server",
                        "metric": f"cka:{layer}",
                        "value": 0.9 - 0.1 * i,
                    }
                )
                for peer in CLIENTS:
                    if peer != client:
                        rows.append(
                            {
                                "round": rnd,
                                "client": client,
                                "split": "server",
                                "metric": f"pair_cka:{peer}:{layer}",
                                "value": 0.8 - 0.05 * i + 0.01 * k,
                            }
                        )
    return pd.DataFrame(rows)


def ood_final(run, seed, f1, auc):
    scores = {"f1_macro": f1, "auc_macro": auc}
    return {
        "run": run,
        "method": run,
        "seed": seed,
        "ood": {"OOD": {"mean": scores, "ensemble": {k: v + 0.01 for k, v in scores.items()}}},
    }


def every_figure(folder: Path, synthetic: bool):
    """Each figure kind of the report, drawn as the pipeline draws it, into ``folder``; returns the
    prefixes. Values near 100 % with a wide spread, so that an unclipped bar would leave 0-100 %."""
    seed_values = ([0.97, 0.98, 0.99], [0.9, 0.85, 0.8])  # client means 98 and 85 %
    high = [history([v] * 4) for v in seed_values]
    finals = [
        final(run, s, [0.99 - 0.15 * s, 0.97, 0.7 + 0.1 * i])
        for i, run in enumerate(("fedavg", "fedlwr"))
        for s in range(2)
    ]
    draws = {
        "table1_convergence": lambda p: figures.convergence(
            {"fedavg": high},
            "dice_paper",
            p,
            "T",
            finals={"fedavg": [final("fedavg", s, v) for s, v in enumerate(seed_values)]},
            synthetic=synthetic,
        ),
        "paper_fig5b_sweep": lambda p: sweeps.sweep_figure(
            {"FedAvg": [(1.0, 98.0, 4.5, 3), (2.0, 90.0, 2.0, 3)]},
            p,
            "T",
            "epochs",
            "y",
            error="clients_sem",
            synthetic=synthetic,
        ),
        "paper_fig5c_sweep": lambda p: sweeps.sweep_figure(
            {"HarmoFL": [(0.5, 97.0, 1.0, 3), (1.0, 96.0, 1.0, 3)]},
            p,
            "T",
            "alpha",
            "y",
            error="clients_sem",
            synthetic=synthetic,
        ),
        "fairness_bars": lambda p: fedlwr.fairness_bars(
            seed_summary(finals, "dice_paper", std_row=True),
            ["fedavg", "fedlwr"],
            p,
            "T",
            "dice_paper",
            synthetic=synthetic,
        ),
        "fairness_curves": lambda p: fedlwr.fairness_curves(
            {"fedavg": high}, "dice_paper", p, "T", synthetic=synthetic
        ),
        "layer_cka": lambda p: fedlwr.layer_cka_figure(cka_history(), p, "T", synthetic=synthetic),
        "ood": lambda p: prrfl.ood_figure(
            prrfl.ood_summary([ood_final("fedavg", s, 0.99 - 0.2 * s, 0.98) for s in range(2)], "OOD"),
            ["fedavg"],
            p,
            "T",
            synthetic=synthetic,
        ),
        "retrogress": lambda p: prrfl.retrogress_figure(
            {"fedavg": [retro_history()]}, "C", "accuracy", p, "T", n_test=3, synthetic=synthetic
        ),
        "qualitative": lambda p: qualitative.qualitative_figure(
            [qualitative_row()], [("fedavg", "FedAvg")], p, "T", synthetic=synthetic
        ),
    }
    for name, draw in draws.items():
        draw(folder / name)
    return draws


def qualitative_row():
    truth = np.zeros((8, 8), np.uint8)
    truth[2:6, 2:6] = 1  # 16 pixels
    pred = np.zeros((8, 8), np.uint8)
    pred[2:6, 2:4] = 1  # 8 of them: Dice 2*8/(16+8) = 66.7 %
    image = np.stack([np.zeros((8, 8)), np.full((8, 8), 200), np.full((8, 8), 50)], -1).astype(np.uint8)
    return {"label": "prostate / HK", "image": image, "truth": truth, "preds": {"fedavg": pred}, "centre_slice": True}


# ------------------------------------------------------------------------------ synthetic on the face


@pytest.mark.parametrize("synthetic", [True, False])
def test_every_figure_says_synthetic_on_its_face_and_in_its_csv(drawn, tmp_path, synthetic):
    names = list(every_figure(tmp_path, synthetic))
    assert len(drawn) == len(names)
    for name, fig in zip(names, drawn):
        title = " ".join(fig._suptitle.get_text().split())  # wrapped to the figure's width
        assert title.startswith(SYNTHETIC_MARK) is synthetic, name
        data = pd.read_csv(tmp_path / f"{name}.csv")
        assert list(data.columns) == list(SOURCE_COLUMNS) and len(data) > 0
        assert set(data["synthetic"]) == {synthetic}, name
        # the saved PNG carries the drawn title, so a check of the folder reads it
        assert figure_check.png_title(tmp_path / f"{name}.png").startswith(SYNTHETIC_MARK) is synthetic


def test_a_synthetic_table_says_so_on_its_face(tmp_path):
    finals = [final("fedavg", 0, [0.8, 0.9, 0.7])]
    write_table(seed_summary(finals, "dice_paper"), tmp_path / "t", [("fedavg", "FedAvg")], "Table 1", synthetic=True)
    md, tex = (tmp_path / "t.md").read_text(), (tmp_path / "t.tex").read_text()
    assert (
        md.splitlines()[2] == f"**{SYNTHETIC_NOTE}**" and "SYNTHETIC DATA" in tex.split(r"\caption{")[1].split("}")[0]
    )
    assert set(pd.read_csv(tmp_path / "t.csv")["synthetic"]) == {True}
    write_table(seed_summary(finals, "dice_paper"), tmp_path / "r", [("fedavg", "FedAvg")], "Table 1")
    assert (
        "SYNTHETIC" not in (tmp_path / "r.md").read_text()
        and "synthetic" not in pd.read_csv(tmp_path / "r.csv").columns
    )


def test_the_workflow_tells_the_report_jobs_which_tasks_are_synthetic():
    """The demo's experiment JSON (workflow/rules/common.smk) gives each task spec `synthetic`."""
    text = (ROOT / "workflow" / "rules" / "common.smk").read_text()
    assert '"synthetic": task_synthetic(t)' in text
    demo = yaml.safe_load((ROOT / "workflow" / "profiles" / "demo" / "demo.yaml").read_text())
    assert all(section.get("synthetic") for section in demo["data"].values())


# ------------------------------------------------------------------------------ feasible range


def _errorbar_ends(ax):
    ends = []
    for container in (c for c in ax.containers if isinstance(c, ErrorbarContainer)):
        for segment in container.lines[2][0].get_segments():
            ends += [segment[0][1], segment[1][1]]
    return np.array(ends)


def test_no_error_bar_or_band_leaves_0_to_100_percent(drawn, tmp_path):
    every_figure(tmp_path, synthetic=False)
    by_name = dict(
        zip(
            [
                "table1_convergence",
                "paper_fig5b_sweep",
                "paper_fig5c_sweep",
                "fairness_bars",
                "fairness_curves",
                "layer_cka",
                "ood",
                "retrogress",
                "qualitative",
            ],
            drawn,
        )
    )
    # Fig. 5b's point 98 ± 4.5 would reach 102.5 %: its bar ends at 100 and the legend says so
    sweep = by_name["paper_fig5b_sweep"].axes[0]
    ends = _errorbar_ends(sweep)
    assert ends.max() == pytest.approx(100.0) and sorted(ends)[:2] == pytest.approx([88.0, 92.0])  # 90 ± 2 unclipped
    assert "clipped to 0-100 %" in sweep.get_legend().get_title().get_text()
    data = pd.read_csv(tmp_path / "paper_fig5b_sweep.csv")
    assert data["high"].max() == 100.0 and data.loc[data["x"] == 1.0, "low"].item() == pytest.approx(93.5)
    # the convergence band (two seeds, one near 100 %) stays under 100
    conv = by_name["table1_convergence"].axes[0]
    (band,) = [c for c in conv.collections if isinstance(c, PolyCollection)]
    assert band.get_paths()[0].vertices[:, 1].max() <= 100.0 + 1e-9
    # unclipped, the band would pass 100: mean 91.5 + std over the two seeds' means 9.19 = 100.7
    assert np.mean([98.0, 85.0]) + np.std([98.0, 85.0], ddof=1) > 100
    assert "clipped to 0-100 %" in conv.get_legend().get_title().get_text()
    # bars: fairness (seed scores 99 and 84 on A) and OOD
    for name in ("fairness_bars", "ood"):
        ends = _errorbar_ends(by_name[name].axes[0])
        assert len(ends) and ends.max() <= 100.0 + 1e-9 and ends.min() >= 0.0, name
    for name in by_name:
        data = pd.read_csv(tmp_path / f"{name}.csv")
        for column in ("y", "low", "high"):
            values = data[column].dropna()
            assert (values <= data.loc[values.index, "y_max"].fillna(np.inf) + 1e-9).all(), (name, column)


# ------------------------------------------------------------------------------ one error definition


def test_one_error_definition_per_paper_figure_named_on_it(drawn, tmp_path):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["experiments"]
    assert config["harmofl_fig5b_local_epochs"]["error"] == config["harmofl_fig5c_perturbation_radius"]["error"]
    every_figure(tmp_path, synthetic=False)
    for name in ("paper_fig5b_sweep", "paper_fig5c_sweep", "fairness_bars", "ood", "table1_convergence", "layer_cka"):
        errors = set(pd.read_csv(tmp_path / f"{name}.csv")["error"].dropna())
        assert len(errors) == 1, (name, errors)
    assert figure_check.check_figures(tmp_path) == []
    # two definitions across Fig. 5's panels are one too many for the folder check
    data = pd.read_csv(tmp_path / "paper_fig5c_sweep.csv")
    data["error"] = data["error"].where(data["error"].isna(), metric_names.SWEEP_ERRORS["clients_std"])
    data.to_csv(tmp_path / "paper_fig5c_sweep.csv", index=False)
    assert any("paper_fig5: its panels" in p for p in figure_check.check_figures(tmp_path))


def test_sweep_axis_says_one_seed_with_one_seed():
    one = {"FedAvg": [(1.0, 80.0, 1.0, 1)]}
    three = {"FedAvg": [(1.0, 80.0, 1.0, 3)]}
    assert sweeps.sweep_y_label("accuracy", one) == "test accuracy (%),\nmean over clients (1 seed)"
    assert sweeps.sweep_y_label("accuracy", three) == "test accuracy (%),\nmean over clients and 3 seeds"


# ------------------------------------------------------------------------------ distinct series


FEDLWR_RUNS = [
    "solo",
    "fedavg",
    "qfedavg",
    "qfedavg-official",
    "cffl",
    "cffl-official",
    "cgsv",
    "cgsv-official",
    "ditto",
    "fedce-sum",
    "fedce-multi",
    "fedlwr",
    "fedlwr-official",
]


def test_thirteen_bar_series_are_told_apart_and_a_collapsed_rule_is_marked(drawn, tmp_path):
    collapsed = {c: {"collapsed": "predicts class 0 on every pixel"} for c in CLIENTS}
    finals = [
        final(
            run,
            0,
            [0.05, 0.06, 0.05] if run == "qfedavg-official" else [0.8 + 0.01 * i, 0.85, 0.9],
            flags=collapsed if run == "qfedavg-official" else None,
        )
        for i, run in enumerate(FEDLWR_RUNS)
    ]
    flags = collect_flags(finals)
    fedlwr.fairness_bars(
        seed_summary(finals, "dice_paper", std_row=True), FEDLWR_RUNS, tmp_path / "b", "b", "dice_paper", flags=flags
    )
    ax = drawn[-1].axes[0]
    firsts = [c.patches[0] for c in ax.containers if not isinstance(c, ErrorbarContainer)]
    assert len(firsts) == 13
    pairs = {(matplotlib.colors.to_hex(p.get_facecolor()), p.get_hatch()) for p in firsts}
    assert len(pairs) == 13  # no two methods alike (ten colours: the hatch tells the rest apart)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    official = [t for t in labels if t.startswith("qfedavg-official")]
    assert len(official) == 1 and "does not train here" in official[0]
    assert sum("does not train here" in t for t in labels) == 1
    marks = [t for t in ax.texts if t.get_text() == "†"]
    assert len(marks) == 3  # one above each of its three bars
    styles = pd.read_csv(tmp_path / "b.csv").groupby("series")["style"].first()
    assert styles.is_unique and len(styles) == 13


# ------------------------------------------------------------------------------ selected round


def test_the_selected_round_is_marked_at_the_tables_number_on_the_curve(drawn, tmp_path):
    # the curve peaks at round 2 (70 %) and ends lower (50 %): the table reports round 2's model
    h = history([[0.5, 0.6, 0.7], [0.6, 0.7, 0.8], [0.5, 0.6, 0.7], [0.4, 0.5, 0.6]])
    sel = final("fedavg", 0, [0.6, 0.7, 0.8], best_round=2)
    figures.convergence({"fedavg": [h]}, "dice_paper", tmp_path / "c_convergence", "T", finals={"fedavg": [sel]})
    ax = drawn[-1].axes[0]
    (curve,) = [line for line in ax.get_lines() if line.get_label() == "fedavg"]
    (star,) = [line for line in ax.get_lines() if line.get_label() == "_selected"]
    table_avg = seed_summary([sel], "dice_paper").set_index("client_label").loc[AVG, "mean"]
    assert star.get_xdata()[0] == 2 and star.get_ydata()[0] == pytest.approx(table_avg)
    assert curve.get_ydata()[1] == pytest.approx(table_avg) and curve.get_ydata()[-1] == pytest.approx(50.0)
    assert figures.SELECTED_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
    data = pd.read_csv(tmp_path / "c_convergence.csv")
    assert data.loc[data["kind"] == "selected", ["x", "y"]].values.tolist() == [[2, pytest.approx(70.0)]]
    assert figure_check.check_figures(tmp_path) == []
    # a marker off the curve is caught by the folder check
    data.loc[data["kind"] == "selected", "y"] = 60.0
    data.to_csv(tmp_path / "c_convergence.csv", index=False)
    assert any("off the curve" in p for p in figure_check.check_figures(tmp_path))


def test_per_client_selection_marks_each_clients_round(drawn, tmp_path):
    h = history([[0.5, 0.6, 0.7], [0.6, 0.7, 0.8], [0.5, 0.9, 0.7], [0.4, 0.5, 0.9]])
    sel = final("fedbn", 0, [0.6, 0.9, 0.9], best_round={"A": 2, "B": 3, "C": 4})
    figures.convergence({"fedbn": [h]}, "dice_paper", tmp_path / "p", "T", finals={"fedbn": [sel]})
    ax = drawn[-1].axes[0]
    (ticks,) = [line for line in ax.get_lines() if line.get_label() == "_selected rounds"]
    (segment,) = [line for line in ax.get_lines() if line.get_label() == "_table Avg"]
    curve = [line for line in ax.get_lines() if line.get_label() == "fedbn"][0].get_ydata()
    assert list(ticks.get_xdata()) == [2, 3, 4] and list(ticks.get_ydata()) == pytest.approx(
        [curve[1], curve[2], curve[3]]
    )
    assert list(segment.get_xdata()) == [2, 4] and list(segment.get_ydata()) == pytest.approx(
        [80.0, 80.0]
    )  # (60 + 90 + 90) / 3


# ------------------------------------------------------------------------------ best row


def test_a_flagged_row_is_never_bold_as_best(tmp_path):
    collapsed = {"B": {"collapsed": "predicts class 0 on every pixel"}}
    finals = [final("fedavg", 0, [0.9, 0.9, 0.9], flags=collapsed), final("fedprox", 0, [0.8, 0.6, 0.7])]
    rows = [("fedavg", "FedAvg"), ("fedprox", "FedProx")]
    write_table(seed_summary(finals, "dice_paper"), tmp_path / "t", rows, "T", flags=collect_flags(finals, dict(rows)))
    md = (tmp_path / "t.md").read_text()
    assert "| 90.00 (0.00) † |" in md and "**70.00 (10.00)**" in md  # the higher Avg is flagged: FedProx is best
    # every model collapsed (a newcomer's own data): nothing is bold
    all_flagged = [
        final(r, 0, [0.5, 0.5, 0.4], flags={c: {"collapsed": "one class"} for c in CLIENTS})
        for r in ("fedavg", "fedprox")
    ]
    write_table(
        seed_summary(all_flagged, "dice_paper"), tmp_path / "u", rows, "U", flags=collect_flags(all_flagged, dict(rows))
    )
    assert (
        "**" not in (tmp_path / "u.md").read_text().split("\n", 2)[2]
        and r"\textbf" not in (tmp_path / "u.tex").read_text()
    )
    assert figure_check.check_tables(tmp_path) == []
    (tmp_path / "v.md").write_text("| FedAvg | **50.00 (1.00)** † |\n")
    assert figure_check.check_tables(tmp_path) == ["v: a flagged Avg is bold (marked best): '**50.00 (1.00)** †'"]


# ------------------------------------------------------------------------------ images


def test_mri_is_shown_as_its_middle_slice_in_grey(drawn, tmp_path):
    harmofl = pytest.importorskip("fedmedbench.report.harmofl")  # imports torch
    slices = np.stack([np.full((6, 6), 10), np.full((6, 6), 120), np.full((6, 6), 240)], -1).astype(np.uint8)
    rgb = np.full((6, 6, 3), 90, np.uint8)
    panels = {"prostate": [("HK", slices, slices)], "nuclei": [("TNBC", rgb, rgb)]}
    harmofl.ampnorm_figure(panels, tmp_path / "a", "T", centre_slice={"prostate"})
    axes = drawn[-1].axes
    prostate, nuclei = axes[0].get_images()[0], axes[2].get_images()[0]
    assert (
        prostate.get_array().ndim == 2
        and prostate.get_cmap().name == "gray"
        and float(prostate.get_array().mean()) == 120.0
    )
    assert nuclei.get_array().ndim == 3  # colour histology stays colour
    assert "middle slice, grey" in axes[0].get_ylabel()


def test_qualitative_panels_have_a_key_and_a_score(drawn, tmp_path):
    qualitative.qualitative_figure([qualitative_row()], [("fedavg", "FedAvg")], tmp_path / "q", "T")
    fig = drawn[-1]
    (legend,) = fig.legends
    assert "foreground" in legend.get_texts()[0].get_text() and "grey" in legend.get_texts()[0].get_text()
    assert fig.axes[2].get_xlabel() == "foreground Dice 66.7 %"  # as the tables name it
    data = pd.read_csv(tmp_path / "q.csv")
    assert data.loc[data["series"] == "FedAvg", "y"].item() == pytest.approx(200 / 3)
    assert math.isnan(qualitative.foreground_dice(np.zeros((2, 2)), np.zeros((2, 2))))  # undefined, not 100 %


# ------------------------------------------------------------------------------ legibility


def test_layer_labels_are_legible_and_do_not_overlap(drawn, tmp_path):
    layers = [f"encoders.{b}.{k}" for b in range(4) for k in (0, 1, 3, 4)] + [
        "bottleneck.0",
        "bottleneck.1",
        "bottleneck.3",
        "bottleneck.4",
    ]
    layers += [name for b in range(4) for name in [f"upconvs.{b}"] + [f"decoders.{b}.{k}" for k in (0, 1, 3, 4)]] + [
        "head"
    ]
    assert len(layers) == 41
    rows = [
        {"round": r, "client": c, "split": "server", "metric": f"cka:{layer}", "value": 0.5}
        for r in (1, 2)
        for c in CLIENTS
        for layer in layers
    ]
    fedlwr.layer_cka_figure(pd.DataFrame(rows), tmp_path / "cka", "T")
    fig = drawn[-1]
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert 10 <= len(labels) <= 15  # blocks, not 41 layers
        assert min(t.get_fontsize() for t in labels) >= 7
        # still a tick per layer (a minor tick where a block's label does not sit)
        assert set(ax.get_xticks(minor=True)) | set(ax.get_xticks()) >= set(range(41))
        boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 + 0.5 for a, b in zip(boxes, boxes[1:]))  # no two labels overlap


def test_a_legend_of_eleven_long_names_is_not_taller_than_the_plot(drawn, tmp_path):
    labels = {f"m{i}": f"Ours (PRR-FL, official flow, per-client selection) {i}" for i in range(11)}
    runs = {run: [history([[0.5 + 0.01 * i] * 3] * 4)] for i, run in enumerate(labels)}
    figures.convergence(runs, "dice_paper", tmp_path / "c", "T", labels=labels)
    fig = drawn[-1]
    fig.canvas.draw()
    (legend,) = fig.legends
    assert legend.get_window_extent().height <= fig.axes[0].get_window_extent().height
    assert len(legend.get_texts()) == 11


def test_the_retrogress_figure_states_n_and_its_step(drawn, tmp_path):
    prrfl.retrogress_figure({"fedavg": [retro_history()]}, "C", "accuracy", tmp_path / "r", "T", n_test=3)
    title = drawn[-1].axes[0].get_legend().get_title().get_text()
    assert "n = 3 test images (one image = 33.3 pp)" in title
    assert set(pd.read_csv(tmp_path / "r.csv")["n"]) == {3}


# ------------------------------------------------------------------------------ folder check


def test_the_folder_check_passes_every_figure_kind_and_can_fail(tmp_path):
    every_figure(tmp_path, synthetic=True)
    assert figure_check.check_figures(tmp_path) == []
    data = pd.read_csv(tmp_path / "fairness_bars.csv")
    data.loc[0, "high"] = 102.5
    data.loc[1, "style"] = data.loc[len(data) - 1, "style"]
    data.to_csv(tmp_path / "fairness_bars.csv", index=False)
    (tmp_path / "ood.csv").unlink()
    problems = figure_check.check_figures(tmp_path)
    assert any("high 102.5 outside 0-100" in p for p in problems)
    assert any("share a style" in p for p in problems)
    assert "ood: no source CSV ood.csv" in problems


@pytest.mark.skipif(
    not os.environ.get("FEDMEDBENCH_FIGURES"), reason="set FEDMEDBENCH_FIGURES=<run>/figures to check a demo's figures"
)
def test_a_demos_figures_pass_the_folder_check():
    folder = Path(os.environ["FEDMEDBENCH_FIGURES"])
    assert figure_check.check_figures(folder) == []
    assert figure_check.check_tables(folder.parent / "tables") == []
