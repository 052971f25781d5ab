"""Hyperparameter sweeps as line plots (HarmoFL Fig. 5b local epochs, Fig. 5c perturbation radius)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedmedbench.report.figures import plt, save_figure


def sweep_points(finals: list[dict], series: dict[str, dict], metric: str, error: str, split: str = "test") -> dict[str, list[tuple]]:
    """Per series, (x, mean, error) points. The mean is over clients and seeds; the error is the
    std over seeds of the client mean (``seeds``) or the standard error across clients of the
    seed-averaged scores (``clients_sem``, as HarmoFL's Fig. 5c)."""
    by_run: dict[str, list[dict]] = {}
    for final in finals:
        by_run.setdefault(final["run"], []).append(final)
    points = {}
    for name, runs in series.items():
        points[name] = []
        for x, run in runs.items():
            if run not in by_run:
                raise ValueError(f"sweep series {name!r}: no results for run {run!r}")
            # seeds x clients
            scores = np.array([[f[split][c][metric] for c in f["clients"]] for f in by_run[run]]) * 100
            mean = scores.mean()
            if error == "seeds":
                err = scores.mean(axis=1).std(ddof=1) if len(scores) > 1 else np.nan
            elif error == "clients_sem":
                per_client = scores.mean(axis=0)
                err = per_client.std(ddof=1) / np.sqrt(len(per_client))
            else:
                raise ValueError(f"unknown sweep error {error!r}; expected 'seeds' or 'clients_sem'")
            points[name].append((float(x), float(mean), float(err)))
    return points


def sweep_figure(points: dict[str, list[tuple]], out_prefix: Path, title: str, x_label: str, y_label: str, log_x: bool = False) -> list[Path]:
    fig, ax = plt.subplots(figsize=(5.5, 3.8), layout="constrained")
    for name, pts in points.items():
        x, y, err = (np.array(v) for v in zip(*pts))
        ax.errorbar(x, y, yerr=np.where(np.isfinite(err), err, 0), marker="o", capsize=3, label=name)
    if log_x:
        ax.set_xscale("log")
    xs = sorted({p[0] for pts in points.values() for p in pts})
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(fig, out_prefix)
