"""Hyperparameter sweeps as line plots (HarmoFL Fig. 5b local epochs, Fig. 5c perturbation radius).

A point is a table's Avg cell: :func:`fedmedbench.report.tables.seed_summary` of the point's run gives
its mean (over clients of the seed means) and the spreads, so an error bar is the number the table
prints for that run (docs/reviewers/index.md, "Tables and figures").
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from fedmedbench.report.figures import (
    SourceData,
    clip_band,
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
from fedmedbench.report.flags import MARKS, collapsed_texts
from fedmedbench.report.metric_names import SWEEP_ERRORS, metric_label
from fedmedbench.report.tables import AVG, seed_summary, std_over_seeds

# A point is a mean of accuracies or Dice scores in percent: no error bar leaves 0-100 %.
PERCENT_RANGE = (0.0, 100.0)


def sweep_y_label(metric: str, points: dict[str, list[tuple]]) -> str:
    """The y axis: the metric in words and what a point averages, with the number of seeds (one
    seed is not a mean over seeds)."""
    n = max((int(p[3]) for pts in points.values() for p in pts if len(p) > 3), default=1)
    return f"test {metric_label(metric)} (%),\nmean over clients" + (f" and {n} seeds" if n > 1 else " (1 seed)")


def sweep_points(
    finals: list[dict], series: dict[str, dict], metric: str, error: str, split: str = "test"
) -> dict[str, list[tuple]]:
    """Per series, (x, mean, error, n_seeds) points, in percent. The mean is the run's table Avg (over
    clients of the seed means). The error: ``clients_std`` = the table's Avg parenthesis (sample std
    across clients of the seed means); ``clients_sem`` = that over sqrt(clients) (HarmoFL's Fig. 5c);
    ``seeds`` = the tables' std over seeds of each seed's Avg (NaN for one seed)."""
    if error not in SWEEP_ERRORS:
        raise ValueError(f"unknown sweep error {error!r}; expected one of {sorted(SWEEP_ERRORS)}")
    by_run: dict[str, list[dict]] = {}
    for final in finals:
        by_run.setdefault(final.get("run") or final.get("method"), []).append(final)
    points = {}
    for name, runs in series.items():
        points[name] = []
        for x, run in runs.items():
            if run not in by_run:
                raise ValueError(f"sweep series {name!r}: no results for run {run!r}")
            summary = seed_summary(by_run[run], metric, split)
            avg = summary[summary["client_label"] == AVG].iloc[0]
            n_clients = int((summary["client_label"] != AVG).sum())
            if error == "clients_std":
                err = float(avg["std"])
            elif error == "clients_sem":
                err = float(avg["std"]) / math.sqrt(n_clients)
            else:
                per_seed = [_avg(seed_summary([f], metric, split)) for f in by_run[run]]
                err = float(std_over_seeds(np.array(per_seed)))
            points[name].append((float(x), float(avg["mean"]), err, int(avg["n_seeds"])))
    return points


def sweep_flags(finals: list[dict], series: dict[str, dict], names: dict | None = None) -> dict[str, dict[float, str]]:
    """Per series, {x: the footnotes of the collapsed models its point averages} (only marked points):
    what the figure marks with the tables' †."""
    by_run: dict[str, list[dict]] = {}
    for final in finals:
        by_run.setdefault(final.get("run") or final.get("method"), []).append(final)
    out: dict[str, dict[float, str]] = {}
    for name, runs in series.items():
        for x, run in runs.items():
            texts = collapsed_texts(by_run.get(run, []), names)
            if texts:
                out.setdefault(name, {})[float(x)] = "; ".join(texts)
    return out


def _avg(summary) -> float:
    return float(summary.loc[summary["client_label"] == AVG, "mean"].iloc[0])


def sweep_figure(
    points: dict[str, list[tuple]],
    out_prefix: Path,
    title: str,
    x_label: str,
    y_label: str,
    log_x: bool = False,
    error: str | None = None,
    synthetic: bool = False,
    bounds=PERCENT_RANGE,
    collapsed: dict | None = None,
) -> list[Path]:
    """One line per series; error bars where the error is defined (``seeds`` with one seed: none),
    their ends clipped to ``bounds``. ``error`` (a key of ``SWEEP_ERRORS``) names the bars in the
    legend's title, with "clipped" when an end was. ``collapsed`` (:func:`sweep_flags`): a point that
    averages a collapsed model carries the tables' † and its CSV row the footnote."""
    collapsed = collapsed or {}
    fig, ax = plt.subplots(figsize=(5.5, 3.8), layout="constrained")
    arrays = {name: tuple(np.array(v, dtype=float) for v in zip(*pts)) for name, pts in points.items()}
    styles = series_styles({name: a[:3] for name, a in arrays.items()})
    words = SWEEP_ERRORS.get(error, "error")
    source = SourceData(bounds)
    bars, clipped_any = [], False
    for i, (name, a) in enumerate(arrays.items()):
        x, y, err = a[:3]
        n_seeds = a[3] if len(a) > 3 else None
        style, label = styles[name]
        ax.plot(x, y, linewidth=1.6, label=label, markevery=mark_every(len(x), i), **style)
        # Errors over seeds need two seeds; an error across clients exists with one.
        needs = n_seeds if error in (None, "seeds") else None
        bars.append(draw_error_bars(ax, x, y, err, style["color"], n_seeds=needs, bounds=bounds))
        shown = error_shown(err, y, needs)
        low, high, clipped = clip_band(y, err, bounds)
        clipped_any |= bool(clipped and shown.any())
        for k in range(len(x)):
            why = collapsed.get(name, {}).get(float(x[k]), "")
            if why:  # the tables' mark, above the point
                ax.annotate(
                    MARKS["collapsed"],
                    (x[k], y[k]),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color="0.1",
                )
            source.add(label, x[k], y[k], low=low[k] if shown[k] else np.nan, high=high[k] if shown[k] else np.nan, error=words,
                       n=int(n_seeds[k]) if n_seeds is not None else np.nan, n_of="seeds", style=style_key(style), collapsed=why)  # fmt: skip
    if log_x:
        ax.set_xscale("log")
    xs = sorted({p[0] for pts in points.values() for p in pts})
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    set_title(fig, title)
    ax.grid(True, alpha=0.3)
    y_from_floor(ax, bounds[0])  # Fig. 5c's points at 48-60 %: from 0, not from 48
    clip = f", clipped to {bounds[0]:g}-{bounds[1]:g} %" if clipped_any else ""
    if any(b is not None for b in bars):
        note = f"error bars: {SWEEP_ERRORS[error]}{clip}" if error in SWEEP_ERRORS else None
    else:
        note = "no error bars: one seed" if error == "seeds" else None
    if any(collapsed.values()):
        note = "\n".join(
            filter(None, [note, f"{MARKS['collapsed']}: averages a collapsed model (one class on a whole test split)"])
        )
    place_legend(ax, len(points), title=note, title_fontsize="small")
    return finish(fig, out_prefix, source, synthetic)
