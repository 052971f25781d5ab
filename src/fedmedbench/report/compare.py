"""Put our numbers next to the published ones and write the reproduction report.

Published numbers come from ``resources/paper_tables/*.csv`` (transcribed from the papers; see
README.md and PROVENANCE.md there). All values are in percent.

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.errors import DataError
from fedmedbench.report import escape

from .flags import MARKS, cell_kinds, footnotes, tie_note, tied_rows
from .tables import AGGREGATE_LABELS, AVG, NO_RESULT, STD, atomic_write_text, format_cell, markdown_table

PAPER_COLUMNS = ["paper", "table", "task", "method", "method_id", "client", "metric", "mean", "std"]
COMPARISON_COLUMNS = [
    "run",
    "method_id",
    "client",
    "ours_mean",
    "ours_std",
    "n_seeds",
    "paper_mean",
    "paper_std",
    "diff",
]
DEFAULT_PAPER_SOURCE = (
    "`resources/paper_tables/` — the papers' result tables transcribed by hand into CSV "
    "(see `README.md` and `PROVENANCE.md` in that folder)"
)


def _decimals(text: str) -> int:
    text = text.strip()
    return len(text.split(".", 1)[1]) if "." in text else 0


def _check_numbers(csv_path: Path | str, raw: pd.DataFrame) -> None:
    """Every ``mean`` a number, every ``std`` a number or empty (a hand-transcribed table may carry
    a footnote mark like ``90.04*``); names the file, line, column and the cell."""
    for column, may_be_empty in (("mean", False), ("std", True)):
        text = raw[column].str.strip()
        empty = text == ""
        bad = pd.to_numeric(text.mask(empty), errors="coerce").isna()
        if may_be_empty:
            bad &= ~empty
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            row = raw.iloc[i]
            what = "is empty" if text.iloc[i] == "" else "is not a number"
            raise DataError(
                f"{csv_path}: line {i + 2} (method_id {row['method_id']!r}, client {row['client']!r}), "
                f"column {column!r}: {raw[column].iloc[i]!r} {what}"
            )


def empty_paper_table() -> pd.DataFrame:
    """No published numbers (a user's own experiment): :func:`compare` then shows ours alone."""
    return pd.DataFrame(columns=PAPER_COLUMNS)


def load_paper_table(csv_path: Path | str) -> pd.DataFrame:
    """Read one ``resources/paper_tables/*.csv`` result table.

    Returns the columns ``paper, table, task, method, method_id, client, metric, mean, std``
    (``mean``/``std`` as floats in percent, ``std`` NaN where the paper prints none) plus
    ``decimals``, the number of decimals the paper printed. Raises DataError (a ValueError) naming
    the file for a file that is not a result table (e.g. the PRR-FL dataset table), and its line and
    column for a cell that is not a number. The one reader of these tables: every report uses it.
    """
    try:
        raw = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise DataError(f"{csv_path}: empty file; expected a paper result table with columns {PAPER_COLUMNS}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise DataError(f"{csv_path}: not a readable CSV ({' '.join(str(err).split())})") from None
    missing = [c for c in PAPER_COLUMNS if c not in raw.columns]
    if missing:
        raise DataError(f"{csv_path}: not a paper result table, lacks columns {missing}")
    _check_numbers(csv_path, raw)
    out = raw[PAPER_COLUMNS].copy()
    out["decimals"] = out["mean"].map(_decimals)
    for col in ("mean", "std"):
        out[col] = pd.to_numeric(out[col].str.strip().replace("", np.nan), errors="raise")
    out["table"] = out["table"].str.strip()
    return out


def _our_cells(sub: pd.DataFrame, want_std_row: bool) -> dict[str, tuple[float, float, int]]:
    cells = {str(r.client_label): (float(r.mean), float(r.std), int(r.n_seeds)) for r in sub.itertuples(index=False)}
    if want_std_row and STD not in cells:
        # Fed-LWR's fairness Std: population std (ddof=0) across clients of the seed means
        means = [m for label, (m, _s, _n) in cells.items() if label not in AGGREGATE_LABELS]
        if means:
            n = max(n for _m, _s, n in cells.values())
            cells[STD] = (float(np.std(means, ddof=0)), math.nan, n)
    return cells


def compare(
    summary: pd.DataFrame,
    paper: pd.DataFrame,
    run_to_method_id: Mapping[str, str],
    client_map: Mapping[str, str] | None = None,
    metric: str | None = None,
) -> pd.DataFrame:
    """Join our cells with the paper's.

    ``summary`` comes from :func:`fedmedbench.report.tables.seed_summary`; ``paper`` from
    :func:`load_paper_table`. Each run in ``run_to_method_id`` (in that order) is matched with
    the paper rows of its ``method_id``, client label by client label (``client_map`` renames
    our labels to the paper's, e.g. ``{"A": "Site1"}``; ``Avg``/``Std`` match as is). When the
    paper has a ``Std`` row (Fed-LWR) and the summary has none, ours is computed as the
    population std across clients of our client means. ``metric`` selects the paper rows when
    the table holds several metrics (PRR-FL: f1 and auc). Runs of the summary not in
    ``run_to_method_id`` are left out; a mapped run without results keeps NaN ``ours_*``; a run
    whose method the paper lacks (e.g. Solo) keeps NaN ``paper_*``.

    Returns columns ``run, method_id, client, ours_mean, ours_std, n_seeds, paper_mean,
    paper_std, diff`` with ``diff = ours_mean - paper_mean`` in percentage points.
    """
    client_map = dict(client_map or {})
    if metric is not None:
        paper = paper[paper["metric"] == metric]
        if paper.empty:
            raise ValueError(f"the paper table has no rows for metric {metric!r}")
    metrics = sorted(set(paper["metric"]))
    if len(metrics) > 1:
        raise ValueError(f"the paper table holds several metrics {metrics}: pass metric=")
    dup = paper[paper.duplicated(["method_id", "client"], keep=False)]
    if not dup.empty:
        raise ValueError(
            "the paper rows are not unique per (method_id, client); filter to one table first: "
            f"{dup[['paper', 'table', 'method_id', 'client']].drop_duplicates().values.tolist()}"
        )
    paper_has_std_row = bool((paper["client"] == STD).any())

    rows: list[dict] = []
    for run, method_id in run_to_method_id.items():
        ours = _our_cells(summary[summary["run"] == run], paper_has_std_row)
        ours = {client_map.get(label, label): v for label, v in ours.items()}
        theirs = {
            str(r.client): (float(r.mean), float(r.std))
            for r in paper[paper["method_id"] == method_id].itertuples(index=False)
        }
        if ours and theirs:
            ours_clients = {c for c in ours if c not in AGGREGATE_LABELS}
            theirs_clients = {c for c in theirs if c not in AGGREGATE_LABELS}
            if theirs_clients and not ours_clients & theirs_clients:
                raise ValueError(
                    f"run {run!r}: none of our client labels {sorted(ours_clients)} matches the "
                    f"paper's {sorted(theirs_clients)} for {method_id!r}; pass client_map="
                )
        labels = list(ours) + [c for c in theirs if c not in ours]
        # aggregates last, Avg before Std, as in the papers
        labels = [c for c in labels if c not in AGGREGATE_LABELS] + [c for c in (AVG, STD) if c in labels]
        for label in labels:
            o_mean, o_std, n = ours.get(label, (math.nan, math.nan, 0))
            p_mean, p_std = theirs.get(label, (math.nan, math.nan))
            rows.append(
                dict(
                    run=run,
                    method_id=method_id,
                    client=label,
                    ours_mean=o_mean,
                    ours_std=o_std,
                    n_seeds=n,
                    paper_mean=p_mean,
                    paper_std=p_std,
                    diff=o_mean - p_mean,
                )
            )
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------

SYNTHETIC_WARNING = (
    "> **WARNING — SYNTHETIC DATA.** Every number below was computed on SYNTHETIC data (the "
    "demo run), not on the real datasets. The results are a smoke test of the pipeline only "
    "and are **not comparable** to the papers' numbers; the Δ column is there to exercise the "
    "comparison, not to judge the reproduction."
)


def _md(text) -> str:
    """A name or title as Markdown text (HTML in a site or run name shows as text, never as markup)."""
    return escape.markdown(text)


def _fmt_seeds(seeds) -> str:
    if isinstance(seeds, (list, tuple, set)):
        seeds = list(seeds)
        return f"{', '.join(map(str, seeds))} ({len(seeds)} seed{'s' if len(seeds) != 1 else ''})"
    return str(seeds)


def _fmt_value(value) -> str:
    if isinstance(value, Mapping):
        return "; ".join(f"{k}: {_fmt_value(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def _figure_link(figure: Path | str, out_md: Path) -> str:
    """Link to ``figure`` relative to the report's folder (relative inputs are taken relative
    to the working directory, as Snakemake passes them)."""
    fig = Path(figure)
    rel = os.path.relpath(fig.resolve(), out_md.parent.resolve())
    # Percent-encoded: a space or parenthesis in a folder name would end the link early.
    return urllib.parse.quote(Path(rel).as_posix())


def _diff_cell(diff: float, decimals: int) -> str:
    return "–" if pd.isna(diff) else f"{diff:+.{decimals}f}"


def _comparison_flags(
    comp: pd.DataFrame, flags: Mapping, names: Mapping[str, str], decimals: int
) -> tuple[list[str], list[str]]:
    """The marks of each row's ``ours`` cell and the lines under the table: footnotes of the flagged
    cells, then a note on runs whose every site cell of ours is the same (see ``report.flags``)."""
    sites = {
        run: [c for c in group.loc[group["ours_mean"].notna(), "client"] if c not in AGGREGATE_LABELS]
        for run, group in comp.groupby("run", sort=False)
    }
    marks = [
        "".join(MARKS[k] for k in cell_kinds(flags, r.run, str(r.client), sites[r.run], AGGREGATE_LABELS))
        for r in comp.itertuples(index=False)
    ]
    runs = list(dict.fromkeys(comp["run"]))
    columns = list(dict.fromkeys(str(c) for c in comp["client"]))
    lines = [
        f"{MARKS[kind]} {_md(text)}" if kind else _md(text)
        for kind, text in footnotes(flags, runs, columns, AGGREGATE_LABELS)
    ]
    site_columns = [c for c in columns if c not in AGGREGATE_LABELS]
    ours = {
        (r.run, str(r.client)): format_cell(r.ours_mean, r.ours_std, decimals) for r in comp.itertuples(index=False)
    }
    cells = [[ours.get((run, c), NO_RESULT) for c in site_columns] for run in runs]
    for group in tied_rows(cells, range(len(site_columns)), NO_RESULT):
        lines.append(f"Note: {_md(tie_note([names[runs[i]] for i in group]))}")
    return marks, lines


def _section_lines(section: Mapping, out_md: Path, decimals: int) -> list[str]:
    """A section is a comparison with a paper's table (needs ``comparison`` and ``metric_note``),
    or our per-site table alone (``table``: a ``tables.TableLayout``, for an experiment without a
    published table), and/or a figure. ``flags`` (``report.flags.collect_flags``) marks the
    comparison's flagged cells."""
    if "title" not in section or not ("comparison" in section or "table" in section or section.get("figure")):
        raise ValueError(f"report section needs a title and a comparison, a table or a figure: {sorted(section)}")
    if ("comparison" in section or "table" in section) and "metric_note" not in section:
        raise ValueError(f"report section {section['title']!r} has a table but no metric_note")
    comp: pd.DataFrame | None = section.get("comparison")
    labels: Mapping[str, str] = section.get("labels") or {}
    lines = [f"## {_md(section['title'])}", ""]
    if section.get("paper_source"):
        lines += [f"Published numbers: {section['paper_source']}.", ""]
    if section.get("metric_note"):
        lines += [f"Metric: {section['metric_note']}", ""]
    for note in section.get("notes") or ():
        lines += [f"Note: {_md(note)}", ""]

    if "table" in section:
        layout = section["table"]
        lines += (
            (markdown_table(layout) + [""])
            if layout.rows and len(layout.cells)
            else ["No results in this section.", ""]
        )
    if comp is None:
        pass
    elif comp.empty:
        lines += ["No results in this section.", ""]
    else:
        names = {}
        for r in comp.itertuples(index=False):
            names[r.run] = labels.get(r.run, f"{r.run} ({r.method_id})" if r.method_id != r.run else r.run)
        marks, flag_lines = _comparison_flags(comp, section.get("flags") or {}, names, decimals)
        lines += ["| method | client | ours | paper | Δ |", "|---|---|---:|---:|---:|"]
        for k, r in enumerate(comp.itertuples(index=False)):
            name = names[r.run]
            is_std = r.client == STD
            ours = format_cell(r.ours_mean, r.ours_std, decimals, with_std=not is_std) + (
                f" {marks[k]}" if marks[k] else ""
            )
            paper = (
                NO_RESULT
                if pd.isna(r.paper_mean)
                else format_cell(r.paper_mean, r.paper_std, decimals, with_std=not pd.isna(r.paper_std))
            )
            lines.append(f"| {_md(name)} | {_md(r.client)} | {ours} | {paper} | {_diff_cell(r.diff, decimals)} |")
        lines.append("")
        has_paper = comp["paper_mean"].notna()
        both = has_paper & comp["ours_mean"].notna()
        if both.any():
            absdiff = comp.loc[both, "diff"].abs()
            summary = (
                f"Mean |Δ| over the {int(both.sum())} cells that have a published number: "
                f"{absdiff.mean():.{decimals}f} percentage points "
                f"(largest {absdiff.max():.{decimals}f})."
            )
        else:
            summary = "No cell of this section has both our result and a published number."
        missing = int((has_paper & comp["ours_mean"].isna()).sum())
        if missing:
            summary += f" {missing} published cell(s) have no result of ours."
        lines += [summary, ""]
        for line in flag_lines:
            lines += [line, ""]

    if section.get("figure"):
        link = _figure_link(section["figure"], out_md)
        lines += [f"![{_md(section['title'])}]({link})", ""]
        # Its numbers, one row per plotted point, bar or band (written beside every figure).
        data = Path(section["figure"]).with_suffix(".csv")
        lines += [
            f"Source data of the figure: [{_md(data.name)}]({_figure_link(data, out_md)}) (one row per plotted point, bar or band).",
            "",
        ]
    return lines


OWN_DATA_NOTE = (
    "Our test results per site, with no published table to compare with (an experiment without "
    "`paper_table`): this report reproduces no paper."
)


def _reading_guide(reproduction: bool) -> list[str]:
    """How to read the cells (and, with published numbers, the Δ)."""
    cells = (
        "Cells read `mean (std)` in percent. Per client: mean and sample standard deviation "
        "(ddof=1) over seeds (`–` with a single seed). `Avg`: mean over clients of the seed "
        "means, with the standard deviation **across clients** (ddof=1)"
    )
    # One spread across clients per table: where a Std column is shown, Avg's parenthesis is over seeds.
    std = (
        "population standard deviation (ddof=0) across clients, averaged over seeds; in a table with "
        "a `Std` column, `Avg`'s parenthesis is the sample standard deviation over seeds of the average"
    )
    if not reproduction:
        return [OWN_DATA_NOTE, "", cells + f"; the best is bold. `Std`, where shown: {std}."]
    return [cells + f" as HarmoFL prints it. `Std` (Fed-LWR): {std}. Δ = ours − paper, in percentage points."]


def write_report(
    sections: list[dict],
    out_md: Path | str,
    synthetic: bool,
    run_info: dict,
    title: str | None = None,
    decimals: int = 2,
) -> Path:
    """Write the Markdown report (atomically) and return its path.

    ``sections``: dicts with ``title``, ``comparison`` (from :func:`compare`) or ``table`` (from
    :func:`fedmedbench.report.tables.table_layout`: our per-site table, for an experiment without a
    published table), ``metric_note`` (which metric and how it is defined), and optionally
    ``figure`` (path of a PNG; linked relative to the report), ``labels`` (run → display name),
    ``flags`` (``report.flags.collect_flags``) and ``paper_source`` (e.g. "HarmoFL, Table 1
    (prostate)"). ``run_info`` must give ``seeds`` and ``rounds``; ``paper_source`` overrides the
    default description of where published numbers come from; any other entries are listed as
    they are. With ``synthetic=True`` the report opens with a warning that the numbers are a
    pipeline smoke test, not comparable to the papers. A report without any comparison (a user's
    own data) is titled and described as our results alone: it claims to reproduce nothing.
    """
    out_md = Path(out_md)
    missing = [k for k in ("seeds", "rounds") if k not in run_info]
    if missing:
        raise ValueError(f"run_info must state {missing} (the report always gives them)")
    reproduction = any("comparison" in section for section in sections)
    if title is None:
        title = "fedmedbench reproduction report" if reproduction else "fedmedbench report"

    lines = [f"# {_md(title)}", ""]
    if synthetic:
        lines += [SYNTHETIC_WARNING if reproduction else SYNTHETIC_WARNING.split("; the Δ column")[0] + ".", ""]
    lines += [
        f"- Seeds: {_fmt_seeds(run_info['seeds'])}",
        f"- Communication rounds: {_fmt_value(run_info['rounds'])}",
    ]
    if reproduction:
        lines.append(f"- Published numbers: {run_info.get('paper_source', DEFAULT_PAPER_SOURCE)}")
    for key, value in run_info.items():
        if key not in ("seeds", "rounds", "paper_source"):
            lines.append(f"- {str(key).replace('_', ' ').capitalize()}: {_fmt_value(value)}")
    lines += ["", *_reading_guide(reproduction), ""]
    for section in sections:
        lines += _section_lines(section, out_md, decimals)
    return atomic_write_text(out_md, "\n".join(lines).rstrip("\n") + "\n")
