"""Result tables in the papers' layout: per-client columns, an Avg column, "mean (std)" cells.

Conventions (see resources/paper_tables/README.md):

* A per-client cell is the mean over seeds and the sample standard deviation over seeds
  (ddof=1) of that client's test metric, in percent.
* The ``Avg`` cell is the mean over clients of the per-client seed means, and its parenthesis
  is the standard deviation **across clients** of those seed means (ddof=1). This is what the
  HarmoFL tables print: their Avg parenthesis equals the sample std of the printed client means.
* The optional ``Std`` row (Fed-LWR's fairness measure) is, per seed, the population standard
  deviation (ddof=0) across clients, averaged over seeds; it has no parenthesis. A table with it
  prints one spread across clients only: its ``Avg`` parenthesis is the sample std over seeds of
  the per-seed average (``–`` with one seed), as the per-client cells' (the Fed-LWR tables print
  none), never a second, ddof=1 std of the same client values beside the Std column.

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.data.store import atomic_write_text
from fedmedbench.errors import DataError
from fedmedbench.report import escape
from fedmedbench.report.flags import LATEX_MARKS, MARKS, Flags, cell_kinds, footnotes, tie_note, tied_rows
from fedmedbench.report.metric_names import metric_label

AVG = "Avg"
STD = "Std"
AGGREGATE_LABELS = (AVG, STD)
NO_STD = "–"  # shown when the spread over seeds is undefined (a single seed)
NO_RESULT = "n/a"  # shown for a run (or cell) that has no result
# Said on the face of every table made from synthetic data (the demo's twins of the datasets).
SYNTHETIC_NOTE = "SYNTHETIC DATA (demo twin): a pipeline check, not comparable to the papers."

SUMMARY_COLUMNS = ["run", "method", "client", "client_label", "mean", "std", "n_seeds"]


class ReportInputError(DataError):
    """The final.json files cannot be summarised (inconsistent clients, missing metric, ...).
    A DataError (and so a ValueError): the CLI reports it as one line."""


# --------------------------------------------------------------------------------------------
# seed summary
# --------------------------------------------------------------------------------------------


def _where(run: str, seed, source: str | None) -> str:
    text = f"run {run!r}, seed {seed!r}"
    return f"{text} ({source})" if source else text


def _metric_value(final: dict, split: str, client: str, metric: str, where: str) -> float:
    per_split = final.get(split)
    if not isinstance(per_split, dict):
        raise ReportInputError(f"{where}: final.json has no {split!r} section")
    per_client = per_split.get(client)
    if not isinstance(per_client, dict):
        raise ReportInputError(f"{where}: no {split!r} results for client {client!r} (has {sorted(per_split)})")
    if metric not in per_client:
        raise ReportInputError(
            f"{where}: metric {metric!r} missing for client {client!r} in {split!r} (available: {sorted(per_client)})"
        )
    value = per_client[metric]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ReportInputError(f"{where}: metric {metric!r} of client {client!r} is not a number: {value!r}") from None


# The spreads the tables print, one function each. The figures call these same functions
# (report/figures.py, sweeps.py, fedlwr.py), so an error bar or a Std curve is the table's number.


def std_over_seeds(values) -> np.ndarray:
    """Sample std (ddof=1) over seeds (axis 0) of ``values`` (seeds x ...): a per-client cell's
    parenthesis. NaN where fewer than two seeds have a value (one seed has no spread); a NaN (a seed
    that did not reach a round of a curve) is left out."""
    values = np.asarray(values, dtype=float)
    if not np.isnan(values).any():
        return values.std(axis=0, ddof=1) if len(values) > 1 else np.full(values.shape[1:], np.nan)
    count = (~np.isnan(values)).sum(axis=0)
    with warnings.catch_warnings():  # "degrees of freedom <= 0" where count < 2: NaN below
        warnings.simplefilter("ignore", RuntimeWarning)
        std = np.nanstd(values, axis=0, ddof=1)
    return np.where(count > 1, std, np.nan)


def std_across_clients(client_means) -> float:
    """Sample std (ddof=1) across clients of the per-client seed means: the Avg cell's parenthesis
    (what the HarmoFL tables print). NaN for one client."""
    client_means = np.asarray(client_means, dtype=float)
    return float(client_means.std(ddof=1)) if len(client_means) > 1 else math.nan


def site_std_per_seed(values) -> np.ndarray:
    """Fed-LWR's Std of each seed (a row of ``values``, seeds x clients): the population std
    (ddof=0) across clients. The Std row is its mean over seeds."""
    return np.asarray(values, dtype=float).std(axis=1, ddof=0)


def selection_rule(final: dict) -> str | None:
    """How ``final``'s test scores were selected, in words: the split and metric, per client or one
    round for all, and which rounds were eligible (``selection_window``). None when the final records
    no selection (such rows are compared with every row). Bold compares only rows of one rule: a
    model picked by another rule (PRR-FL's official last-20 % pooled selection) is another measurement."""
    sel = final.get("selection")
    if not isinstance(sel, dict):
        return None
    config = final.get("config") or {}
    window = float(config.get("selection_window", 1.0))
    rounds = "every round" if window >= 1.0 else f"the last {100 * window:g} % of rounds"
    # The run's scope setting, not what it became: under "auto" a personalized method's clients and a
    # global model's one round are the tables' one rule (runconfig.selection_scope).
    scope = config.get("selection_scope", "auto")
    who = {"per_client": "each client at its own best round", "pooled": "one round for all clients (their mean)"}.get(
        scope, "per client if personalized, else one round"
    )
    return f"{who} on {sel.get('split', 'val')} {metric_label(str(sel.get('metric', '')))}, {rounds}"


def seed_summary(
    finals: list[dict],
    metric: str,
    split: str = "test",
    sources: Sequence[Path | str] | None = None,
    std_row: bool = False,
) -> pd.DataFrame:
    """Summarise the ``final.json`` dicts of several runs and seeds, in percent.

    Returns a long DataFrame with columns ``run, method, client, client_label, mean, std,
    n_seeds``: one row per (run, client), with the mean and sample std (ddof=1) over seeds
    (std is NaN for a single seed), then one ``Avg`` row per run (mean over clients of the
    seed means; std = sample std across clients of the seed means, ddof=1), and, when
    ``std_row`` is True, one ``Std`` row per run (Fed-LWR's fairness measure: per seed the
    population std across clients, ddof=0, then the mean over seeds; its ``std`` is the sample
    std of those over seeds) while the ``Avg`` row's std becomes the sample std over seeds of
    the per-seed average (the table's one spread across clients is Std). Runs keep the order in which they first
    appear in ``finals``; clients keep the order of ``final["clients"]``. ``summary.attrs["rules"]``
    holds each run's :func:`selection_rule` (the tables bold only among rows of one rule).

    ``sources`` (optional, same length as ``finals``) names the file each dict came from, for
    error messages. Raises :class:`ReportInputError` when finals of one run disagree on their
    clients, labels or method, when a (run, seed) appears twice, or when the metric is missing.
    """
    if sources is not None and len(sources) != len(finals):
        raise ValueError(f"sources has {len(sources)} entries but finals has {len(finals)}")
    if not finals:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)

    by_run: dict[str, list[tuple[dict, str | None]]] = {}
    for i, final in enumerate(finals):
        source = str(sources[i]) if sources is not None else None
        run = final.get("run") or final.get("method")
        if not run:
            raise ReportInputError(f"final #{i}{f' ({source})' if source else ''} has neither 'run' nor 'method'")
        by_run.setdefault(str(run), []).append((final, source))

    rows: list[dict] = []
    rules: dict[str, str | None] = {}
    for run, members in by_run.items():
        first, first_source = members[0]
        first_where = _where(run, first.get("seed"), first_source)
        clients = list(first.get("clients") or [])
        if not clients:
            raise ReportInputError(f"{first_where}: final.json lists no clients")
        labels = list(first.get("client_labels") or clients)
        if len(labels) != len(clients):
            raise ReportInputError(f"{first_where}: {len(clients)} clients but {len(labels)} client_labels")
        if len(set(clients)) != len(clients) or len(set(labels)) != len(labels):
            raise ReportInputError(f"{first_where}: duplicate clients or client_labels")
        if set(labels) & set(AGGREGATE_LABELS):
            raise ReportInputError(f"{first_where}: client_labels {labels} use a reserved label {AGGREGATE_LABELS}")
        method = first.get("method", run)
        rules[run] = selection_rule(first)
        seeds_seen: dict = {}
        values = np.empty((len(members), len(clients)))
        for j, (final, source) in enumerate(members):
            seed = final.get("seed")
            where = _where(run, seed, source)
            other_clients = list(final.get("clients") or [])
            other_labels = list(final.get("client_labels") or other_clients)
            if other_clients != clients or other_labels != labels:
                raise ReportInputError(
                    f"finals of run {run!r} disagree on clients: {first_where} has "
                    f"{list(zip(clients, labels))}, {where} has "
                    f"{list(zip(other_clients, other_labels))}"
                )
            if final.get("method", run) != method:
                raise ReportInputError(
                    f"finals of run {run!r} disagree on method: {method!r} ({first_where}) "
                    f"vs {final.get('method')!r} ({where})"
                )
            if seed in seeds_seen:
                raise ReportInputError(f"run {run!r} has seed {seed!r} twice: {seeds_seen[seed]} and {where}")
            seeds_seen[seed] = where
            for k, client in enumerate(clients):
                values[j, k] = 100.0 * _metric_value(final, split, client, metric, where)

        n_seeds = len(members)
        client_means = values.mean(axis=0)
        client_stds = std_over_seeds(values)
        for client, label, m, s in zip(clients, labels, client_means, client_stds):
            rows.append(
                dict(
                    run=run,
                    method=method,
                    client=client,
                    client_label=label,
                    mean=float(m),
                    std=float(s),
                    n_seeds=n_seeds,
                )
            )
        # With a Std column the across-client spread is printed once, as Std (ddof=0); Avg's
        # parenthesis is then a spread over seeds, like every per-client cell's.
        avg_std = float(std_over_seeds(values.mean(axis=1))) if std_row else std_across_clients(client_means)
        rows.append(
            dict(
                run=run,
                method=method,
                client=AVG,
                client_label=AVG,
                mean=float(client_means.mean()),
                std=avg_std,
                n_seeds=n_seeds,
            )
        )
        if std_row:
            # One convention everywhere (this table, Fig. 2, the fairness bars): each run's
            # population std across sites (the paper's single-run figure), then its mean over
            # seeds; the std of the seed means would be biased low against the paper's.
            per_seed = site_std_per_seed(values)
            rows.append(
                dict(
                    run=run,
                    method=method,
                    client=STD,
                    client_label=STD,
                    mean=float(per_seed.mean()),
                    std=float(std_over_seeds(per_seed)),
                    n_seeds=n_seeds,
                )
            )

    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    summary.attrs.update(metric=metric, split=split, rules=rules)
    return summary


# --------------------------------------------------------------------------------------------
# formatting
# --------------------------------------------------------------------------------------------


def format_cell(mean: float, std: float, decimals: int = 2, with_std: bool = True) -> str:
    """``90.04 (1.27)``; ``90.04 (–)`` when the std is undefined; ``n/a`` without a mean."""
    if mean is None or pd.isna(mean):
        return NO_RESULT
    text = f"{mean:.{decimals}f}"
    if not with_std:
        return text
    spread = NO_STD if std is None or pd.isna(std) else f"{std:.{decimals}f}"
    return f"{text} ({spread})"


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters (``_``, ``%``, ``&``, ...) in plain text."""
    return escape.latex(text)


def _md_escape(text: str) -> str:
    return escape.markdown(text)


def _with_sentence(text: str, sentence: str | None) -> str:
    """``text`` followed by ``sentence`` (none: ``text`` as it is), a full stop between them."""
    if not sentence:
        return text
    return f"{text}{'' if text.rstrip().endswith(('.', ':', ';')) else '.'} {sentence}"


def _column_order(summary: pd.DataFrame) -> list[str]:
    labels = [str(x) for x in dict.fromkeys(summary["client_label"]) if x not in AGGREGATE_LABELS]
    present = set(summary["client_label"])
    return labels + [AVG] + ([STD] if STD in present else [])


def _layout(
    summary: pd.DataFrame,
    rows: list[tuple[str, str]],
    columns: list[str],
    decimals: int,
    higher_is_better: bool,
    flagged: set[int] = frozenset(),
    apart: set[int] = frozenset(),
):
    """Cells as text (without bold) plus the row indices holding the best Avg. A ``flagged`` row
    (its Avg averages a collapsed model or a split without foreground) is never the best: its
    score measures no skill, so a table where every model collapsed bolds nothing. An ``apart`` row
    (selected under another rule than the table's) is not compared either."""
    cells: list[list[str]] = []
    avgs: list[float] = []
    for run, _display in rows:
        sub = summary[summary["run"] == run].set_index("client_label")
        line = []
        for col in columns:
            if col in sub.index:
                rec = sub.loc[col]
                line.append(format_cell(rec["mean"], rec["std"], decimals, with_std=col != STD))
            else:
                line.append(NO_RESULT)
        cells.append(line)
        avgs.append(float(sub.loc[AVG, "mean"]) if AVG in sub.index else math.nan)
    eligible = [i for i, a in enumerate(avgs) if not math.isnan(a) and i not in flagged and i not in apart]
    best: set[int] = set()
    if eligible:
        finite = [avgs[i] for i in eligible]
        target = round(max(finite) if higher_is_better else min(finite), decimals)
        best = {i for i in eligible if round(avgs[i], decimals) == target}
    return cells, best


@dataclass
class TableLayout:
    """A table's cells as printed (without bold or marks) and what goes with them: the rows with
    the best Avg, each cell's flag kinds, the footnotes, and the notes on rows that tie."""

    rows: list[tuple[str, str]]
    columns: list[str]
    cells: list[list[str]]
    best: set[int]
    kinds: list[list[list[str]]]
    footnotes: list[tuple[str, str]]
    tie_notes: list[str]
    tied_with: dict[int, list[str]]
    rule_notes: list[str] = field(default_factory=list)  # rows left out of the bold comparison, and why

    @property
    def avg_index(self) -> int | None:
        return self.columns.index(AVG) if AVG in self.columns else None


def _apart(rows: list[tuple[str, str]], rules: dict) -> tuple[set[int], list[str]]:
    """The rows selected under another rule than the table's (the rule most rows with a rule share;
    a tie: the first such row's), and a note naming them. Rows without a rule are never apart."""
    known = [rules.get(run) for run, _ in rows if rules.get(run)]
    if len(set(known)) < 2:
        return set(), []
    counts = {rule: known.count(rule) for rule in dict.fromkeys(known)}
    main = max(counts, key=counts.get)  # first maximal in row order
    apart = {i for i, (run, _) in enumerate(rows) if rules.get(run) and rules[run] != main}
    others = "; ".join(f"{rows[i][1]} ({rules[rows[i][0]]})" for i in sorted(apart))
    return apart, [f"Bold compares only rows selected the same way ({main}); not compared: {others}."]


def table_layout(
    summary: pd.DataFrame,
    rows: list[tuple[str, str]],
    columns: list[str] | None = None,
    decimals: int = 2,
    higher_is_better: bool = True,
    flags: Flags | None = None,
    rules: dict[str, str | None] | None = None,
) -> TableLayout:
    """The layout :func:`write_table` and the report print (see there for the arguments)."""
    if columns is None:
        columns = _column_order(summary) if len(summary) else [AVG]
    columns = [str(c) for c in columns]
    flags = flags or {}
    sites = [c for c in columns if c not in AGGREGATE_LABELS]
    kinds = [[cell_kinds(flags, run, col, sites, AGGREGATE_LABELS) for col in columns] for run, _ in rows]
    # A row whose Avg averages a flagged site (or, without an Avg column, any flagged cell) is never bold.
    flagged = {i for i, line in enumerate(kinds) if (line[columns.index(AVG)] if AVG in columns else any(line))}
    # Each row's selection rule (``selection_rule``; by default as seed_summary recorded it).
    apart, rule_notes = _apart(rows, summary.attrs.get("rules", {}) if rules is None else rules)
    cells, best = _layout(summary, rows, columns, decimals, higher_is_better, flagged, apart)
    ties = tied_rows(cells, [j for j, c in enumerate(columns) if c not in AGGREGATE_LABELS], NO_RESULT)
    return TableLayout(
        rows=list(rows),
        columns=columns,
        cells=cells,
        best=best,
        kinds=kinds,
        footnotes=footnotes(flags, [run for run, _ in rows], columns, AGGREGATE_LABELS),
        tie_notes=[tie_note([rows[i][1] for i in group]) for group in ties],
        tied_with={i: [rows[k][1] for k in group if k != i] for group in ties for i in group},
        rule_notes=rule_notes,
    )


def markdown_table(layout: TableLayout) -> list[str]:
    """The Markdown table (best Avg bold, flag marks after the cells), then its footnotes and notes."""
    md = ["| Method | " + " | ".join(_md_escape(c) for c in layout.columns) + " |"]
    md.append("|---|" + "---:|" * len(layout.columns))
    for i, ((_run, display), line) in enumerate(zip(layout.rows, layout.cells)):
        shown = [
            (f"**{_md_escape(c)}**" if (i in layout.best and j == layout.avg_index) else _md_escape(c))
            + (" " + "".join(MARKS[k] for k in layout.kinds[i][j]) if layout.kinds[i][j] else "")
            for j, c in enumerate(line)
        ]
        md.append(f"| {_md_escape(display)} | " + " | ".join(shown) + " |")
    for kind, text in layout.footnotes:
        md += ["", f"{MARKS[kind]} {_md_escape(text)}" if kind else _md_escape(text)]
    for text in layout.tie_notes + layout.rule_notes:
        md += ["", f"Note: {_md_escape(text)}"]
    return md


def write_table(
    summary: pd.DataFrame,
    out_prefix: Path | str,
    rows: list[tuple[str, str]],
    caption: str,
    decimals: int = 2,
    columns: list[str] | None = None,
    higher_is_better: bool = True,
    metric: str | None = None,
    flags: Flags | None = None,
    synthetic: bool = False,
    rules: dict[str, str | None] | None = None,
) -> list[Path]:
    """Write ``<out_prefix>.csv``, ``.md`` and ``.tex`` for the runs in ``rows``.

    ``rows`` is ``[(run, display_name), ...]`` in table order; a run absent from ``summary``
    gets ``n/a`` everywhere. Columns are the client labels in summary order, then ``Avg``
    (and ``Std`` when the summary has that row), unless ``columns`` is given. Cells read
    ``mean (std)``; the best Avg (ties included) is bold in Markdown and LaTeX. The CSV is long:
    ``row, run, client, mean, std, n_seeds`` with unrounded values. Returns the written paths.

    ``metric`` (a key): the caption names it in words (``report.metric_names``). ``flags`` (from
    ``report.flags.collect_flags``): a flagged cell, and the Avg/Std that average it, carry the
    flag's mark (``†`` a collapsed model, ``‡`` a test split without foreground) with a footnote
    under the table; the CSV then has a ``note`` column. Rows equal on every site to the last
    printed digit get a note naming them (in the CSV's ``note`` too). A flagged row's Avg is never
    bold. ``synthetic``: the table says so on its face (:data:`SYNTHETIC_NOTE` under the caption in
    Markdown, in the LaTeX caption, and a ``synthetic`` column in the CSV). ``rules`` (run → its
    :func:`selection_rule`; default: ``summary.attrs["rules"]`` from :func:`seed_summary`): bold
    compares only the rows of the table's rule (most rows'); a note names the rows left out.
    """
    out_prefix = Path(out_prefix)
    layout = table_layout(summary, rows, columns, decimals, higher_is_better, flags, rules)
    columns, cells, kinds, tied_with = layout.columns, layout.cells, layout.kinds, layout.tied_with
    flags = flags or {}
    metric_line = f"Metric: {metric_label(metric)}, in %." if metric else None

    # CSV (long)
    records = []
    for i, (run, display) in enumerate(rows):
        sub = summary[summary["run"] == run].set_index("client_label")
        for j, col in enumerate(columns):
            if col in sub.index:
                rec = sub.loc[col]
                records.append(
                    dict(row=display, run=run, client=col, mean=rec["mean"], std=rec["std"], n_seeds=rec["n_seeds"])
                )
            else:
                records.append(dict(row=display, run=run, client=col, mean=math.nan, std=math.nan, n_seeds=0))
            note = [text for kind, text in flags.get((run, col), ()) if kind in kinds[i][j]]
            note += [f"{MARKS[kind]} averages a flagged site" for kind in kinds[i][j] if col in AGGREGATE_LABELS]
            note += [f"identical on every site to {', '.join(tied_with[i])}"] if i in tied_with else []
            records[-1]["note"] = "; ".join(note)
    # The note column only where a table has a note: an unflagged table keeps its columns.
    csv_columns = ["row", "run", "client", "mean", "std", "n_seeds"]
    if any(r["note"] for r in records):
        csv_columns.append("note")
    if synthetic:  # only then: a table of real data keeps its columns
        csv_columns.append("synthetic")
        for r in records:
            r["synthetic"] = True
    csv_text = pd.DataFrame(records, columns=csv_columns).to_csv(index=False)

    # Markdown
    md = [f"**{_md_escape(caption)}**", ""] + ([f"**{SYNTHETIC_NOTE}**", ""] if synthetic else [])
    md += [_md_escape(metric_line), ""] if metric_line else []
    md_text = "\n".join(md + markdown_table(layout)) + "\n"

    # LaTeX (booktabs)
    tex_caption = f"{SYNTHETIC_NOTE} {caption}" if synthetic else caption
    tex = [
        r"% Generated by fedmedbench.report.tables; requires \usepackage{booktabs}",
        r"\begin{table}[t]",
        r"\centering",
        rf"\caption{{{latex_escape(_with_sentence(tex_caption, metric_line))}}}",
        r"\begin{tabular}{l" + "c" * len(columns) + "}",
        r"\toprule",
        "Method & " + " & ".join(latex_escape(c) for c in columns) + r" \\",
        r"\midrule",
    ]
    for i, ((_run, display), line) in enumerate(zip(rows, cells)):
        shown = [
            (rf"\textbf{{{latex_escape(c)}}}" if (i in layout.best and j == layout.avg_index) else latex_escape(c))
            + "".join(LATEX_MARKS[k] for k in kinds[i][j])
            for j, c in enumerate(line)
        ]
        tex.append(latex_escape(display) + " & " + " & ".join(shown) + r" \\")
    tex += [r"\bottomrule", r"\end{tabular}"]
    below = [(LATEX_MARKS[kind] + " " if kind else "") + latex_escape(text) for kind, text in layout.footnotes]
    below += [latex_escape(f"Note: {text}") for text in layout.tie_notes + layout.rule_notes]
    if below:
        tex += [r"\par\smallskip\footnotesize", " \\\\\n".join(below)]
    tex += [r"\end{table}"]
    tex_text = "\n".join(tex) + "\n"

    written = []
    for suffix, text in ((".csv", csv_text), (".md", md_text), (".tex", tex_text)):
        written.append(atomic_write_text(out_prefix.with_name(out_prefix.name + suffix), text))
    return written
