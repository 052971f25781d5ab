"""Check a folder of report figures as a reviewer would, from what lies on disk: each ``<figure>.png``
with its source data ``<figure>.csv`` (``figures.SourceData``) and, beside, the tables.

``python -m fedmedbench.report.figure_check results/demo/figures [results/demo/tables]`` prints
each problem and exits 1 when there is one. Per figure:

* the source CSV exists, has the columns and rows, and says per row whether the data are synthetic;
  a synthetic figure carries ``figures.SYNTHETIC_MARK`` in its title (read from the PNG's metadata,
  which ``figures.save_figure`` writes from the drawn title);
* no point, error bar end or band end leaves the quantity's feasible range (``y_min``-``y_max``),
  and each error bar holds its point (low <= y <= high);
* one error definition per figure, and per paper figure (``harmofl_fig5b`` and ``harmofl_fig5c``
  are panels of one figure);
* within a panel no two series share a style (colour, marker, dash, hatch);
* every point says how many things it averages (``n``);
* a convergence curve (rows of kind ``curve``) has its selected model marked, and where one round was
  selected the marker (the table's Avg) lies on the curve.

Per table (``<table>.md`` with its ``.csv``): a synthetic table says so under its caption, and no
bold (best) Avg carries a flag mark (a collapsed model or a split without foreground).

This module must stay light (no torch).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
from PIL import Image

from fedmedbench.report.figures import SOURCE_COLUMNS, SYNTHETIC_MARK
from fedmedbench.report.flags import MARKS
from fedmedbench.report.tables import SYNTHETIC_NOTE

TOLERANCE = 1e-6  # percent points: the CSV's floats round-trip exactly, the curve's mean need not
PAPER_FIGURE = re.compile(r"^(?P<paper>[a-z]+_fig\d+)[a-z]?_")


def png_title(png: Path) -> str:
    """The title ``save_figure`` stored in the PNG's metadata (empty when there is none)."""
    with Image.open(png) as image:
        return str(image.info.get("Title", ""))


TEXT_COLUMNS = ("panel", "series", "kind", "x", "error", "n_of", "style", "collapsed")


def read_source(csv: Path) -> pd.DataFrame:
    """A figure's source CSV, its text columns as text (empty, not NaN, where blank)."""
    data = pd.read_csv(csv, dtype={c: str for c in TEXT_COLUMNS})
    for column in TEXT_COLUMNS:
        if column in data.columns:
            data[column] = data[column].fillna("")
    return data


def check_source(name: str, data: pd.DataFrame, title: str) -> list[str]:
    """Problems of one figure's source data (``data``: its CSV) and title."""
    problems = []
    missing = [c for c in SOURCE_COLUMNS if c not in data.columns]
    if missing:
        return [f"{name}: source CSV lacks columns {missing}"]
    if data.empty:
        return [f"{name}: source CSV has no rows"]
    synthetic = set(data["synthetic"].astype(str).str.lower())
    if len(synthetic) != 1 or synthetic - {"true", "false"}:
        problems.append(f"{name}: 'synthetic' is {sorted(synthetic)}, not one true/false")
    elif synthetic == {"true"} and not title.startswith(SYNTHETIC_MARK):
        problems.append(f"{name}: synthetic data, but the title does not say so: {title[:80]!r}")
    elif synthetic == {"false"} and SYNTHETIC_MARK in title:
        problems.append(f"{name}: real data, but the title says synthetic")
    for column in ("y", "low", "high"):
        values = pd.to_numeric(data[column], errors="coerce")
        lo, hi = pd.to_numeric(data["y_min"], errors="coerce"), pd.to_numeric(data["y_max"], errors="coerce")
        outside = values.notna() & ((lo.notna() & (values < lo - TOLERANCE)) | (hi.notna() & (values > hi + TOLERANCE)))
        for i in outside[outside].index[:3]:
            problems.append(
                f"{name}: {data.at[i, 'series']} at x={data.at[i, 'x']}: {column} {values[i]:g} outside {lo[i]:g}-{hi[i]:g}"
            )
    y, low, high = (pd.to_numeric(data[c], errors="coerce") for c in ("y", "low", "high"))
    inverted = (low.notna() & (low > y + TOLERANCE)) | (high.notna() & (high < y - TOLERANCE))
    if inverted.any():
        problems.append(f"{name}: {int(inverted.sum())} error bar(s) do not hold their point")
    errors = sorted({e for e in data["error"] if e})
    if len(errors) > 1:
        problems.append(f"{name}: {len(errors)} error definitions in one figure: {errors}")
    if not pd.to_numeric(data["n"], errors="coerce").notna().all():
        problems.append(f"{name}: rows without n (how many things a point averages)")
    styled = data[data["style"] != ""]
    for panel, rows in styled.groupby("panel"):
        pairs = rows[["series", "style"]].drop_duplicates()
        shared = pairs[pairs["style"].duplicated(keep=False)]
        if len(shared):
            problems.append(f"{name}: {panel or 'figure'}: series {sorted(set(shared['series']))} share a style")
    problems += _check_selected(name, data)
    return problems


def _check_selected(name: str, data: pd.DataFrame) -> list[str]:
    problems = []
    points, selected = data[data["kind"] == "curve"], data[data["kind"] == "selected"]
    for series, rows in points.groupby("series"):
        marks = selected[selected["series"] == series]
        if marks.empty:
            problems.append(f"{name}: {series}: the selected model is not marked")
            continue
        if len(marks) == 1:  # one round selected: the table's Avg is the curve's value there
            x = float(marks["x"].iloc[0])
            on = rows[pd.to_numeric(rows["x"]) == x]
            if len(on) and abs(float(on["y"].iloc[0]) - float(marks["y"].iloc[0])) > TOLERANCE:
                problems.append(
                    f"{name}: {series}: the table's Avg {float(marks['y'].iloc[0]):.4f} at round {x:g} is off the curve ({float(on['y'].iloc[0]):.4f})"
                )
    return problems


def check_figures(folder: Path | str) -> list[str]:
    """Every problem of the figures in ``folder`` (each PNG with its CSV), in name order."""
    folder = Path(folder)
    problems: list[str] = []
    pngs = sorted(folder.glob("*.png"))
    if not pngs:
        return [f"{folder}: no figures"]
    errors_by_paper_figure: dict[str, dict[str, set[str]]] = {}
    for png in pngs:
        name, csv = png.stem, png.with_suffix(".csv")
        if not csv.exists():
            problems.append(f"{name}: no source CSV {csv.name}")
            continue
        data = read_source(csv)
        problems += check_source(name, data, png_title(png))
        match = PAPER_FIGURE.match(name + "_")
        if match and "error" in data.columns:
            errors = {e for e in data["error"] if e}
            errors_by_paper_figure.setdefault(match["paper"], {})[name] = errors
    for paper, panels in errors_by_paper_figure.items():
        definitions = set().union(*panels.values())
        if len(definitions) > 1:
            problems.append(
                f"{paper}: its panels {sorted(panels)} use {len(definitions)} error definitions: {sorted(definitions)}"
            )
    return problems


def check_tables(folder: Path | str) -> list[str]:
    """A synthetic table says so on its face; no bold (best) Avg carries a flag mark."""
    problems: list[str] = []
    for md in sorted(Path(folder).glob("*.md")):
        text = md.read_text()
        csv = md.with_suffix(".csv")
        synthetic = csv.exists() and "synthetic" in pd.read_csv(csv, nrows=1).columns
        if synthetic and SYNTHETIC_NOTE not in text:
            problems.append(f"{md.stem}: synthetic data, but the table does not say so")
        for line in text.splitlines():
            for cell in re.findall(r"\*\*[^*|]+\*\*[^|]*", line):
                if any(mark in cell for mark in MARKS.values()):
                    problems.append(f"{md.stem}: a flagged Avg is bold (marked best): {cell.strip()!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m fedmedbench.report.figure_check FIGURES_FOLDER [TABLES_FOLDER]", file=sys.stderr)
        return 2
    problems = check_figures(argv[0]) + (check_tables(argv[1]) if len(argv) > 1 else [])
    for problem in problems:
        print(problem)
    checked = len(list(Path(argv[0]).glob("*.png")))
    print(f"{checked} figures checked, {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
