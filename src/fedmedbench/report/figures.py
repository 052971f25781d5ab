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

from fedmedbench.data.store import atomic_write_text  # noqa: E402
from fedmedbench.files import atomic_path  # noqa: E402
from fedmedbench.report.flags import MARKS, collapsed_note, collapsed_sites, collapsed_texts  # noqa: E402
from fedmedbench.report.metric_names import metric_label, score_range  # noqa: E402
from fedmedbench.report.tables import AVG, SYNTHETIC_NOTE, seed_summary, std_over_seeds  # noqa: E402

HISTORY_COLUMNS = ("round", "client", "split", "metric", "value")

# ------------------------------------------------------------------------------------------------
# The drawing rules every figure of the report follows (tests/test_figure_rules.py reads them back
# from the drawn artists):
# * a colour-blind-safe palette, and per method a marker and a line style as well, so that no pair of
#   methods is told apart by hue alone and a curve hidden under an identical one still shows;
# * two series that are equal to the last bit (FedNova = FedAvg with equal local steps) are named as a
#   tie in the legend ("FedNova (= FedAvg)") and the later one is drawn hollow and with another dash;
# * bar charts start at 0, and so does every line plot of a score (its floor, y_from_floor): a truncated
#   axis would make a few points look like a collapse; error bars only where there is a spread (none for one seed);
# * legends sit outside the data (right of the axes, or below them for many entries): none covers a curve;
# * metric keys in words (report.metric_names); titles wrap to the figure; saved with
#   bbox_inches="tight", so a legend placed outside the axes and the title are inside the image;
# * no error bar or band leaves the metric's feasible range (0-100 % for a score): its ends are
#   clipped there and the legend says so; one error definition per figure, named on it;
# * a figure drawn from synthetic data says so in the first line of its title (SYNTHETIC_MARK);
# * every figure writes its source data beside itself, <figure>.csv (SourceData): one row per
#   plotted point, bar, band point or image panel, so a reader can re-plot it and a test check it.
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
# Up to this many legend entries go right of the axes; more go below them (a figure legend).
LEGEND_INSIDE_MAX = 6
# A legend below the axes has at most this many rows: more entries widen the figure for more columns,
# so that the legend of 11 long-named methods is not taller than the plot.
LEGEND_MAX_ROWS = 4
# The first line of the title of every figure drawn from synthetic data.
SYNTHETIC_MARK = SYNTHETIC_NOTE.rstrip(".")  # the tables say the same


def method_style(i: int) -> dict:
    """Colour, marker and line style of the i-th method of a figure: with 10 methods, 10 distinct
    (colour, marker) pairs; beyond, the colours repeat with other markers and dashes."""
    return {
        "color": PALETTE[i % len(PALETTE)],
        "marker": MARKERS[(i + i // len(PALETTE)) % len(MARKERS)],  # past ten, another marker per colour
        "linestyle": LINESTYLES[(i + i // len(PALETTE)) % len(LINESTYLES)],
    }


def bar_style(i: int) -> dict:
    """Colour and hatch of the i-th method of a bar chart: 20 distinct (colour, hatch) pairs; past
    ten the colours repeat with another hatch (as ``method_style`` does with markers)."""
    return {"color": PALETTE[i % len(PALETTE)], "hatch": HATCHES[(i + i // len(PALETTE)) % len(HATCHES)] or None}


def style_key(style: dict) -> str:
    """A series' style in words for its source CSV (colour, marker, dash, hatch): a check can tell
    from the CSV alone whether two series of a figure look alike."""
    return " ".join(str(style.get(k) or "-") for k in ("color", "marker", "linestyle", "hatch"))


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


def clip_band(y, err, bounds=(None, None)):
    """The ends ``y - err`` and ``y + err`` of an error bar or band, clipped to ``bounds`` (the
    metric's feasible range, e.g. 0-100 %: a mean of 98 % with a std of 4.5 has no 102.5 %).
    Returns (low, high, whether any end was clipped)."""
    y, err = np.asarray(y, dtype=float), np.asarray(err, dtype=float)
    low, high = y - err, y + err
    lo, hi = bounds
    clipped_low = np.clip(low, lo, hi) if lo is not None or hi is not None else low
    clipped_high = np.clip(high, lo, hi) if lo is not None or hi is not None else high
    with np.errstate(invalid="ignore"):
        clipped = bool(
            np.any((clipped_low != low) & np.isfinite(low)) or np.any((clipped_high != high) & np.isfinite(high))
        )
    return clipped_low, clipped_high, clipped


def error_shown(err, y, n_seeds=None) -> np.ndarray:
    """Where an error bar is drawn: ``err`` finite and positive, and ``n_seeds`` (a number or one per
    point, when given) at least 2: one seed has no spread to show."""
    y, err = np.asarray(y, dtype=float), np.asarray(err, dtype=float)
    keep = np.isfinite(err) & np.isfinite(y) & (err > 0)
    if n_seeds is not None:
        keep &= np.broadcast_to(np.asarray(n_seeds) >= 2, keep.shape)
    return keep


def draw_error_bars(ax, x, y, err, color, n_seeds=None, capsize: float = 3.0, bounds=(None, None)):
    """Error bars (±``err``, their ends clipped to ``bounds``) at the points :func:`error_shown`
    keeps. Returns the ErrorbarContainer, or None when there is no bar to draw."""
    x, y, err = (np.asarray(v, dtype=float) for v in (x, y, err))
    keep = error_shown(err, y, n_seeds)
    if not keep.any():
        return None
    low, high, _ = clip_band(y[keep], err[keep], bounds)
    yerr = np.vstack([y[keep] - low, high - y[keep]])
    return ax.errorbar(x[keep], y[keep], yerr=yerr, fmt="none", ecolor=color, elinewidth=1.0, capsize=capsize, zorder=4)


def place_legend(ax, n_entries: int | None = None, outside: bool | None = None, **kwargs):
    """Never over the data: right of the axes for a few entries (``loc="best"`` inside the axes still
    covered a curve of a 4-method figure). For more, a line figure gets a figure legend below its
    axes, in as many columns as its labels fit (long labels would squeeze the axes to a strip beside
    a legend on the right); a bar chart (``outside=True``) keeps its legend on the right. The
    constrained layout and the tight save keep either inside the image."""
    handles, labels = ax.get_legend_handles_labels()
    if n_entries is None:
        n_entries = len(labels)
    kwargs.setdefault("fontsize", "small")
    if outside or n_entries <= LEGEND_INSIDE_MAX:
        return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kwargs)
    fig = ax.figure
    size = matplotlib.font_manager.FontProperties(size=kwargs["fontsize"]).get_size_in_points()
    measure = matplotlib.textpath.TextToPath()
    prop = matplotlib.font_manager.FontProperties(size=size)
    widest = max(measure.get_text_width_height_descent(label, prop, ismath=False)[0] for label in labels)
    entry = widest + 3.5 * size  # the handle, its padding and the column gap
    ncols = int(max(1, min(4, 0.95 * fig.get_figwidth() * 72.0 // entry)))
    wanted = min(len(labels), max(ncols, -(-len(labels) // LEGEND_MAX_ROWS)))
    if wanted > ncols:  # too many rows: widen the figure for more columns (never taller than the plot)
        fig.set_figwidth(wanted * entry / (0.95 * 72.0))
        ncols = wanted
    # The figure grows by the legend's height, so the axes keep theirs.
    rows = -(-len(labels) // ncols) + (1 if kwargs.get("title") else 0)
    fig.set_figheight(fig.get_figheight() + (rows * 1.6 * size + 6.0) / 72.0)
    return fig.legend(handles, labels, loc="outside lower center", ncols=ncols, frameon=False, **kwargs)


def y_from_floor(ax, floor: float | None = 0.0) -> None:
    """The y axis starts at the metric's floor (0 for a score, a std or a CKA): a line plot zoomed to
    48-60 % would show a 5-point dip as a collapse. ``None`` (an unbounded quantity, a loss): left as
    matplotlib scales it. Call after drawing (the top stays autoscaled)."""
    if floor is not None:
        ax.set_ylim(bottom=floor)


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


# ------------------------------------------------------------------------------------------------
# Source data and the synthetic mark
# ------------------------------------------------------------------------------------------------

SOURCE_COLUMNS = (
    "panel",
    "series",
    "kind",
    "x",
    "y",
    "low",
    "high",
    "error",
    "n",
    "n_of",
    "style",
    "y_min",
    "y_max",
    "collapsed",
    "synthetic",
)


class SourceData:
    """What a figure draws, as numbers: one row per plotted point, bar, band point, marker or image
    panel, written beside the figure as ``<figure>.csv`` (:meth:`write`). Columns: ``panel`` (the
    axes' title, empty for a one-panel figure), ``series`` (legend label or column header),
    ``kind`` (point, curve (a convergence curve), bar, selected, panel, ...), ``x``, ``y``, ``low``/``high`` (the ends of the
    error bar or band as drawn, clipped to ``y_min``-``y_max``; empty without one), ``error`` (the
    definition of low-high, one per figure; an end equal to ``y_min`` or ``y_max`` was clipped),
    ``n`` and ``n_of`` (what y averages: seeds, clients, test images, pairs), ``style`` (how the
    series is drawn, :func:`style_key`), ``y_min``/``y_max`` (the quantity's feasible range; empty
    when unbounded), ``collapsed`` (where y is the score of a collapsed model: which run, site and
    seed, as the table's footnote; empty otherwise) and ``synthetic``."""

    def __init__(self, y_range=(None, None)):
        self.rows: list[dict] = []
        self.y_range = y_range

    def add(
        self,
        series,
        x,
        y,
        *,
        kind="point",
        low=np.nan,
        high=np.nan,
        error="",
        n=np.nan,
        n_of="",
        style="",
        panel="",
        y_range=None,
        collapsed="",
    ):
        lo, hi = self.y_range if y_range is None else y_range
        self.rows.append(dict(panel=panel, series=str(series), kind=kind, x=x, y=_num(y), low=_num(low), high=_num(high), error=error if np.isfinite(_num(low)) or np.isfinite(_num(high)) else "",
                              n=n, n_of=n_of, style=style, y_min=np.nan if lo is None else lo, y_max=np.nan if hi is None else hi, collapsed=collapsed))  # fmt: skip

    def write(self, out_prefix: Path | str, synthetic: bool) -> Path:
        frame = pd.DataFrame(self.rows, columns=SOURCE_COLUMNS)
        frame["synthetic"] = bool(synthetic)
        out_prefix = Path(out_prefix)
        return atomic_write_text(out_prefix.with_name(out_prefix.name + ".csv"), frame.to_csv(index=False))


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return np.nan


def mark_synthetic(fig, synthetic: bool) -> None:
    """Put :data:`SYNTHETIC_MARK` as the first line of the figure's title when its data are
    synthetic: the figure says so on its face, wherever it is copied to."""
    if not synthetic:
        return
    old = fig._suptitle
    text = old.get_text() if old is not None else ""
    fontsize = old.get_fontsize() if old is not None else None
    set_title(fig, SYNTHETIC_MARK + ("\n" + text if text else ""), fontsize=fontsize)


def finish(fig, out_prefix: Path | str, source: SourceData, synthetic: bool = False, save=None) -> list[Path]:
    """Mark a synthetic figure, write its source CSV, save PNG + PDF (``save``: the module's
    ``save_figure``, so a test that wraps it there still sees the figure). Returns the paths."""
    mark_synthetic(fig, synthetic)
    csv = source.write(out_prefix, synthetic)
    return [*(save or save_figure)(fig, out_prefix), csv]


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
        raise ValueError(f"history has no rows for split={split!r}, metric={metric!r} (has {pairs})")
    values = pd.to_numeric(sel["value"], errors="coerce")
    return values.groupby(sel["round"].astype(int)).mean().sort_index()


def seed_band(histories: list[pd.DataFrame], metric: str, split: str = "test") -> pd.DataFrame:
    """Per round: ``mean`` and ``std`` (ddof=1; NaN for one seed) over seeds of the client-mean
    curve, and ``n_seeds`` (the seeds that reached that round). Fractions, not percent."""
    curves = pd.concat([client_mean_curve(h, metric, split) for h in histories], axis=1, join="outer")
    return pd.DataFrame(
        {
            "mean": curves.mean(axis=1),
            # the tables' own spread over seeds (report.tables), not a second implementation of it
            "std": std_over_seeds(curves.to_numpy().T),
            "n_seeds": curves.notna().sum(axis=1),
        },
        index=curves.index,
    )


def selected_rounds(final: dict) -> list[int]:
    """The round(s) whose model a run's table reports: ``selection.best_round``, one per client
    where selection is per client."""
    best = final["selection"]["best_round"]
    return [int(r) for r in best.values()] if isinstance(best, dict) else [int(best)]


SELECTED_LABEL = "selected model (the table's Avg)"


def convergence(
    histories: dict[str, list[pd.DataFrame]],
    metric: str,
    out_prefix: Path | str,
    title: str,
    labels: dict[str, str] | None = None,
    split: str = "test",
    percent: bool = True,
    finals: dict[str, list[dict]] | None = None,
    synthetic: bool = False,
) -> list[Path]:
    """Convergence curves: for each run, the mean over clients of ``metric`` vs round,
    averaged over seeds (line) with a ±1 std band over seeds (when there are ≥2 seeds), clipped to
    the metric's feasible range.

    ``histories`` maps run → list of per-seed ``history.csv`` DataFrames (columns
    ``round, client, split, metric, value``). ``finals`` (run → its seeds' final.json, as the table
    reads them): each run's selected round is marked with a star at the table's Avg, which lies on
    the curve when every seed selected one round for all clients; where selection is per client (or
    the seeds differ) a dashed segment at the table's Avg spans the selected rounds, with a tick on
    the curve at each. Writes ``<out_prefix>.png`` (dpi 150), ``.pdf`` and the source ``.csv``
    atomically and returns their paths. Raises ValueError when a run has no history or no rows for
    the metric/split.
    """
    out_prefix = Path(out_prefix)
    labels = labels or {}
    finals = finals or {}
    if not histories:
        raise ValueError("convergence: no runs to plot")
    scale = 100.0 if percent else 1.0
    bounds = score_range(metric, percent)

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
    spread = "band ±1 std over seeds"
    clipped_any = False
    source = SourceData(bounds)
    styles = series_styles(curves, labels)
    # A run whose selected model collapsed says so: a mark on its label, a line on the face, the CSV's column.
    collapsed = {run: collapsed_sites(finals.get(run) or []) for run in curves}
    texts = {run: "; ".join(collapsed_texts(finals.get(run) or [], labels)) for run in curves}
    for i, (run, (x, y, s)) in enumerate(curves.items()):
        style, label = styles[run]
        label += f" {MARKS['collapsed']}" if collapsed[run] else ""
        y, s = y * scale, s * scale
        ax.plot(
            x,
            y,
            linewidth=1.6,
            label=label if seeds_note(n_seeds) else label + f" ({n_seeds[run]} seed{'s' if n_seeds[run] != 1 else ''})",
            markevery=mark_every(len(x), i),
            **style,
        )
        low, high, clipped = clip_band(y, s, bounds)
        band = n_seeds[run] > 1 and np.isfinite(s).any()
        if band:
            ax.fill_between(x, low, high, color=style["color"], alpha=0.15, linewidth=0)
            clipped_any |= clipped
        counts = bands[run]["n_seeds"].to_numpy()
        for k in range(len(x)):
            shown = band and np.isfinite(s[k])
            # kind "curve": a model's score per round, whose selected round the figure marks
            source.add(
                label,
                int(x[k]),
                y[k],
                kind="curve",
                low=low[k] if shown else np.nan,
                high=high[k] if shown else np.nan,
                error=spread,
                n=int(counts[k]),
                n_of="seeds",
                style=style_key(style),
            )
        if finals.get(run):
            _mark_selected(ax, source, finals[run], metric, split, x, y, style, label, texts[run])
    if any(finals.get(run) for run in curves):
        ax.plot([], [], marker="*", color="0.2", markersize=9, linestyle="none", label=SELECTED_LABEL)

    if clipped_any:
        spread += f", clipped to {bounds[0]:g}-{bounds[1]:g}{' %' if percent else ''}"
    note = seeds_note(n_seeds, spread)
    face = collapsed_note({styles[run][1]: sites for run, sites in collapsed.items()})
    note = "\n".join(filter(None, [note, face])) or None
    unit = " (%)" if percent else ""
    ax.set_xlabel("Communication round")
    ax.set_ylabel(f"{split} {metric_label(metric)}{unit},\nmean over clients")
    set_title(fig, title)
    ax.grid(True, alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)
    y_from_floor(ax, bounds[0])
    place_legend(
        ax, len(bands) + (1 if any(finals.get(run) for run in curves) else 0), title=note, title_fontsize="small"
    )

    return finish(fig, out_prefix, source, synthetic)


def _mark_selected(
    ax,
    source: SourceData,
    finals: list[dict],
    metric: str,
    split: str,
    x,
    y,
    style: dict,
    label: str,
    collapsed: str = "",
) -> None:
    """The table's Avg of a run (its finals' selected models) at the round(s) selected: a star on
    the curve when there is one round, else ticks on the curve at each selected round and a dashed
    segment at the table's Avg across them."""
    summary = seed_summary(finals, metric, split)
    avg = float(summary.loc[summary["client_label"] == AVG, "mean"].iloc[0])
    rounds = [r for f in finals for r in selected_rounds(f)]
    distinct = sorted(set(rounds))
    colour = style["color"]
    if len(distinct) == 1:
        ax.plot(
            [distinct[0]],
            [avg],
            marker="*",
            markersize=11,
            color=colour,
            markeredgecolor="black",
            markeredgewidth=0.6,
            linestyle="none",
            zorder=6,
            label="_selected",
        )
    else:
        on_curve = [float(y[list(x).index(r)]) if r in list(x) else np.nan for r in distinct]
        ax.plot(
            distinct,
            on_curve,
            marker="|",
            markersize=10,
            markeredgewidth=1.6,
            color=colour,
            linestyle="none",
            zorder=6,
            label="_selected rounds",
        )
        ax.plot(
            [distinct[0], distinct[-1]],
            [avg, avg],
            color=colour,
            linestyle=(0, (2, 1)),
            linewidth=1.2,
            zorder=6,
            label="_table Avg",
        )
        ax.plot(
            [distinct[-1]],
            [avg],
            marker="*",
            markersize=11,
            color=colour,
            markeredgecolor="black",
            markeredgewidth=0.6,
            linestyle="none",
            zorder=6,
            label="_selected",
        )
    per = "client and seed" if any(isinstance(f["selection"]["best_round"], dict) for f in finals) else "seed"
    for r in distinct:
        source.add(
            label,
            r,
            avg,
            kind="selected",
            n=rounds.count(r),
            n_of=f"selections (one per {per}) at this round; y: the table's Avg",
            style=style_key(style),
            collapsed=collapsed,
        )


def save_figure(fig, out_prefix: Path | str) -> list[Path]:
    """``<out_prefix>.png`` (dpi 150) and ``.pdf``, atomically, cropped to what is drawn
    (``SAVE_KWARGS``: a legend outside the axes is inside the image); closes the figure. Every
    figure of the report is saved here."""
    out_prefix = Path(out_prefix)
    # The title as drawn (synthetic mark included) in the files' metadata: a check of a figures
    # folder reads it without redrawing the figure.
    title = " ".join(fig._suptitle.get_text().split()) if fig._suptitle is not None else ""
    try:
        return [
            _atomic_savefig(
                fig,
                out_prefix.with_name(out_prefix.name + ".png"),
                dpi=PNG_DPI,
                metadata={"Title": title},
                **SAVE_KWARGS,
            ),
            _atomic_savefig(
                fig,
                out_prefix.with_name(out_prefix.name + ".pdf"),
                metadata={"Title": title, "CreationDate": None},
                **SAVE_KWARGS,
            ),
        ]
    finally:
        plt.close(fig)
