"""Scores that measure no model, and methods a table cannot tell apart: the marks, footnotes and
notes every table and the report print with them.

A run's ``final.json`` holds ``flags``: per client, ``collapsed`` (the selected model predicts one
class on the whole test split) and ``no_foreground`` (the test split has no foreground pixel), each
with the reason in words (``fedmedbench.metrics.degenerate_flags``). A table cell that uses a flagged
client's score carries the flag's mark, its ``Avg``/``Std`` (which average it) too, and the footnote
under the table says which run, site and seed and why. Rows whose every site cell is the same
to the last printed digit get a note naming them: two methods that are one in effect (FedNova is
FedAvg when every client takes the same number of local steps).

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence

KINDS = ("collapsed", "no_foreground")  # footnote order
MARKS = {"collapsed": "†", "no_foreground": "‡"}
LATEX_MARKS = {"collapsed": r"\textsuperscript{\dag}", "no_foreground": r"\textsuperscript{\ddag}"}
MEANING = {
    "collapsed": "a collapsed model: its score measures no skill",
    "no_foreground": "foreground Dice is undefined there and Dice incl. background scores only the background",
}
AGGREGATE_NOTE = "A marked Avg or Std averages a marked site."

# (run, client label) -> [(kind, footnote text), ...]
Flags = dict[tuple[str, str], list[tuple[str, str]]]


def collect_flags(finals: Iterable[Mapping], names: Mapping[str, str] | None = None) -> Flags:
    """The flags of the runs in ``finals`` by (run, client label), each with its footnote text.
    ``names`` maps a run to its display name (default: the run). A ``collapsed`` flag describes the
    model selected on validation: a final whose test scores were taken at another round
    (``select_on: test``) keeps only its ``no_foreground`` flags, which belong to the split."""
    names = names or {}
    out: Flags = {}
    for final in finals:
        run = str(final.get("run") or final.get("method"))
        labels = dict(zip(final.get("clients") or [], final.get("client_labels") or final.get("clients") or []))
        on_val = (final.get("selection") or {}).get("split", "val") == "val"
        for client, flags in (final.get("flags") or {}).items():
            label = str(labels.get(client, client))
            for kind in KINDS:
                if kind not in flags or (kind == "collapsed" and not on_val):
                    continue
                if kind == "collapsed":
                    text = f"{names.get(run, run)}, {label}, seed {final.get('seed')}: {flags[kind]} ({MEANING[kind]})."
                else:
                    text = f"{label}: {flags[kind]} ({MEANING[kind]})."
                entry = (kind, text)
                if entry not in out.setdefault((run, label), []):
                    out[(run, label)].append(entry)
    return out


def cell_kinds(flags: Flags, run: str, column: str, sites: Sequence[str], aggregates: Sequence[str]) -> list[str]:
    """The flag kinds of one cell: its own, or for an aggregate column (Avg, Std) its sites'."""
    columns = sites if column in aggregates else [column]
    found = {kind for col in columns for kind, _ in flags.get((run, col), ())}
    return [kind for kind in KINDS if kind in found]


def footnotes(
    flags: Flags, runs: Sequence[str], columns: Sequence[str], aggregates: Sequence[str]
) -> list[tuple[str, str]]:
    """(kind, text) of every footnote of a table over ``runs`` x ``columns``, each once, in table
    order; ("", AGGREGATE_NOTE) last when an aggregate column carries a mark."""
    out: list[tuple[str, str]] = []
    for kind in KINDS:
        for run in runs:
            for column in columns:
                for entry in flags.get((run, column), ()):
                    if entry[0] == kind and entry not in out:
                        out.append(entry)
    sites = [c for c in columns if c not in aggregates]
    if any(cell_kinds(flags, run, c, sites, aggregates) for run in runs for c in columns if c in aggregates):
        out.append(("", AGGREGATE_NOTE))
    return out


def tied_rows(cells: Sequence[Sequence[str]], site_indices: Sequence[int], missing: str) -> list[list[int]]:
    """Groups (of two or more) of row indices whose cell texts are equal on every site column: the
    printed numbers cannot tell them apart. Rows lacking a site's result are left out."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, line in enumerate(cells):
        key = tuple(line[j] for j in site_indices)
        if key and missing not in key:
            groups.setdefault(key, []).append(i)
    return [members for members in groups.values() if len(members) > 1]


def tie_note(names: Sequence[str]) -> str:
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    return f"{listed} are identical on every site (to the last printed digit)."


# --- one run's flags wherever its score is printed: `train`, `federation local`, the figures ---------


def run_flags(final: Mapping) -> list[tuple[str, str, str]]:
    """(kind, site label, why) of every flagged score of one run, in ``KINDS`` order: its test
    clients' and its test-only cohorts' (``final["flags"]`` holds both). A ``collapsed`` flag of a
    final whose scores were not selected on validation is left out, as in :func:`collect_flags`."""
    labels = dict(zip(final.get("clients") or [], final.get("client_labels") or final.get("clients") or []))
    on_val = (final.get("selection") or {}).get("split", "val") == "val"
    found = [
        (kind, str(labels.get(client, client)), str(flags[kind]))
        for client, flags in (final.get("flags") or {}).items()
        for kind in KINDS
        if kind in flags and (kind != "collapsed" or on_val)
    ]
    return sorted(found, key=lambda f: KINDS.index(f[0]))


def score_warnings(final: Mapping) -> list[str]:
    """One ``WARNING`` line per flagged score of a run, naming run, site and seed: what the
    summary line of ``train`` and ``federation local`` prints its mark for."""
    where = f"run {final.get('run') or final.get('method')} (task {final.get('task')})"
    return [
        f"WARNING: {where}, site {site}, seed {final.get('seed')}: {kind.replace('_', ' ')}: {why} ({MEANING[kind]})"
        for kind, site, why in run_flags(final)
    ]


def summary_mark(final: Mapping, sites: Iterable[str] | None = None) -> str:
    """The mark a printed summary over ``sites`` (default: the run's test clients) carries, with a
    word on how many of them are flagged: "" when none is."""
    clients = list(sites if sites is not None else final.get("clients") or [])
    flags = final.get("flags") or {}
    on_val = (final.get("selection") or {}).get("split", "val") == "val"
    out = []
    for kind in KINDS:
        hit = [c for c in clients if kind in (flags.get(c) or {}) and (kind != "collapsed" or on_val)]
        if hit:
            what = "collapsed" if kind == "collapsed" else "no foreground in test"
            out.append(f"{MARKS[kind]} ({what} on {len(hit)} of {len(clients)} sites: see the WARNING lines)")
    return " ".join(out)


def print_score_summary(final: Mapping, line: str, out=None, err=None) -> None:
    """Print a run's summary ``line`` (its mean test score) with its mark, after one WARNING line per
    flagged score (on ``err``, standard error by default): no score is printed without its flag."""
    out, err = out or sys.stdout, err or sys.stderr
    warnings = score_warnings(final)
    if warnings:
        out.flush()
        print("\n".join(warnings), file=err, flush=True)
    mark = summary_mark(final)
    print(f"{line} {mark}" if mark else line, file=out, flush=True)


def collapsed_texts(finals: Iterable[Mapping], names: Mapping[str, str] | None = None) -> list[str]:
    """The footnote texts (:func:`collect_flags`) of the collapsed test clients of ``finals`` (one
    run's seeds): what a figure built from their selected models says on its face and in its CSV."""
    # The test clients' flags only: a test-only cohort's score is no point of a convergence curve.
    own = [
        {**f, "flags": {c: v for c, v in (f.get("flags") or {}).items() if c in (f.get("clients") or [])}}
        for f in finals
    ]
    return [text for entries in collect_flags(own, names).values() for kind, text in entries if kind == "collapsed"]


def collapsed_sites(finals: Iterable[Mapping]) -> list[str]:
    """ "<site> seed <k>" of each collapsed test client of ``finals`` (one run's seeds), in order:
    what a figure's face lists beside the mark."""
    out = []
    for final in finals:
        own = {
            **final,
            "flags": {c: v for c, v in (final.get("flags") or {}).items() if c in (final.get("clients") or [])},
        }
        out += [f"{site} seed {final.get('seed')}" for kind, site, _ in run_flags(own) if kind == "collapsed"]
    return list(dict.fromkeys(out))


def collapsed_note(collapsed: Mapping[str, Sequence[str]]) -> str | None:
    """The line a figure's face carries under its legend: {series label: its collapsed sites}
    (:func:`collapsed_sites`); None when no series is marked."""
    marked = {name: sites for name, sites in collapsed.items() if sites}
    if not marked:
        return None
    listed = "; ".join(f"{name}: {', '.join(sites)}" for name, sites in marked.items())
    return f"{MARKS['collapsed']} selected model collapsed (one class on a whole test split): {listed}"
