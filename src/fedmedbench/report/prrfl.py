"""PRR-FL's Table 3 (the out-of-distribution cohort) and Fig. 1 (the retrogress curve).

Table 3: a run's ``final.json["ood"][cohort]`` holds the cohort's scores under two rules (see
``fl.evaluation.ood_test``): ``mean`` = the mean over the clients' selected models of each model's scores
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

from fedmedbench.report.figures import (
    PALETTE,
    SourceData,
    clip_band,
    contrast_colour,
    draw_error_bars,
    error_shown,
    finish,
    mark_every,
    place_legend,
    plt,
    series_styles,
    set_title,
    style_key,
    y_from_floor,
)
from fedmedbench.report.flags import KINDS, MARKS, MEANING, Flags
from fedmedbench.report.metric_names import metric_label
from fedmedbench.report.tables import SUMMARY_COLUMNS, ReportInputError

OOD_SCORINGS = {"mean": "", "ensemble": " (ensemble)"}
OOD_METRICS = {"f1_macro": "F1", "auc_macro": "AUC"}


def ood_summary(
    finals: list[dict], cohort: str, metrics: dict[str, str] = OOD_METRICS, scorings: dict[str, str] = OOD_SCORINGS
) -> pd.DataFrame:
    """A table summary in ``tables.seed_summary``'s layout, one "client" column per (scoring, metric):
    ``F1``, ``AUC`` (mean of the models), ``F1 (ensemble)``, ``AUC (ensemble)``."""
    values: dict[tuple[str, str], list[float]] = {}
    methods: dict[str, str] = {}
    for final in finals:
        run = final.get("run") or final.get("method")
        ood = (final.get("ood") or {}).get(cohort)
        if ood is None:
            raise ReportInputError(
                f"run {run!r}, seed {final.get('seed')!r}: final.json has no OOD scores for cohort {cohort!r} (run config ood_clients)"
            )
        methods[run] = final.get("method", run)
        for scoring, suffix in scorings.items():
            for metric, name in metrics.items():
                values.setdefault((run, name + suffix), []).append(100.0 * float(ood[scoring][metric]))
    rows = []
    for (run, label), vals in values.items():
        std = float(np.std(vals, ddof=1)) if len(vals) > 1 else math.nan
        rows.append(
            dict(
                run=run,
                method=methods[run],
                client=label,
                client_label=label,
                mean=float(np.mean(vals)),
                std=std,
                n_seeds=len(vals),
            )
        )
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def ood_flags(
    finals: list[dict],
    cohort: str,
    names: dict | None = None,
    prefix: str = "",
    metrics: dict[str, str] = OOD_METRICS,
    scorings: dict[str, str] = OOD_SCORINGS,
) -> Flags:
    """The flags of the cohort's cells (``report.flags.Flags``, keyed by (run, ``prefix`` + column)):
    an ``(ensemble)`` column carries the ensemble's flags, a mean-of-the-models column those of every
    client's model it averages (``ood.<cohort>.flags``, ``fl.evaluation.score_cohort``)."""
    names = names or {}
    out: Flags = {}
    for final in finals:
        run = str(final.get("run") or final.get("method"))
        flags = ((final.get("ood") or {}).get(cohort) or {}).get("flags") or {}
        where = f"{names.get(run, run)}, cohort {cohort}, seed {final.get('seed')}"
        found = {"ensemble": {k: f"the ensemble {why}" for k, why in (flags.get("ensemble") or {}).items()}, "mean": {}}
        for client, kinds in (flags.get("per_model") or {}).items():
            for kind, why in kinds.items():
                found["mean"][kind] = "; ".join(
                    filter(None, [found["mean"].get(kind), f"client {client}'s model {why}"])
                )
        for scoring, suffix in scorings.items():
            for kind in KINDS:
                if kind not in found.get(scoring, {}):
                    continue
                what = "the mean of the models averages a flagged one: " if scoring == "mean" else ""
                entry = (kind, f"{where}: {what}{found[scoring][kind]} ({MEANING[kind]}).")
                for name in metrics.values():
                    cell = out.setdefault((run, prefix + name + suffix), [])
                    if entry not in cell:
                        cell.append(entry)
    return out


def ood_columns(metrics: dict[str, str] = OOD_METRICS, scorings: dict[str, str] = OOD_SCORINGS) -> list[str]:
    return [name + suffix for suffix in scorings.values() for name in metrics.values()]


def ood_comparison_summary(summary: pd.DataFrame, label: str, cohort_label: str = "OOD") -> pd.DataFrame:
    """The summary's column ``label`` renamed to the paper's client label (``OOD``), for ``compare``."""
    sub = summary[summary["client_label"] == label].copy()
    sub["client"] = sub["client_label"] = cohort_label
    return sub


PERCENT_RANGE = (0.0, 100.0)


def ood_figure(
    summary: pd.DataFrame,
    runs: list[str],
    out_prefix: Path,
    title: str,
    labels: dict | None = None,
    synthetic: bool = False,
    flags: Flags | None = None,
) -> list[Path]:
    """Bars per method: OOD F1 and AUC, mean of the clients' models (solid) and ensemble (hatched);
    error bars (std over seeds) clipped to 0-100 %. ``flags`` (:func:`ood_flags`): a bar whose score
    is a collapsed model's carries the table's mark above it, and its row of the CSV says which."""
    labels = labels or {}
    flags = flags or {}
    columns = ood_columns()
    source = SourceData(PERCENT_RANGE)
    clipped_any = False
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(runs) + 2), 3.8), layout="constrained")
    width = 0.8 / len(columns)
    x = np.arange(len(runs))
    for j, column in enumerate(columns):
        cells = summary[summary["client_label"] == column].set_index("run")
        cell = lambda key, cells=cells: np.array(
            [cells.loc[r, key] if r in cells.index else np.nan for r in runs], dtype=float
        )  # noqa: E731
        means = cell("mean")
        xj = x + (j - (len(columns) - 1) / 2) * width
        color = PALETTE[j % 2]  # F1 and AUC: the palette's first two colours; the ensemble hatched and lighter
        ensemble = "ensemble" in column
        ax.bar(
            xj,
            means,
            width,
            label=column,
            color=color,
            alpha=0.55 if ensemble else 1.0,
            hatch="//" if ensemble else None,
            hatchcolor=contrast_colour(color),
            edgecolor="none",
        )
        # the table's parenthesis (std over seeds); no bar for one seed
        std, seeds = cell("std"), cell("n_seeds")
        draw_error_bars(ax, xj, means, std, "0.1", n_seeds=seeds, capsize=2, bounds=PERCENT_RANGE)
        shown = error_shown(std, means, seeds)
        low, high, clipped = clip_band(means, std, PERCENT_RANGE)
        clipped_any |= bool(clipped and shown.any())
        key = style_key({"color": color, "hatch": "//" if ensemble else None})
        for k, run in enumerate(runs):
            marks = "".join(MARKS[kind] for kind in KINDS if any(kind == f for f, _ in flags.get((run, column), ())))
            if marks and np.isfinite(means[k]):  # the table's flag mark, above the bar
                ax.annotate(
                    marks,
                    (xj[k], means[k]),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="0.1",
                )
            why = "; ".join(text for kind, text in flags.get((run, column), ()) if kind == "collapsed")
            source.add(column, labels.get(run, run), means[k], kind="bar", low=low[k] if shown[k] else np.nan, high=high[k] if shown[k] else np.nan,
                       error="std over seeds", n=seeds[k], n_of="seeds", style=key, collapsed=why)  # fmt: skip
    ax.set_xticks(x, [labels.get(r, r) for r in runs], rotation=20, ha="right")
    ax.set_ylabel("OOD cohort score (%)")
    ax.set_ylim(bottom=0)  # bars start at 0: their heights compare
    set_title(fig, title, fontsize=9)
    n_seeds = int(summary["n_seeds"].max()) if len(summary) else 0
    clip = ", clipped to 0-100 %" if clipped_any else ""
    note = f"mean of {n_seeds} seeds; error bars: std over seeds{clip}" if n_seeds > 1 else "1 seed"
    if any(kind == "collapsed" for run in runs for column in columns for kind, _ in flags.get((run, column), ())):
        note += f"\n{MARKS['collapsed']}: collapsed model (one class for every cohort sample)"
    place_legend(ax, outside=True, fontsize=7, title=note, title_fontsize=7)
    return finish(fig, out_prefix, source, synthetic)


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


def retrogress_figure(
    histories: dict[str, list[pd.DataFrame]],
    client: str,
    metric: str,
    out_prefix: Path,
    title: str,
    labels: dict | None = None,
    n_test: int | None = None,
    synthetic: bool = False,
) -> list[Path]:
    """PRR-FL Fig. 1: per run the mean over seeds of ``local_epoch_curve`` (percent); dotted lines
    mark the communications. ``n_test``: the client's test images, which the legend states with
    the size of one image's step (3 images: steps of 33 %)."""
    labels = labels or {}
    source = SourceData((0.0, 100.0))
    fig, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
    period = None
    curves = {}
    for run, frames in histories.items():
        if not frames:
            continue
        per_seed = [local_epoch_curve(h, client, metric) for h in frames]
        # Each x holds two points at a communication (end of a round, start of the next): keep the order.
        curves[run] = (per_seed[0].index.to_numpy(), 100.0 * np.mean([c.to_numpy() for c in per_seed], axis=0))
        period = int(frames[0].loc[frames[0]["split"] == "test_local", "epoch"].max())
    styles = series_styles(curves, labels)
    for i, (run, (x, y)) in enumerate(curves.items()):
        style, label = styles[run]
        ax.plot(
            x,
            y,
            linewidth=1.2,
            label=label,
            markevery=mark_every(len(x), i),
            **{**style, "markersize": style["markersize"] - 1},
        )
        for xk, yk in zip(x, y):
            source.add(
                label,
                int(xk),
                yk,
                n=n_test if n_test else np.nan,
                n_of="test images of client " + str(client),
                style=style_key(style),
            )
    if period:
        for comm in range(period, int(ax.get_xlim()[1]) + 1, period):
            ax.axvline(comm, color="0.8", linestyle=":", linewidth=0.8, zorder=0)
    ax.set_xlabel("local epoch (dotted: communication)")
    ax.set_ylabel(f"client {client}: test {metric_label(metric)} (%)")
    y_from_floor(ax, 0.0)  # a score in %: a drop reads against 0, not a zoomed axis
    set_title(fig, title, fontsize=9)
    seeds = {len(frames) for frames in histories.values() if frames}
    n_seeds = seeds.pop() if len(seeds) == 1 else None
    parts = ["" if n_seeds is None else f"mean of {n_seeds} seeds" if n_seeds > 1 else "1 seed"]
    if n_test:
        parts.append(f"n = {n_test} test image{'s' if n_test != 1 else ''} (one image = {100.0 / n_test:.1f} pp)")
    place_legend(ax, len(curves), fontsize=8, title="; ".join(p for p in parts if p) or None, title_fontsize=8)
    return finish(fig, out_prefix, source, synthetic)
