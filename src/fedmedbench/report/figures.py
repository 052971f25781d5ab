"""Figures for the reproduction report (PNG + PDF, headless).

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: cluster nodes have no display; must precede pyplot

import matplotlib.font_manager  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.textpath  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from fedmedbench.files import atomic_path  # noqa: E402
from fedmedbench.report.metric_names import metric_label  # noqa: E402
from fedmedbench.report.tables import std_over_seeds  # noqa: E402

HISTORY_COLUMNS = ("round", "client", "split", "metric", "value")

# ------------------------------------------------------------------------------------------------
# The drawing rules every figure of the report follows (tests/test_figure_rules.py reads them back
# from the drawn artists):
# * a colour-blind-safe palette, and per method a marker and a line style as well, so that no pair of
#   methods is told apart by hue alone and a curve hidden under an identical one still shows;
# * two series that are equal to the last bit (FedNova = FedAvg with equal local steps) are named as a
#   tie in the legend ("FedNova (= FedAvg)") and the later one is drawn hollow and with another dash;
# * bar charts start at 0; error bars only where there is a spread (none for one seed);
# * metric keys in words (report.metric_names); titles wrap to the figure; saved with
#   bbox_inches="tight", so a legend placed outside the axes and the title are inside the image.
# ------------------------------------------------------------------------------------------------

# Paul Tol's "muted" qualitative scheme (personal.sron.nl/~pault, colour-blind safe); his tenth colour
# (pale grey) is meant for missing data and vanishes on white, so black (as in Okabe-Ito's scheme)
# takes its place. Ordered dark and light alternately with his light cyan and sand last, so the first
# methods of a figure (few figures have more than six) get the colours that show best on white.
PALETTE = (
    "#332288", "#CC6677", "#117733", "#882255", "#44AA99",
    "#AA4499", "#999933", "#88CCEE", "#DDCC77", "#000000",
)  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)))
# Bars: one sparse hatch per method besides its colour (the bars' counterpart of a line's marker).
HATCHES = ("", "/", "\\", "x", ".", "+", "o", "-", "|", "*")
# Markers on at most this many points of a curve (200 rounds would be a solid band of markers).
MAX_MARKERS = 15
SAVE_KWARGS = {"bbox_inches": "tight", "pad_inches": 0.05}
PNG_DPI = 150
# More legend entries than this go outside the axes (right), where they cover no curve.
LEGEND_INSIDE_MAX = 6


def method_style(i: int) -> dict:
    """Colour, marker and line style of the i-th method of a figure: with 10 methods, 10 distinct
    (colour, marker) pairs; beyond, the colours repeat with other markers and dashes."""
    return {
        "color": PALETTE[i % len(PALETTE)],
        "marker": MARKERS[(i + i // len(PALETTE)) % len(MARKERS)],  # past ten, another marker per colour
        "linestyle": LINESTYLES[(i + i // len(PALETTE)) % len(LINESTYLES)],
    }


def _same(a, b) -> bool:
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        return bool(np.array_equal(a.astype(float), b.astype(float), equal_nan=True))
    return bool(np.array_equal(a, b))


def find_ties(series: dict) -> dict:
    """``{name: first earlier name whose series is equal to the last bit, or None}``. A series is an
    array or a tuple of arrays (x, mean, spread, ...), compared with NaN equal to NaN."""
    ties: dict = {}
    for name, data in series.items():
        ties[name] = next((other for other in ties if ties[other] is None and _same(series[other], data)), None)
    return ties


def series_styles(series: dict, labels: dict | None = None) -> dict[str, tuple[dict, str]]:
    """Per series (in drawing order): Line2D keyword arguments and the legend label. A series equal
    to an earlier one is labelled "B (= A)", drawn hollow with bigger markers, another dash and
    above A, so both stay visible where they coincide."""
    labels = labels or {}
    ties = find_ties(series)
    out: dict[str, tuple[dict, str]] = {}
    for i, name in enumerate(series):
        style = {**method_style(i), "markersize": 4.0}
        label = str(labels.get(name, name))
        root = ties[name]
        if root is not None:
            group = [out[n][0] for n in out if n == root or ties[n] == root]
            used_dash = [g["linestyle"] for g in group]
            used_marker = [g["marker"] for g in group]
            style["linestyle"] = next((d for d in LINESTYLES if d not in used_dash), style["linestyle"])
            if style["marker"] in used_marker:
                style["marker"] = next((m for m in MARKERS if m not in used_marker), style["marker"])
            style.update(markerfacecolor="none", markersize=6.5, zorder=3 + len(group))
            label = f"{label} (= {labels.get(root, root)})"
        out[name] = (style, label)
    return out


def contrast_colour(color) -> str:
    """Hatch colour that shows on a bar of ``color``: white on a dark bar, near-black on a light one."""
    r, g, b = matplotlib.colors.to_rgb(color)
    return "white" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45 else "0.15"


def mark_every(n_points: int, i: int):
    """Markers on at most ``MAX_MARKERS`` points, the i-th series shifted, so that markers of curves
    that run together do not sit on one another."""
    step = max(1, -(-n_points // MAX_MARKERS))
    return (i % step, step) if step > 1 else None


def draw_error_bars(ax, x, y, err, color, n_seeds=None, capsize: float = 3.0):
    """Error bars at the points whose ``err`` is finite and positive, only where ``n_seeds`` (a
    number or one per point, when given) is at least 2: one seed has no spread to show. Returns the
    ErrorbarContainer, or None when there is no bar to draw."""
    x, y, err = (np.asarray(v, dtype=float) for v in (x, y, err))
    keep = np.isfinite(err) & np.isfinite(y) & (err > 0)
    if n_seeds is not None:
        keep &= np.broadcast_to(np.asarray(n_seeds) >= 2, keep.shape)
    if not keep.any():
        return None
    return ax.errorbar(x[keep], y[keep], yerr=err[keep], fmt="none", ecolor=color, elinewidth=1.0, capsize=capsize, zorder=4)


def place_legend(ax, n_entries: int | None = None, outside: bool | None = None, **kwargs):
    """Inside the axes ("best") for a few entries. For more, a line figure gets a figure legend below
    its axes, in as many columns as its labels fit (long labels would squeeze the axes to a strip
    beside a legend on the right); a bar chart (``outside=True``) keeps its legend on the right. The
    constrained layout and the tight save keep either inside the image."""
    handles, labels = ax.get_legend_handles_labels()
    if n_entries is None:
        n_entries = len(labels)
    kwargs.setdefault("fontsize", "small")
    if outside:
        return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kwargs)
    if n_entries <= LEGEND_INSIDE_MAX:
        return ax.legend(loc="best", **kwargs)
    fig = ax.figure
    size = matplotlib.font_manager.FontProperties(size=kwargs["fontsize"]).get_size_in_points()
    measure = matplotlib.textpath.TextToPath()
    prop = matplotlib.font_manager.FontProperties(size=size)
    widest = max(measure.get_text_width_height_descent(label, prop, ismath=False)[0] for label in labels)
    entry = widest + 3.5 * size  # the handle, its padding and the column gap
    ncols = int(max(1, min(4, 0.95 * fig.get_figwidth() * 72.0 // entry)))
    # The figure grows by the legend's height, so the axes keep theirs.
    rows = -(-len(labels) // ncols) + (1 if kwargs.get("title") else 0)
    fig.set_figheight(fig.get_figheight() + (rows * 1.6 * size + 6.0) / 72.0)
    return fig.legend(handles, labels, loc="outside lower center", ncols=ncols, frameon=False, **kwargs)


def wrap_to_width(text: str, width_pt: float, fontsize) -> str:
    """``text`` broken between words into lines no wider than ``width_pt`` points, measured with
    the font matplotlib draws it in (a word longer than the width keeps a line of its own)."""
    prop = matplotlib.font_manager.FontProperties(size=fontsize)
    measure = matplotlib.textpath.TextToPath()

    def width(line: str) -> float:
        return measure.get_text_width_height_descent(line, prop, ismath=False)[0]

    lines: list[str] = []
    for paragraph in str(text).split("\n"):
        line = ""
        for word in paragraph.split(" "):
            candidate = f"{line} {word}" if line else word
            if line and width(candidate) > width_pt:
                lines.append(line)
                line = word
            else:
                line = candidate
        lines.append(line)
    return "\n".join(lines)


def set_title(fig, title: str, fontsize=None, **kwargs):
    """The figure's title, centred over the whole figure (axes and a legend placed outside them) and
    wrapped to the figure's width, so it is never cut at an edge; constrained layout makes room."""
    fontsize = fontsize or matplotlib.rcParams["figure.titlesize"]
    width_pt = 0.96 * fig.get_figwidth() * 72.0
    return fig.suptitle(wrap_to_width(title, width_pt, fontsize), fontsize=fontsize, **kwargs)


def seeds_note(n_seeds: dict[str, int], spread: str = "band ±1 std over seeds") -> str | None:
    """The legend's title when every series averages the same number of seeds (else None: then
    each label says its own count)."""
    counts = set(n_seeds.values())
    if len(counts) != 1:
        return None
    n = counts.pop()
    return f"mean of {n} seeds; {spread}" if n > 1 else "1 seed"


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
            # the tables' own spread over seeds (report.tables), not a second implementation of it
            "std": std_over_seeds(curves.to_numpy().T),
            "n_seeds": curves.notna().sum(axis=1),
        },
        index=curves.index,
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
    curves = {run: (b.index.to_numpy(), b["mean"].to_numpy(), b["std"].to_numpy()) for run, b in bands.items()}
    n_seeds = {run: int(b["n_seeds"].max()) for run, b in bands.items()}
    note = seeds_note(n_seeds)
    styles = series_styles(curves, labels)
    for i, (run, (x, y, s)) in enumerate(curves.items()):
        style, label = styles[run]
        if note is None:
            label += f" ({n_seeds[run]} seed{'s' if n_seeds[run] != 1 else ''})"
        y, s = y * scale, s * scale
        ax.plot(x, y, linewidth=1.6, label=label, markevery=mark_every(len(x), i), **style)
        if n_seeds[run] > 1 and np.isfinite(s).any():
            ax.fill_between(x, y - s, y + s, color=style["color"], alpha=0.15, linewidth=0)

    unit = " (%)" if percent else ""
    ax.set_xlabel("Communication round")
    ax.set_ylabel(f"{split} {metric_label(metric)}{unit},\nmean over clients")
    set_title(fig, title)
    ax.grid(True, alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    place_legend(ax, len(bands), title=note, title_fontsize="small")

    return save_figure(fig, out_prefix)


def save_figure(fig, out_prefix: Path | str) -> list[Path]:
    """``<out_prefix>.png`` (dpi 150) and ``.pdf``, atomically, cropped to what is drawn
    (``SAVE_KWARGS``: a legend outside the axes is inside the image); closes the figure. Every
    figure of the report is saved here."""
    out_prefix = Path(out_prefix)
    try:
        return [
            _atomic_savefig(fig, out_prefix.with_name(out_prefix.name + ".png"), dpi=PNG_DPI, **SAVE_KWARGS),
            _atomic_savefig(fig, out_prefix.with_name(out_prefix.name + ".pdf"), **SAVE_KWARGS),
        ]
    finally:
        plt.close(fig)
