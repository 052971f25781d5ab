"""The drawing rules of every report figure, read back from the drawn artists (report/figures.py):
ties stay visible and are named, bars start at 0, no error bar from one seed, title and legend inside
the saved image, metric keys in words, error bars equal the tables' numbers, ten methods told apart.

Each figure function is called as the pipeline calls it (it saves PNG + PDF); the ``drawn`` fixture
keeps the figure open after saving so its artists can be inspected."""

from __future__ import annotations

import json
import math

import matplotlib.image
import matplotlib.text
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from fedmedbench import cli
from fedmedbench.finals import write_final
from fedmedbench.report import fedlwr, figures, prrfl, sweeps
from fedmedbench.report.metric_names import METRIC_LABELS, metric_label
from fedmedbench.report.tables import AVG, STD, seed_summary

CLIENTS = ("A", "B", "C")
LONG_TITLE = (
    "HarmoFL Table 1 (prostate MRI segmentation): Dice (%), mean (std) over seeds, " * 2
    + "and a title long enough to pass both edges of the figure"
)


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
    """history.csv rows: ``values_by_round[r]`` holds one value per client (fractions)."""
    rows = []
    for rnd, values in enumerate(values_by_round, start=1):
        for client, v in zip(clients, values):
            rows.append({"round": rnd, "client": client, "split": "test", "metric": metric, "value": v})
            rows.append({"round": rnd, "client": client, "split": "val", "metric": metric, "value": v})
    return pd.DataFrame(rows)


def ramp(offset=0.0, rounds=4):
    return history([[0.5 + 0.05 * r + offset + 0.02 * k for k in range(len(CLIENTS))] for r in range(rounds)])


def final(run, seed, values, metric="dice_paper", method=None):
    return {"run": run, "method": method or run.split("-")[0], "seed": seed, "clients": list(CLIENTS), "client_labels": list(CLIENTS),
            "test": {c: {metric: v} for c, v in zip(CLIENTS, values)}}  # fmt: skip


def retro_history(offset=0.0, rounds=3, epochs=2):
    rows = []
    for rnd in range(1, rounds + 1):
        for e in range(epochs + 1):
            rows.append(
                {
                    "round": rnd,
                    "client": "C",
                    "split": "test_local",
                    "metric": "accuracy",
                    "value": 0.5 + 0.03 * rnd + 0.01 * e + offset,
                    "epoch": e,
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


def legends(fig):
    """The axes' legends and the figure's own (a long legend goes below the axes)."""
    return [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)


def labelled_lines(ax):
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def error_bars(ax):
    return [c for c in ax.containers if isinstance(c, ErrorbarContainer)]


def half_lengths(container):
    """Per bar of an ErrorbarContainer: (x, half length) from its vertical segments."""
    segments = container.lines[2][0].get_segments()
    return [(float(s[0][0]), float((s[1][1] - s[0][1]) / 2)) for s in segments]


# ------------------------------------------------------------------------------------------ ties


def _tie_figures(tmp_path):
    """Each line figure with FedAvg, FedNova equal to it to the last bit, and HarmoFL apart."""
    labels = {"fedavg": "FedAvg", "fednova": "FedNova", "harmofl": "HarmoFL"}
    same, other = ramp(), ramp(0.03)
    yield (
        "convergence",
        lambda: figures.convergence(
            {"fedavg": [same], "fednova": [same.copy()], "harmofl": [other]},
            "dice_paper",
            tmp_path / "conv",
            "T",
            labels=labels,
        ),
    )
    yield (
        "fairness_curves",
        lambda: fedlwr.fairness_curves(
            {"fedavg": [same], "fednova": [same.copy()], "harmofl": [other]},
            "dice_paper",
            tmp_path / "fc",
            "T",
            labels=labels,
        ),
    )
    yield (
        "retrogress",
        lambda: prrfl.retrogress_figure(
            {"fedavg": [retro_history()], "fednova": [retro_history()], "harmofl": [retro_history(0.1)]},
            "C",
            "accuracy",
            tmp_path / "rg",
            "T",
            labels=labels,
        ),
    )
    points = {
        "FedAvg": [(1.0, 80.0, 2.0, 3), (2.0, 78.0, 1.0, 3)],
        "FedNova": [(1.0, 80.0, 2.0, 3), (2.0, 78.0, 1.0, 3)],
        "HarmoFL": [(1.0, 85.0, 1.0, 3), (2.0, 84.0, 1.0, 3)],
    }
    yield (
        "sweep",
        lambda: sweeps.sweep_figure(points, tmp_path / "sw", "T", "local epochs", "accuracy (%)", error="clients_std"),
    )


@pytest.mark.parametrize("kind", ["convergence", "fairness_curves", "retrogress", "sweep"])
def test_identical_series_stay_visible_and_the_tie_is_named(drawn, tmp_path, kind):
    dict(_tie_figures(tmp_path))[kind]()
    fig = drawn[-1]
    for ax in [a for a in fig.axes if a.get_lines()]:
        lines = labelled_lines(ax)
        assert set(lines) == {"FedAvg", "FedNova (= FedAvg)", "HarmoFL"}  # the tie named once, HarmoFL not
        first, tied = lines["FedAvg"], lines["FedNova (= FedAvg)"]
        assert np.array_equal(first.get_ydata(), tied.get_ydata())  # one curve on top of the other
        # ... yet both show: another marker and dash, hollow markers above the first curve
        assert first.get_marker() != tied.get_marker() and first.get_linestyle() != tied.get_linestyle()
        assert tied.get_markerfacecolor() == "none" and tied.get_zorder() > first.get_zorder()
    legend_texts = [t.get_text() for legend in legends(fig) for t in legend.get_texts()]
    assert "FedNova (= FedAvg)" in legend_texts


def test_only_exact_ties_are_named():
    a = (np.arange(3.0), np.array([0.1, 0.2, 0.3]))
    b = (np.arange(3.0), np.array([0.1, 0.2, 0.3 + 1e-15]))  # not bit for bit: not a tie
    c = (np.arange(3.0), np.array([0.1, 0.2, 0.3]))
    styles = figures.series_styles({"a": a, "b": b, "c": c}, {"a": "A", "b": "B", "c": "C"})
    assert [styles[k][1] for k in "abc"] == ["A", "B", "C (= A)"]
    assert figures.find_ties({"x": np.array([np.nan, 1.0]), "y": np.array([np.nan, 1.0])}) == {"x": None, "y": "x"}


# ------------------------------------------------------------------------------------ bars at 0


def test_bar_charts_start_at_zero(drawn, tmp_path):
    finals = [
        final(run, s, [0.9 + 0.01 * s, 0.92, 0.95 - 0.01 * i])
        for i, run in enumerate(("fedavg", "fedlwr"))
        for s in range(2)
    ]
    fedlwr.fairness_bars(
        seed_summary(finals, "dice_paper", std_row=True), ["fedavg", "fedlwr"], tmp_path / "bars", "bars", "dice_paper"
    )
    oods = [ood_final(run, s, 0.8 + 0.02 * s, 0.9) for run in ("fedavg", "prrfl") for s in range(2)]
    prrfl.ood_figure(prrfl.ood_summary(oods, "OOD"), ["fedavg", "prrfl"], tmp_path / "ood", "ood")
    for fig in drawn:
        ax = fig.axes[0]
        heights = [p.get_height() for p in ax.patches]
        assert min(heights) > 75  # an autoscaled axis would start near the lowest bar
        assert ax.get_ylim()[0] == 0


# ------------------------------------------------------------------------ error bars and seeds


def _figures_with_spread(tmp_path, seeds):
    finals = [
        final(run, s, [0.8 + 0.01 * s + 0.01 * i, 0.85, 0.9])
        for i, run in enumerate(("fedavg", "fedlwr"))
        for s in range(seeds)
    ]
    yield (
        "fairness_bars",
        lambda: fedlwr.fairness_bars(
            seed_summary(finals, "dice_paper", std_row=True), ["fedavg", "fedlwr"], tmp_path / "bars", "b", "dice_paper"
        ),
    )
    oods = [ood_final(run, s, 0.8 + 0.02 * s, 0.9 - 0.01 * s) for run in ("fedavg", "prrfl") for s in range(seeds)]
    yield "ood", lambda: prrfl.ood_figure(prrfl.ood_summary(oods, "OOD"), ["fedavg", "prrfl"], tmp_path / "ood", "o")
    sweep_finals = finals + [final("fedavg-e2", s, [0.7 + 0.02 * s, 0.75, 0.8]) for s in range(seeds)]
    points = sweeps.sweep_points(sweep_finals, {"FedAvg": {"1": "fedavg", "2": "fedavg-e2"}}, "dice_paper", "seeds")
    yield "sweep", lambda: sweeps.sweep_figure(points, tmp_path / "sw", "s", "local epochs", "Dice (%)", error="seeds")


@pytest.mark.parametrize("kind", ["fairness_bars", "ood", "sweep"])
def test_no_error_bars_from_one_seed(drawn, tmp_path, kind):
    dict(_figures_with_spread(tmp_path, seeds=1))[kind]()
    ax = drawn[-1].axes[0]
    assert error_bars(ax) == []
    caps = [line for line in ax.get_lines() if line.get_marker() in ("_", "|")]
    assert caps == []
    # with two seeds the same figure has them (so the check above can fail)
    dict(_figures_with_spread(tmp_path, seeds=2))[kind]()
    assert error_bars(drawn[-1].axes[0])


def test_convergence_band_only_with_two_seeds(drawn, tmp_path):
    figures.convergence({"fedavg": [ramp()]}, "dice_paper", tmp_path / "one", "T")
    figures.convergence({"fedavg": [ramp(), ramp(0.02)]}, "dice_paper", tmp_path / "two", "T")
    one, two = (fig.axes[0] for fig in drawn)
    assert len(one.collections) == 0 and len(two.collections) == 1
    assert one.get_legend().get_title().get_text() == "1 seed"
    assert "mean of 2 seeds" in two.get_legend().get_title().get_text()


# ------------------------------------------------------------------- title and legend in image


def _texts(fig):
    """The figure's title, and per axes its title, axis labels and legend (those that show)."""
    artists = ([fig._suptitle] if fig._suptitle else []) + list(fig.legends)
    for ax in fig.axes:
        artists += [ax.title, ax.xaxis.label, ax.yaxis.label] + ([ax.get_legend()] if ax.get_legend() else [])
    return [a for a in artists if a.get_visible() and not (isinstance(a, matplotlib.text.Text) and not a.get_text())]


@pytest.fixture
def saves(monkeypatch):
    """Per PNG saved: (path, the image's box in pixels, [(artist, its box)]) as drawn *during* the
    save: with bbox_inches="tight" the figure's bbox is then the saved region, so a box inside it is
    inside the image."""
    records = []
    original = Figure.savefig

    def savefig(fig, fname, *args, **kwargs):
        seen = []

        def on_draw(event):
            seen.append(
                (Bbox(fig.bbox.get_points().copy()), [(a, a.get_window_extent(event.renderer)) for a in _texts(fig)])
            )

        cid = fig.canvas.mpl_connect("draw_event", on_draw)
        try:
            return original(fig, fname, *args, **kwargs)
        finally:
            fig.canvas.mpl_disconnect(cid)
            if kwargs.get("format", str(fname).rsplit(".", 1)[-1]) == "png":
                records.append((fname, *seen[-1]))

    monkeypatch.setattr(Figure, "savefig", savefig)
    return records


def _inside_saved_image(record, png):
    """Every text box lies inside the saved image ``png``; the image is the box recorded (its size
    in pixels is the PNG's)."""
    _, image, boxes = record
    height, width = matplotlib.image.imread(png).shape[:2]
    assert abs(image.width - width) <= 1 and abs(image.height - height) <= 1  # (Agg truncates)
    for artist, box in boxes:
        assert (
            image.x0 - 1 <= box.x0 and box.x1 <= image.x1 + 1 and image.y0 - 1 <= box.y0 and box.y1 <= image.y1 + 1
        ), (artist, box, image)
    return len(boxes)


def test_title_and_an_outside_legend_stay_inside_the_saved_image(drawn, saves, tmp_path):
    runs = {f"m{i}": [ramp(0.01 * i)] for i in range(8)}  # > 6 entries: the legend goes outside
    figures.convergence(
        runs, "dice_paper", tmp_path / "conv", LONG_TITLE, labels={r: f"A method with a long name {r}" for r in runs}
    )
    fig = drawn[-1]
    (record,) = saves
    (legend,), ax = legends(fig), fig.axes[0]
    assert legend.get_window_extent().y1 < ax.get_window_extent().y0  # below the axes, covering no curve
    assert _inside_saved_image(record, tmp_path / "conv.png") == 4  # title, 2 axis labels, legend
    # the title is wrapped to the figure's width, so it is inside the canvas too
    assert "\n" in fig._suptitle.get_text()
    assert fig._suptitle.get_window_extent().width <= fig.bbox.width


@pytest.mark.parametrize("kind", ["fairness_bars", "fairness_curves", "ood", "retrogress", "sweep", "layer_cka"])
def test_every_figure_keeps_its_texts_inside_the_saved_image(drawn, saves, tmp_path, kind):
    runs = [f"m{i}" for i in range(10)]
    finals = [final(run, 0, [0.8 + 0.01 * i, 0.85, 0.9]) for i, run in enumerate(runs)]
    summary = seed_summary(finals, "dice_paper", std_row=True)
    oods = [ood_final(run, 0, 0.8, 0.9) for run in runs]
    draw = {
        "fairness_bars": lambda: fedlwr.fairness_bars(summary, runs, tmp_path / "f", LONG_TITLE, "dice_paper"),
        "fairness_curves": lambda: fedlwr.fairness_curves(
            {r: [ramp(0.01 * i)] for i, r in enumerate(runs)}, "dice_paper", tmp_path / "f", LONG_TITLE
        ),
        "ood": lambda: prrfl.ood_figure(prrfl.ood_summary(oods, "OOD"), runs, tmp_path / "f", LONG_TITLE),
        "retrogress": lambda: prrfl.retrogress_figure(
            {r: [retro_history(0.01 * i)] for i, r in enumerate(runs)}, "C", "accuracy", tmp_path / "f", LONG_TITLE
        ),
        "sweep": lambda: sweeps.sweep_figure(
            {r: [(1.0, 80.0 + i, 1.0, 1), (2.0, 79.0 + i, 1.0, 1)] for i, r in enumerate(runs)},
            tmp_path / "f",
            LONG_TITLE,
            "x",
            "y",
            error="clients_std",
        ),
        "layer_cka": lambda: fedlwr.layer_cka_figure(_cka_history(), tmp_path / "f", LONG_TITLE),
    }[kind]
    draw()
    (record,) = saves
    assert _inside_saved_image(record, tmp_path / "f.png") >= 3


def _cka_history():
    rows = []
    for rnd in (1, 2):
        for client in CLIENTS:
            for i, layer in enumerate(("enc.0", "enc.1", "head")):
                rows.append(
                    {
                        "round": rnd,
                        "client": client,
                        "split": "server",
                        "metric": f"cka:{layer}",
                        "value": 0.9 - 0.1 * i,
                    }
                )
    return pd.DataFrame(rows)


def test_pdf_is_reproducible(tmp_path):
    for name in ("a", "b"):
        figures.convergence({"fedavg": [ramp()], "fednova": [ramp()]}, "dice_paper", tmp_path / name, LONG_TITLE)
    pdf = (tmp_path / "a.pdf").read_bytes()
    assert pdf == (tmp_path / "b.pdf").read_bytes() and b"CreationDate" not in pdf


# ------------------------------------------------------------------------------- metric words


def test_every_metric_key_has_words():
    metrics = pytest.importorskip("fedmedbench.metrics")
    for key in list(metrics.METRIC_DESCRIPTIONS) + ["dice_region1", "dice_region2", "dice_region3"]:
        words = metric_label(key)
        assert "_" not in words and (words != key or key.isalpha()), key  # accuracy, loss: words already
    assert metric_label("dice_paper") == METRIC_LABELS["dice_paper"] and metric_label("my_score") == "my score"


def _all_text(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(matplotlib.text.Text))


def test_axes_name_metrics_in_words(drawn, tmp_path, capsys):
    figures.convergence({"fedavg": [ramp()]}, "dice_paper", tmp_path / "c", "T")
    fedlwr.fairness_curves({"fedavg": [ramp()]}, "dice_paper", tmp_path / "fc", "T")
    finals = [final("fedavg", 0, [0.8, 0.85, 0.9]), final("fedavg-e2", 0, [0.7, 0.8, 0.9])]
    fedlwr.fairness_bars(
        seed_summary(finals[:1], "dice_paper", std_row=True), ["fedavg"], tmp_path / "fb", "T", "dice_paper"
    )
    prrfl.retrogress_figure({"fedavg": [retro_history()]}, "C", "accuracy", tmp_path / "rg", "T")
    # the sweep's axis label comes from the CLI, as the workflow calls it
    paths = []
    for f in finals:  # final.json as fedmedbench train writes it
        selection = {"split": "val", "metric": "dice_paper", "per_client": False, "best_round": 1, "rounds": 1}
        paths.append(tmp_path / "train" / "t" / f["run"] / "seed0" / "final.json")
        paths[-1].parent.mkdir(parents=True)
        write_final(paths[-1], {**f, "task": "t", "selection": selection, "val": f["test"], "config": {"rounds": 1}})
    experiment = {
        "kind": "sweep",
        "title": "T",
        "seeds": [0],
        "task": "t",
        "metric": "dice_paper",
        "series": {"FedAvg": {"1": "fedavg", "2": "fedavg-e2"}},
        "x_label": "local epochs",
        "error": "clients_std",
    }
    assert (
        cli.main(
            [
                "sweep-figure",
                "--experiment",
                json.dumps(experiment),
                "--out-prefix",
                str(tmp_path / "sw"),
                *map(str, paths),
            ]
        )
        == 0
    )
    assert len(drawn) == 5
    for fig in drawn:
        assert "dice_paper" not in _all_text(fig)
    assert "Dice (incl. background)" in drawn[0].axes[0].get_ylabel()
    assert "accuracy" in drawn[3].axes[0].get_ylabel()
    assert "Dice (incl. background)" in drawn[4].axes[0].get_ylabel()


# ----------------------------------------------------------------- error bars = tables' numbers


def test_fairness_bars_error_bars_and_legend_are_the_tables_numbers(drawn, tmp_path):
    finals = [
        final(run, s, [0.80 + 0.013 * s * (k + 1) + 0.02 * i for k in range(3)])
        for i, run in enumerate(("fedavg", "fedlwr"))
        for s in range(3)
    ]
    summary = seed_summary(finals, "dice_paper", std_row=True)
    fedlwr.fairness_bars(summary, ["fedavg", "fedlwr"], tmp_path / "b", "b", "dice_paper")
    ax = drawn[-1].axes[0]
    containers = error_bars(ax)
    assert len(containers) == 2
    for run, container in zip(("fedavg", "fedlwr"), containers):
        table = summary[summary["run"] == run].set_index("client_label")
        assert [h for _, h in half_lengths(container)] == pytest.approx(
            table.loc[list(CLIENTS), "std"].tolist(), rel=1e-9
        )
        legend = [
            t.get_text()
            for t in ax.get_legend().get_texts()
            if t.get_text().startswith({"fedavg": "fedavg", "fedlwr": "fedlwr"}[run])
        ][0]
        assert f"Std {table.loc[STD, 'mean']:.2f}" in legend and f"Avg {table.loc[AVG, 'mean']:.1f}" in legend


def test_fairness_curves_std_is_the_tables_std_row(drawn, tmp_path):
    seeds = [history([[0.5, 0.7, 0.6], [0.9, 0.6, 0.8]]), history([[0.55, 0.65, 0.7], [0.8, 0.7, 0.9]])]
    fedlwr.fairness_curves({"fedlwr": seeds}, "dice_paper", tmp_path / "fc", "T")
    ax_avg, ax_std = drawn[-1].axes
    for rnd, values in ((1, ([0.5, 0.7, 0.6], [0.55, 0.65, 0.7])), (2, ([0.9, 0.6, 0.8], [0.8, 0.7, 0.9]))):
        table = seed_summary(
            [final("fedlwr", s, v) for s, v in enumerate(values)], "dice_paper", std_row=True
        ).set_index("client_label")
        std_line, avg_line = ax_std.get_lines()[0], ax_avg.get_lines()[0]
        assert std_line.get_ydata()[rnd - 1] == pytest.approx(table.loc[STD, "mean"], rel=1e-12)
        assert avg_line.get_ydata()[rnd - 1] == pytest.approx(table.loc[AVG, "mean"], rel=1e-12)


@pytest.mark.parametrize("error", ["clients_std", "clients_sem", "seeds"])
def test_sweep_error_bars_are_the_tables_numbers(drawn, tmp_path, error):
    finals = [
        final(run, s, [0.7 + 0.03 * s + 0.05 * k * (i + 1) for k in range(3)])
        for i, run in enumerate(("fedavg", "fedavg-e2"))
        for s in range(3)
    ]
    points = sweeps.sweep_points(finals, {"FedAvg": {"1": "fedavg", "2": "fedavg-e2"}}, "dice_paper", error)
    sweeps.sweep_figure(points, tmp_path / "sw", "T", "local epochs", "y", error=error)
    ax = drawn[-1].axes[0]
    (container,) = error_bars(ax)
    for (x, half), run in zip(half_lengths(container), ("fedavg", "fedavg-e2")):
        runs = [f for f in finals if f["run"] == run]
        table = seed_summary(runs, "dice_paper").set_index("client_label")
        expected = {
            "clients_std": table.loc[AVG, "std"],  # the table's Avg parenthesis
            "clients_sem": table.loc[AVG, "std"] / math.sqrt(len(CLIENTS)),
            "seeds": np.std(
                [seed_summary([f], "dice_paper").set_index("client_label").loc[AVG, "mean"] for f in runs], ddof=1
            ),
        }[error]
        assert half == pytest.approx(expected, rel=1e-9)
        point = [p for p in points["FedAvg"] if p[0] == x][0]
        assert point[1] == pytest.approx(table.loc[AVG, "mean"], rel=1e-12)  # the point is the table's Avg


def test_ood_error_bars_are_the_tables_numbers(drawn, tmp_path):
    oods = [
        ood_final(run, s, 0.6 + 0.05 * s * (i + 1), 0.8 + 0.02 * s)
        for i, run in enumerate(("fedavg", "prrfl"))
        for s in range(3)
    ]
    summary = prrfl.ood_summary(oods, "OOD")
    prrfl.ood_figure(summary, ["fedavg", "prrfl"], tmp_path / "ood", "o")
    containers = error_bars(drawn[-1].axes[0])
    assert len(containers) == len(prrfl.ood_columns())
    for column, container in zip(prrfl.ood_columns(), containers):
        cells = summary[summary["client_label"] == column].set_index("run")
        assert [h for _, h in half_lengths(container)] == pytest.approx(
            cells.loc[["fedavg", "prrfl"], "std"].tolist(), rel=1e-9
        )


# ------------------------------------------------------------------------------ ten methods


def test_ten_methods_get_ten_palette_colours_and_markers(drawn, tmp_path):
    runs = {f"m{i}": [ramp(0.01 * i)] for i in range(10)}
    figures.convergence(runs, "dice_paper", tmp_path / "conv", "T")
    lines = list(labelled_lines(drawn[-1].axes[0]).values())
    assert len(lines) == 10
    colours = [matplotlib.colors.to_hex(line.get_color()) for line in lines]
    assert len(set(colours)) == 10 and {c.upper() for c in colours} <= {c.upper() for c in figures.PALETTE}
    assert len({line.get_marker() for line in lines}) == 10
    # past ten the colours repeat, each with another marker: twenty methods, twenty pairs
    assert len({(figures.method_style(i)["color"], figures.method_style(i)["marker"]) for i in range(20)}) == 20
    # bars: ten palette colours, each with its own hatch
    finals = [final(run, 0, [0.8, 0.85, 0.9]) for run in runs]
    fedlwr.fairness_bars(
        seed_summary(finals, "dice_paper", std_row=True), list(runs), tmp_path / "b", "b", "dice_paper"
    )
    ax = drawn[-1].axes[0]
    firsts = [container.patches[0] for container in ax.containers if not isinstance(container, ErrorbarContainer)]
    assert len(firsts) == 10
    pairs = {(matplotlib.colors.to_hex(p.get_facecolor()).upper(), p.get_hatch()) for p in firsts}
    assert len(pairs) == 10 and {c for c, _ in pairs} <= {c.upper() for c in figures.PALETTE}
    assert len({c for c, _ in pairs}) == 10


def test_palette_is_told_apart_under_colour_blindness():
    """The ten colours stay apart for a deuteranope and a protanope (Machado et al. 2009, severity 1,
    on linear RGB), and none is white on white: min distance in sRGB > 0.1."""
    machado = {
        "protan": np.array(
            [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]
        ),
        "deutan": np.array(
            [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]]
        ),
    }
    rgb = np.array([matplotlib.colors.to_rgb(c) for c in figures.PALETTE])
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    for matrix in machado.values():
        seen = np.clip(linear @ matrix.T, 0, 1)
        seen = np.where(seen <= 0.0031308, 12.92 * seen, 1.055 * seen ** (1 / 2.4) - 0.055)
        distances = [np.linalg.norm(seen[i] - seen[j]) for i in range(10) for j in range(i + 1, 10)]
        assert min(distances) > 0.1
    assert (rgb.sum(axis=1) < 2.7).all()  # no near-white line on the white axes
