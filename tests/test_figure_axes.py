"""Line plots start at the metric's floor (a zoomed axis from 48 % made a dip look like a collapse),
legends sit outside the data (the 4-method prostate convergence figure's legend covered a curve), and
the qualitative panels name their score as the tables do ("foreground Dice"). Read back from the
drawn figure objects."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedmedbench.report import fedlwr, figures, prrfl, qualitative, sweeps

CLIENTS = ("A", "B", "C")


@pytest.fixture
def drawn(monkeypatch):
    """Figures stay open after saving (``save_figure`` closes them); closed at the end."""
    close = figures.plt.close
    kept = []
    monkeypatch.setattr(figures.plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for fig in kept:
        close(fig)


def history(offset, rounds=5, metric="dice_paper"):
    """Scores 0.48-0.60 (the range whose axis used to start at 48 %)."""
    return pd.DataFrame([{"round": r, "client": c, "split": s, "metric": metric, "value": 0.48 + 0.02 * r + offset + 0.01 * k}
                         for r in range(1, rounds + 1) for k, c in enumerate(CLIENTS) for s in ("test", "val")])  # fmt: skip


def outside(fig, ax, legend) -> bool:
    """The legend's box does not meet the axes' box (it lies right of or below them)."""
    fig.canvas.draw()
    box, area = legend.get_window_extent(), ax.get_window_extent()
    return box.x0 >= area.x1 or box.y1 <= area.y0


def test_convergence_starts_at_zero_and_its_legend_covers_no_curve(drawn, tmp_path):
    runs = {m: [history(0.01 * i)] for i, m in enumerate(("fedavg", "fedprox", "fedbn", "harmofl"))}
    figures.convergence(runs, "dice_paper", tmp_path / "conv", "T")
    fig = drawn[-1]
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0.0  # was about 48 (auto-scaled to the data)
    assert 62.0 <= ax.get_ylim()[1] < 70.0  # the top stays the data's (curves up to 62 %)
    legend = ax.get_legend()
    assert legend is not None and len(legend.get_texts()) == 4
    assert outside(fig, ax, legend)


def test_a_loss_curve_keeps_its_own_scale(drawn, tmp_path):
    runs = {"fedavg": [history(1.0, metric="loss")]}  # loss 1.50-1.62: unbounded, no floor imposed
    figures.convergence(runs, "loss", tmp_path / "loss", "T", percent=False)
    assert drawn[-1].axes[0].get_ylim()[0] > 1.0


def test_fig5c_sweep_starts_at_zero(drawn, tmp_path):
    points = {"HarmoFL": [(0.05, 48.0, 1.0), (0.1, 55.0, 1.0), (0.2, 60.0, 1.0)]}
    sweeps.sweep_figure(points, tmp_path / "s", "T", "radius", "Dice (%)", error="clients_sem")
    fig = drawn[-1]
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0.0
    assert outside(fig, ax, ax.get_legend())


def test_fairness_curves_and_cka_start_at_their_floor(drawn, tmp_path):
    fedlwr.fairness_curves({"fedavg": [history(0.0)], "fedlwr": [history(0.02)]}, "dice_paper", tmp_path / "f", "T")
    fig = drawn[-1]
    ax_avg, ax_std = fig.axes[:2]
    assert ax_avg.get_ylim()[0] == 0.0 and ax_std.get_ylim()[0] == 0.0
    assert outside(fig, ax_std, ax_std.get_legend())
    rows = [{"round": 1, "client": c, "split": "server", "metric": f"cka:{layer}", "value": 0.8 + 0.05 * i}
            for c in CLIENTS for i, layer in enumerate(("enc.0", "enc.1", "head"))]  # fmt: skip
    fedlwr.layer_cka_figure(pd.DataFrame(rows), tmp_path / "cka", "T")
    assert drawn[-1].axes[0].get_ylim()[0] == 0.0  # CKA 0.80-0.90: from 0


def test_retrogress_starts_at_zero(drawn, tmp_path):
    rows = [{"round": r, "client": "C", "split": "test_local", "metric": "accuracy", "value": 0.5 + 0.03 * r + 0.01 * e, "epoch": e}
            for r in (1, 2, 3) for e in (0, 1, 2)]  # fmt: skip
    prrfl.retrogress_figure({"fedavg": [pd.DataFrame(rows)]}, "C", "accuracy", tmp_path / "r", "T")
    fig = drawn[-1]
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0.0
    assert outside(fig, ax, ax.get_legend())


def test_qualitative_panels_say_foreground_dice(drawn, tmp_path):
    truth = np.zeros((8, 8), np.uint8)
    truth[2:6, 2:6] = 1
    pred = np.zeros((8, 8), np.uint8)
    pred[2:6, 2:4] = 1  # Dice 2*8/(16+8) = 66.7 % of the foreground
    row = {"label": "prostate / HK", "image": np.zeros((8, 8, 3), np.uint8), "truth": truth, "preds": {"fedavg": pred}}
    qualitative.qualitative_figure([row], [("fedavg", "FedAvg")], tmp_path / "q", "T")
    assert drawn[-1].axes[2].get_xlabel() == "foreground Dice 66.7 %"
