"""Fed-LWR's figures and its official select-on-test switch (light: no torch).

* :func:`layer_cka_figure` — Fig. 1(b): layer-wise CKA between pairs of local models (mean and range
  over pairs, from the ``pair_cka:<peer>:<layer>`` rows Fed-LWR writes to history.csv, split
  ``server``), with the mean CKA to the FedAvg anchor (``cka:<layer>``) for reference; one panel per
  shown round.
* :func:`fairness_curves` — Fig. 2: Avg and Std (population, ddof=0) across clients of the test
  metric vs round, per method (mean over seeds).
* :func:`fairness_bars` — per-client test metric of every method as grouped bars (the fairness
  picture behind the tables' Std column), mean over seeds.
* :func:`select_on_test` — the official Fed-LWR model selection (the round with the best mean test
  metric; per client for personalized runs), read from history.csv; a documented switch, off by default.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .figures import (
    PALETTE,
    SourceData,
    bar_style,
    clip_band,
    contrast_colour,
    draw_error_bars,
    error_shown,
    find_ties,
    finish,
    mark_every,
    method_style,
    place_legend,
    plt,
    save_figure,
    series_styles,
    set_title,
    style_key,
    y_from_floor,
)
from .flags import MARKS, Flags
from .metric_names import metric_label, score_range
from .tables import AVG, STD, site_std_per_seed

CKA_PREFIX = "cka:"


def layer_cka_table(history: pd.DataFrame) -> pd.DataFrame:
    """Rows (round, client, layer index, layer, cka) from Fed-LWR's history; layers in model order."""
    rows = history[(history["split"] == "server") & history["metric"].astype(str).str.startswith(CKA_PREFIX)].copy()
    if rows.empty:
        raise ValueError(
            "history has no 'cka:<layer>' rows (split 'server'): is it a Fed-LWR run with log_layers: true?"
        )
    rows["layer"] = rows["metric"].str[len(CKA_PREFIX) :]
    order = {name: i for i, name in enumerate(dict.fromkeys(rows["layer"]))}
    rows["layer_index"] = rows["layer"].map(order)
    rows["cka"] = pd.to_numeric(rows["value"], errors="coerce")
    return rows[["round", "client", "layer_index", "layer", "cka"]].reset_index(drop=True)


def layer_groups(names: list[str]) -> list[tuple[str, int, int]]:
    """(block, first index, last index) of each run of consecutive layers of one block (the name
    without its last part: ``encoders.0.3`` -> ``encoders.0``): the x axis names ~15 blocks, not
    41 layers in 5-point type."""
    groups: list[tuple[str, int, int]] = []
    for i, name in enumerate(names):
        block = name.rsplit(".", 1)[0] if "." in name else name
        if groups and groups[-1][0] == block:
            groups[-1] = (block, groups[-1][1], i)
        else:
            groups.append((block, i, i))
    return groups


CKA_RANGE = (0.0, 1.0)  # linear CKA of the paper's (biased) estimator lies in [0, 1]


def layer_cka_figure(
    history: pd.DataFrame,
    out_prefix: Path,
    title: str,
    rounds: list[int] | None = None,
    labels: dict | None = None,
    synthetic: bool = False,
) -> list[Path]:
    """Fig. 1(b): per layer, the CKA between **pairs of local models** (the paper's quantity), one
    panel per shown round (default: the first and last rounds that have it).

    Read from Fed-LWR's ``pair_cka:<peer>:<layer>`` rows (split ``server``, on client k's row: CKA of
    w_k and w_peer on client k's data). A pair's value is the mean of its two clients' measurements;
    the line is the mean over pairs, the band their range (min-max, clipped to [0, 1]). The mean CKA
    of the local models to the FedAvg anchor (``cka:<layer>``, what Fed-LWR weights by) is drawn
    dashed for reference. A history without pair rows (a run from before they were logged) shows
    each client's CKA to the anchor. The x axis names each block of layers (one tick per layer).
    """
    server = history[history["split"] == "server"]
    pairs = server[server["metric"].astype(str).str.startswith("pair_cka:")].copy()
    has_anchor = server["metric"].astype(str).str.startswith(CKA_PREFIX).any()
    if has_anchor or pairs.empty:  # (no rows at all: layer_cka_table says what is missing)
        table = layer_cka_table(history)
        layer_names = table.drop_duplicates("layer_index").sort_values("layer_index")["layer"].tolist()
    else:  # log_layers: false, pairs only
        table = pd.DataFrame(columns=["round", "client", "layer_index", "layer", "cka"])
        layer_names = list(dict.fromkeys(pairs["metric"].str.rpartition(":")[2]))
    source = pairs if not pairs.empty else table
    available = sorted(source["round"].unique())
    rounds = [r for r in (rounds or [available[0], available[-1]]) if r in available] or [available[-1]]
    rounds = list(dict.fromkeys(rounds))
    labels = labels or {}
    fig, axes = plt.subplots(
        1, len(rounds), figsize=(6.5 * len(rounds), 3.6), squeeze=False, sharey=True, layout="constrained"
    )
    source = SourceData(CKA_RANGE)
    clipped_any = False
    if not pairs.empty:
        peer_layer = pairs["metric"].str[len("pair_cka:") :].str.rpartition(":")
        pairs["peer"], pairs["layer"] = peer_layer[0], peer_layer[2]
        pairs["value"] = pd.to_numeric(pairs["value"], errors="coerce")
        pairs["pair"] = [" | ".join(sorted((str(a), str(b)))) for a, b in zip(pairs["client"], pairs["peer"])]
        pairs["layer_index"] = pairs["layer"].map({name: i for i, name in enumerate(layer_names)})
    groups = layer_groups(layer_names)
    for ax, rnd in zip(axes[0], rounds):
        panel = f"round {rnd}"
        if pairs.empty:
            for i, (client, rows) in enumerate(table[table["round"] == rnd].groupby("client", sort=False)):
                rows = rows.sort_values("layer_index")
                style = method_style(i)
                ax.plot(rows["layer_index"], rows["cka"], ms=3, lw=1.2, label=labels.get(client, client), **style)
                for li, v in zip(rows["layer_index"], rows["cka"]):
                    source.add(
                        labels.get(client, client),
                        layer_names[int(li)],
                        v,
                        n=1,
                        n_of="client",
                        style=style_key(style),
                        panel=panel,
                    )
        else:
            per_pair = pairs[pairs["round"] == rnd].groupby(["pair", "layer_index"])["value"].mean()
            stats = per_pair.groupby("layer_index").agg(["mean", "min", "max"]).sort_index()
            count = per_pair.index.get_level_values("pair").nunique()
            low, high = np.clip(stats["min"], *CKA_RANGE), np.clip(stats["max"], *CKA_RANGE)
            clipped_any |= bool((low != stats["min"]).any() or (high != stats["max"]).any())
            ax.fill_between(
                stats.index, low, high, color=PALETTE[0], alpha=0.2, lw=0, label=f"range over {count} pairs"
            )
            mean_style = {"color": PALETTE[0], "marker": "o", "linestyle": "-"}
            ax.plot(stats.index, stats["mean"], ms=3, lw=1.4, label="mean over pairs of local models", **mean_style)
            counts = per_pair.groupby("layer_index").size()
            for li in stats.index:
                source.add("mean over pairs of local models", layer_names[int(li)], stats.loc[li, "mean"], low=low[li], high=high[li], error=f"range (min-max) over {count} pairs",
                           n=int(counts[li]), n_of="pairs", style=style_key(mean_style), panel=panel)  # fmt: skip
            anchor = table[table["round"] == rnd].groupby("layer_index")["cka"].mean().sort_index()
            if not anchor.empty:
                anchor_style = {"color": "0.3", "marker": "s", "linestyle": "--"}
                ax.plot(
                    anchor.index, anchor.values, ms=2.5, lw=1.0, label="mean CKA(local, FedAvg anchor)", **anchor_style
                )
                n_clients = table[table["round"] == rnd].groupby("layer_index")["cka"].count()
                for li, v in anchor.items():
                    source.add(
                        "mean CKA(local, FedAvg anchor)",
                        layer_names[int(li)],
                        v,
                        n=int(n_clients[li]),
                        n_of="clients",
                        style=style_key(anchor_style),
                        panel=panel,
                    )
        ax.set_title(panel)
        ax.set_xlabel("layer block (Conv / ConvT / BN, forward order; a tick per layer)")
        # One tick per layer; one label per block of layers, at its centre, in legible type.
        ax.set_xticks(range(len(layer_names)), minor=True)
        ax.set_xticks([(a + b) / 2 for _, a, b in groups], [name for name, _, _ in groups], rotation=90, fontsize=7)
        ax.tick_params(axis="x", which="major", length=0)
        for _, a, _ in groups[1:]:
            ax.axvline(a - 0.5, color="0.85", lw=0.6, zorder=0)
        ax.grid(axis="y", alpha=0.3)
    y_from_floor(axes[0][0], CKA_RANGE[0])  # shared y: every panel from CKA 0
    axes[0][0].set_ylabel("CKA(local, FedAvg anchor)" if pairs.empty else "CKA between local models")
    place_legend(axes[0][-1], fontsize=7, title="band clipped to 0-1" if clipped_any else None, title_fontsize=7)
    set_title(fig, title, fontsize=10)
    return finish(fig, out_prefix, source, synthetic, save=save_figure)


def avg_std_curves(histories: list[pd.DataFrame], metric: str, split: str = "test") -> pd.DataFrame:
    """Per round: mean over seeds of the Avg and the Std (ddof=0) across clients, in percent: the
    tables' Avg and Std row (``tables.site_std_per_seed``) of that round's scores, so the curve at a
    round equals the table of models taken at that round."""
    per_seed = []
    for h in histories:
        sel = h[(h["split"] == split) & (h["metric"] == metric)]
        if sel.empty:
            raise ValueError(f"history has no {split!r} rows for metric {metric!r}")
        wide = sel.pivot_table(index="round", columns="client", values="value", aggfunc="mean") * 100.0
        # A client missing at a round (NaN) is left out of that round, as before.
        std = [
            float(site_std_per_seed(row.dropna().to_numpy()[None])[0]) if row.notna().any() else np.nan
            for _, row in wide.iterrows()
        ]
        per_seed.append(pd.DataFrame({"avg": wide.mean(axis=1), "std": std}, index=wide.index))
    stacked = pd.concat(per_seed, keys=range(len(per_seed)))
    return stacked.groupby(level=1).mean().sort_index()


def fairness_curves(
    histories: dict[str, list[pd.DataFrame]],
    metric: str,
    out_prefix: Path,
    title: str,
    labels: dict | None = None,
    synthetic: bool = False,
) -> list[Path]:
    """Fed-LWR Fig. 2: (a) Avg and (b) Std across sites per round, one line per run (mean over seeds;
    no band: the figure shows a spread itself)."""
    labels = labels or {}
    # Avg: a score in %; Std (ddof = 0) of values in [0, 100]: at most 50 pp.
    source, avg_range, std_range = (
        SourceData(),
        score_range(metric),
        (0.0, 50.0) if score_range(metric)[1] == 100.0 else (0.0, None),
    )
    fig, (ax_avg, ax_std) = plt.subplots(1, 2, figsize=(11, 3.8), layout="constrained")
    curves = {run: avg_std_curves(runs, metric) for run, runs in histories.items() if runs}
    styles = series_styles(
        {run: (c.index.to_numpy(), c["avg"].to_numpy(), c["std"].to_numpy()) for run, c in curves.items()}, labels
    )
    for i, (run, curve) in enumerate(curves.items()):
        style, label = styles[run]
        every = mark_every(len(curve), i)
        ax_avg.plot(curve.index, curve["avg"], lw=1.5, label=label, markevery=every, **style)
        ax_std.plot(curve.index, curve["std"], lw=1.5, label=label, markevery=every, **style)
        for rnd in curve.index:
            for panel, column, y_range in (
                ("(a) Avg across sites", "avg", avg_range),
                ("(b) Std across sites (ddof = 0)", "std", std_range),
            ):
                source.add(
                    label,
                    int(rnd),
                    curve.loc[rnd, column],
                    n=len(histories[run]),
                    n_of="seeds",
                    style=style_key(style),
                    panel=panel,
                    y_range=y_range,
                )
    ax_avg.set_title("(a) Avg across sites")
    ax_std.set_title("(b) Std across sites (ddof = 0), as the tables' Std")
    words = metric_label(metric)
    for ax, name, floor in (
        (ax_avg, f"test {words} (%)", avg_range[0]),
        (ax_std, f"std of test {words}\nacross sites (pp)", std_range[0]),
    ):
        ax.set_xlabel("communication round")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        y_from_floor(ax, floor)
    counts = {len(histories[run]) for run in curves}
    n = counts.pop() if len(counts) == 1 else None
    place_legend(
        ax_std,
        len(curves),
        fontsize=8,
        title=None if n is None else f"mean of {n} seeds" if n > 1 else "1 seed",
        title_fontsize=8,
    )
    set_title(fig, title, fontsize=10)
    return finish(fig, out_prefix, source, synthetic, save=save_figure)


NO_TRAINING = "does not train here"


def fairness_bars(
    summary: pd.DataFrame,
    runs: list[str],
    out_prefix: Path,
    title: str,
    metric: str,
    labels: dict | None = None,
    flags: Flags | None = None,
    synthetic: bool = False,
) -> list[Path]:
    """``summary``: :func:`fedmedbench.report.tables.seed_summary` with ``std_row=True``. ``flags``
    (``report.flags.collect_flags`` of the same finals): a bar whose score comes from a flagged
    model carries the table's mark (``†`` collapsed) above it, and a run collapsed on every site is
    named in the legend as one that does not train here (not a broken run). Each method has its own
    (colour, hatch) pair; error bars (std over seeds) are clipped to 0-100 %."""
    labels = labels or {}
    flags = flags or {}
    runs = [r for r in runs if r in set(summary["run"])]
    if not runs:
        raise ValueError("none of the experiment's runs has results")
    clients = [c for c in dict.fromkeys(summary["client_label"]) if c not in (AVG, STD)]
    width = 0.8 / len(runs)
    # At least ~0.1 inch per bar, so that a bar shows its hatch.
    fig, ax = plt.subplots(
        figsize=(max(7, 1.6 * len(clients) + 2, 0.1 * len(runs) * len(clients) / 0.8 + 3), 4), layout="constrained"
    )
    subs = {run: summary[summary["run"] == run].set_index("client_label") for run in runs}
    bounds = score_range(metric)
    source = SourceData(bounds)
    n_seeds = int(summary["n_seeds"].max())
    error = "std over seeds"
    clipped_any = False
    # Bars of two methods equal to the last bit stand side by side; the legend says they are one result.
    ties = find_ties({run: sub.loc[clients, "mean"].to_numpy() for run, sub in subs.items()})
    for i, (run, sub) in enumerate(subs.items()):
        values = sub.loc[clients, "mean"].to_numpy(dtype=float)
        x = np.arange(len(clients)) + (i - (len(runs) - 1) / 2) * width
        name = labels.get(run, run) + (f" (= {labels.get(ties[run], ties[run])})" if ties[run] else "")
        marks = ["".join(MARKS[kind] for kind, _ in flags.get((run, c), ())) for c in clients]
        collapsed = [any(kind == "collapsed" for kind, _ in flags.get((run, c), ())) for c in clients]
        if all(collapsed):
            name += f" † collapsed on every site: {NO_TRAINING}"
        elif any(collapsed):
            name += f" † collapsed on {sum(collapsed)} of {len(clients)} sites"
        label = f"{name}: Avg {sub.loc[AVG, 'mean']:.1f}, Std {sub.loc[STD, 'mean']:.2f}"
        style = bar_style(i)
        color = style["color"]
        ax.bar(
            x,
            values,
            width,
            color=color,
            hatch=style["hatch"],
            hatchcolor=contrast_colour(color),
            hatch_linewidth=0.6,
            edgecolor="none",
            label=label,
        )
        # the table's per-site parenthesis (std over seeds); no bar for one seed
        std = sub.loc[clients, "std"].to_numpy(dtype=float)
        seeds = sub.loc[clients, "n_seeds"].to_numpy()
        draw_error_bars(ax, x, values, std, "0.1", n_seeds=seeds, capsize=1.5, bounds=bounds)
        shown = error_shown(std, values, seeds)
        low, high, clipped = clip_band(values, std, bounds)
        clipped_any |= bool(clipped and shown.any())
        for k, client in enumerate(clients):
            if marks[k]:  # the table's flag mark, above the bar
                ax.annotate(
                    marks[k],
                    (x[k], values[k]),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="0.1",
                )
            why = "; ".join(
                text for kind, text in flags.get((run, client), ()) if kind == "collapsed"
            )  # the CSV says it too
            source.add(
                name,
                client,
                values[k],
                kind="bar",
                low=low[k] if shown[k] else np.nan,
                high=high[k] if shown[k] else np.nan,
                error=error,
                n=int(seeds[k]),
                n_of="seeds",
                style=style_key(style),
                collapsed=why,
            )
    ax.set_xticks(range(len(clients)))
    ax.set_xticklabels(clients)
    ax.set_ylabel(f"test {metric_label(metric)} (%)")
    ax.set_ylim(0, 100)  # bars start at 0: their heights compare
    ax.grid(axis="y", alpha=0.3)
    clip = ", clipped to 0-100 %" if clipped_any else ""
    note = f"mean of {n_seeds} seeds; error bars: std over seeds{clip}" if n_seeds > 1 else "1 seed"
    if any(flags.get((run, c)) for run in runs for c in clients):
        note += f"\n{MARKS['collapsed']}: collapsed model (one class on the whole test split)"
    place_legend(ax, outside=True, fontsize=7, title=note, title_fontsize=7)  # bars fill the axes
    set_title(fig, title, fontsize=10)
    return finish(fig, out_prefix, source, synthetic, save=save_figure)


def select_on_test(final: dict, history: pd.DataFrame, metric: str) -> dict:
    """``final`` with its ``test`` section replaced by the test scores at the round of the best mean
    test ``metric`` (per client when the run is personalized): the official Fed-LWR selection."""
    sel = history[history["split"] == "test"]
    if sel.empty:
        raise ValueError(f"run {final.get('run')!r} seed {final.get('seed')}: history has no test rows")
    wide = sel.pivot_table(index=["round", "client"], columns="metric", values="value", aggfunc="mean")
    scores = wide[metric].unstack("client")
    rounds = sorted(set(history["round"]))
    if len(scores) < len(rounds):
        raise ValueError(
            f"run {final.get('run')!r}: test was evaluated on {len(scores)} of {len(rounds)} rounds; set curve_every: 1 for select_on: test"
        )
    test = {}
    if final["selection"]["per_client"]:
        best = {}
        for client in final["clients"]:
            best[client] = int(scores[client].idxmax())
            test[client] = wide.loc[(best[client], client)].to_dict()
    else:
        best = int(scores.mean(axis=1).idxmax())
        for client in final["clients"]:
            test[client] = wide.loc[(best, client)].to_dict()
    # best_round: the round(s) selected here, which a convergence figure marks
    return {
        **final,
        "test": test,
        "selection": {**final["selection"], "split": "test (official Fed-LWR)", "best_round": best},
    }
