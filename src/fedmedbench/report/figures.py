"""Figures for the reproduction report (PNG + PDF, headless).

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: cluster nodes have no display; must precede pyplot

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedmedbench.files import atomic_path  # noqa: E402

HISTORY_COLUMNS = ("round", "client", "split", "metric", "value")


def _atomic_savefig(fig, path: Path, **kwargs) -> Path:
    """Save via a temporary file in the same folder and ``os.replace``. A PDF gets no CreationDate,
    so re-running a rule gives the same bytes."""
    fmt = path.suffix.lstrip(".")
    if fmt == "pdf":
        kwargs.setdefault("metadata", {"CreationDate": None})
    with atomic_path(path, suffix=f".tmp.{fmt}") as tmp:
        fig.savefig(tmp, format=fmt, **kwargs)
    return path


def client_mean_curve(history: pd.DataFrame, metric: str, split: str = "test") -> pd.Series:
    """Mean over clients of ``metric`` on ``split`` per round (index: round), as fractions."""
    missing = [c for c in HISTORY_COLUMNS if c not in history.columns]
    if missing:
        raise ValueError(f"history.csv lacks columns {missing} (has {list(history.columns)})")
    sel = history[(history["split"] == split) & (history["metric"] == metric)]
    if sel.empty:
        pairs = sorted(set(zip(history["split"], history["metric"])))
        raise ValueError(
            f"history has no rows for split={split!r}, metric={metric!r} (has {pairs})"
        )
    values = pd.to_numeric(sel["value"], errors="coerce")
    return values.groupby(sel["round"].astype(int)).mean().sort_index()


def seed_band(histories: list[pd.DataFrame], metric: str, split: str = "test") -> pd.DataFrame:
    """Per round: ``mean`` and ``std`` (ddof=1; NaN for one seed) over seeds of the client-mean
    curve, and ``n_seeds`` (the seeds that reached that round). Fractions, not percent."""
    curves = pd.concat(
        [client_mean_curve(h, metric, split) for h in histories], axis=1, join="outer"
    )
    return pd.DataFrame(
        {
            "mean": curves.mean(axis=1),
            "std": curves.std(axis=1, ddof=1),
            "n_seeds": curves.notna().sum(axis=1),
        }
    )


def convergence(
    histories: dict[str, list[pd.DataFrame]],
    metric: str,
    out_prefix: Path | str,
    title: str,
    labels: dict[str, str] | None = None,
    split: str = "test",
    percent: bool = True,
) -> list[Path]:
    """Convergence curves: for each run, the mean over clients of ``metric`` vs round,
    averaged over seeds (line) with a ±1 std band over seeds (when there are ≥2 seeds).

    ``histories`` maps run → list of per-seed ``history.csv`` DataFrames (columns
    ``round, client, split, metric, value``). Writes ``<out_prefix>.png`` (dpi 150) and
    ``<out_prefix>.pdf`` atomically and returns their paths. Raises ValueError when a run has
    no history or no rows for the metric/split.
    """
    out_prefix = Path(out_prefix)
    labels = labels or {}
    if not histories:
        raise ValueError("convergence: no runs to plot")
    scale = 100.0 if percent else 1.0

    bands = {}
    for run, hs in histories.items():
        if not hs:
            raise ValueError(f"convergence: run {run!r} has no history")
        try:
            bands[run] = seed_band(hs, metric, split)
        except ValueError as err:
            raise ValueError(f"convergence: run {run!r}: {err}") from None

    fig, ax = plt.subplots(figsize=(7.0, 4.2), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (run, band) in enumerate(bands.items()):
        color = colors[i % len(colors)]
        x = band.index.to_numpy()
        y = band["mean"].to_numpy() * scale
        n = int(band["n_seeds"].max())
        label = f"{labels.get(run, run)} ({n} seed{'s' if n != 1 else ''})"
        ax.plot(x, y, color=color, linewidth=1.8, label=label,
                marker="o" if len(x) <= 30 else None, markersize=3)
        s = band["std"].to_numpy() * scale
        if np.isfinite(s).any():
            ax.fill_between(x, y - s, y + s, color=color, alpha=0.2, linewidth=0)

    unit = " (%)" if percent else ""
    ax.set_xlabel("Communication round")
    ax.set_ylabel(f"{metric} on {split}, mean over clients{unit}")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    if len(bands) > 6:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    else:
        ax.legend(loc="best", fontsize="small")

    return save_figure(fig, out_prefix)


def save_figure(fig, out_prefix: Path | str) -> list[Path]:
    """``<out_prefix>.png`` (dpi 150) and ``.pdf``, atomically; closes the figure."""
    out_prefix = Path(out_prefix)
    try:
        return [
            _atomic_savefig(fig, out_prefix.with_name(out_prefix.name + ".png"), dpi=150),
            _atomic_savefig(fig, out_prefix.with_name(out_prefix.name + ".pdf")),
        ]
    finally:
        plt.close(fig)
