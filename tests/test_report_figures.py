"""Sweep points (Fig. 5b/5c) by hand, and the qualitative figure from saved predictions."""

import numpy as np
import pytest

from fedmedbench.report.qualitative import load_rows, overlay, qualitative_figure
from fedmedbench.report.sweeps import sweep_figure, sweep_points


def final(run, seed, scores):
    return {"run": run, "seed": seed, "clients": ["A", "B"], "test": {c: {"accuracy": s} for c, s in zip("AB", scores)}}


FINALS = [
    final("fedavg", 0, [0.8, 0.6]),
    final("fedavg", 1, [0.9, 0.7]),
    final("fedavg-e2", 0, [0.5, 0.5]),
    final("fedavg-e2", 1, [0.7, 0.5]),
]


def test_sweep_points_mean_and_errors_by_hand():
    series = {"FedAvg": {"1": "fedavg", "2": "fedavg-e2"}}
    seeds = sweep_points(FINALS, series, "accuracy", "seeds")["FedAvg"]
    # e1: client means per seed 70, 80 -> mean 75, std(ddof=1) 7.0711
    assert seeds[0][0] == 1.0 and seeds[0][1] == pytest.approx(75.0) and seeds[0][2] == pytest.approx(np.sqrt(50))
    clients = sweep_points(FINALS, series, "accuracy", "clients_sem")["FedAvg"]
    # e2: per-client means over seeds 60, 50 -> std 7.0711 / sqrt(2) = 5
    assert clients[1][1] == pytest.approx(55.0) and clients[1][2] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="no results for run 'fedavg-e4'"):
        sweep_points(FINALS, {"FedAvg": {"4": "fedavg-e4"}}, "accuracy", "seeds")


def test_sweep_figure_is_written(tmp_path):
    points = sweep_points(FINALS, {"FedAvg": {"1": "fedavg", "2": "fedavg-e2"}}, "accuracy", "seeds")
    written = sweep_figure(points, tmp_path / "fig5b", "Fig. 5b", "local epochs", "accuracy (%)")
    assert [p.suffix for p in written] == [".png", ".pdf", ".csv"] and all(p.stat().st_size > 1000 for p in written[:2])
    assert b"CreationDate" not in written[1].read_bytes()  # re-running the rule gives the same PDF


def test_overlay_tints_only_the_mask():
    image = np.full((4, 4, 3), 100, np.uint8)
    mask = np.zeros((4, 4), np.uint8)
    mask[0, 0] = 1
    out = overlay(image, mask)
    assert out[1, 1].tolist() == pytest.approx([100 / 255] * 3)
    assert out[0, 0, 0] > out[0, 0, 1]  # reddish
    slices = np.stack([np.zeros((4, 4)), np.full((4, 4), 255), np.zeros((4, 4))], -1).astype(np.uint8)
    assert overlay(slices, np.zeros((4, 4)), centre_slice=True)[2, 2].tolist() == [1.0, 1.0, 1.0]


def test_qualitative_rows_and_figure(tmp_path):
    files = {}
    for run, value in (("fedavg", 0), ("harmofl", 1)):
        arrays = {
            f"{c}|{k}": np.full((2, 8, 8) + ((3,) if k == "image" else ()), value if k == "pred" else 1, np.uint8)
            for c in ("X", "Y")
            for k in ("image", "label", "pred")
        }
        files[run] = tmp_path / f"{run}.npz"
        np.savez(files[run], **arrays)
    rows = load_rows(files, "prostate", ["Y"], per_client=2)
    assert len(rows) == 2 and rows[0]["label"] == "prostate / Y"
    assert rows[0]["preds"]["fedavg"].max() == 0 and rows[0]["preds"]["harmofl"].min() == 1
    written = qualitative_figure(rows, [("fedavg", "FedAvg"), ("harmofl", "HarmoFL")], tmp_path / "fig4", "Fig. 4")
    assert [p.suffix for p in written] == [".png", ".pdf", ".csv"] and all(p.stat().st_size > 1000 for p in written[:2])
