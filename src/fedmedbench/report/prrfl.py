"""PRR-FL's Table 3 (the out-of-distribution cohort) and Fig. 1 (the retrogress curve).

Table 3: a run's ``final.json["ood"][cohort]`` holds the cohort's scores under two rules (see
``fl.engine.ood_test``): ``mean`` = the mean over the clients' selected models of each model's scores
(the rule the comparison with the paper uses), ``ensemble`` = the scores of their averaged softmax
probabilities. Cells are mean (std) over seeds, in percent.

Fig. 1: history rows of split ``test_local`` (runs with ``local_epoch_curve: true``): one client's test
metric right after receiving the server's package (epoch 0) and after every local epoch, drawn
against the cumulative local epoch, so a drop at a communication shows as a vertical step.

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.report.figures import plt, save_figure
from fedmedbench.report.tables import SUMMARY_COLUMNS, ReportInputError

OOD_SCORINGS = {"mean": "", "ensemble": " (ensemble)"}
OOD_METRICS = {"f1_macro": "F1", "auc_macro": "AUC"}


def ood_summary(finals: list[dict], cohort: str, metrics: dict[str, str] = OOD_METRICS, scorings: dict[str, str] = OOD_SCORINGS) -> pd.DataFrame:
    """A table summary in ``tables.seed_summary``'s layout, one "client" column per (scoring, metric):
    ``F1``, ``AUC`` (mean of the models), ``F1 (ensemble)``, ``AUC (ensemble)``."""
    values: dict[tuple[str, str], list[float]] = {}
    methods: dict[str, str] = {}
    for final in finals:
        run = final.get("run") or final.get("method")
        ood = (final.get("ood") or {}).get(cohort)
        if ood is None:
            raise ReportInputError(f"run {run!r}, seed {final.get('seed')!r}: final.json has no OOD scores for cohort {cohort!r} (run config ood_clients)")
        methods[run] = final.get("method", run)
        for scoring, suffix in scorings.items():
            for metric, name in metrics.items():
                values.setdefault((run, name + suffix), []).append(100.0 * float(ood[scoring][metric]))
    rows = []
    for (run, label), vals in values.items():
        std = float(np.std(vals, ddof=1)) if len(vals) > 1 else math.nan
        rows.append(dict(run=run, method=methods[run], client=label, client_label=label, mean=float(np.mean(vals)), std=std, n_seeds=len(vals)))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def ood_columns(metrics: dict[str, str] = OOD_METRICS, scorings: dict[str, str] = OOD_SCORINGS) -> list[str]:
    return [name + suffix for suffix in scorings.values() for name in metrics.values()]


def ood_comparison_summary(summary: pd.DataFrame, label: str, cohort_label: str = "OOD") -> pd.DataFrame:
    """The summary's column ``label`` renamed to the paper's client label (``OOD``), for ``compare``."""
    sub = summary[summary["client_label"] == label].copy()
    sub["client"] = sub["client_label"] = cohort_label
    return sub


def ood_figure(summary: pd.DataFrame, runs: list[str], out_prefix: Path, title: str, labels: dict | None = None) -> list[Path]:
    """Bars per method: OOD F1 and AUC, mean of the clients' models (solid) and ensemble (hatched)."""
    labels = labels or {}
    columns = ood_columns()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(runs) + 2), 3.8))
    width = 0.8 / len(columns)
    x = np.arange(len(runs))
    for j, column in enumerate(columns):
        cells = summary[summary["client_label"] == column].set_index("run")
        means = [cells.loc[r, "mean"] if r in cells.index else np.nan for r in runs]
        stds = [cells.loc[r, "std"] if r in cells.index else np.nan for r in runs]
        ax.bar(x + (j - (len(columns) - 1) / 2) * width, means, width, yerr=np.nan_to_num(stds), label=column, hatch="//" if "ensemble" in column else None, color=f"C{j % 2}", alpha=0.6 if "ensemble" in column else 1.0)
    ax.set_xticks(x, [labels.get(r, r) for r in runs], rotation=20, ha="right")
    ax.set_ylabel("OOD cohort score (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return save_figure(fig, out_prefix)


def local_epoch_curve(history: pd.DataFrame, client: str, metric: str) -> pd.Series:
    """``metric`` of ``client`` on its test split, indexed by the cumulative local epoch
    ``(round - 1) * E + epoch`` (epoch 0 of round r + 1 sits where epoch E of round r ends)."""
    if "epoch" not in history.columns:
        raise ValueError("history.csv has no 'epoch' column: train with local_epoch_curve: true")
    sel = history[(history["split"] == "test_local") & (history["client"] == client) & (history["metric"] == metric)]
    if sel.empty:
        raise ValueError(f"history has no test_local rows of client {client!r} and metric {metric!r}")
    epochs = int(sel["epoch"].max())
    sel = sel.sort_values(["round", "epoch"])
    x = (sel["round"].astype(int) - 1) * epochs + sel["epoch"].astype(int)
    return pd.Series(pd.to_numeric(sel["value"]).to_numpy(), index=x.to_numpy())


def retrogress_figure(histories: dict[str, list[pd.DataFrame]], client: str, metric: str, out_prefix: Path, title: str, labels: dict | None = None) -> list[Path]:
    """PRR-FL Fig. 1: per run the mean over seeds of ``local_epoch_curve`` (percent); dotted lines
    mark the communications."""
    labels = labels or {}
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    period = None
    for i, (run, frames) in enumerate(histories.items()):
        if not frames:
            continue
        curves = [local_epoch_curve(h, client, metric) for h in frames]
        # Each x holds two points at a communication (end of a round, start of the next): keep the order.
        x = curves[0].index.to_numpy()
        y = 100.0 * np.mean([c.to_numpy() for c in curves], axis=0)
        ax.plot(x, y, marker=".", markersize=3, linewidth=1.2, color=f"C{i}", label=labels.get(run, run))
        period = int(frames[0].loc[frames[0]["split"] == "test_local", "epoch"].max())
    if period:
        for comm in range(period, int(ax.get_xlim()[1]) + 1, period):
            ax.axvline(comm, color="0.8", linestyle=":", linewidth=0.8, zorder=0)
    ax.set_xlabel("local epoch (dotted: communication)")
    ax.set_ylabel(f"client {client} test {metric} (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_prefix)
