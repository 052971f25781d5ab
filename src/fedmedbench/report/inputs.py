"""The report's readers of a run's ``final.json`` and ``history.csv``: one reader per file kind.

Every report command reads these files only through :func:`read_final` and :func:`read_history`
(the papers' tables through :func:`fedmedbench.report.compare.load_paper_table`), so a damaged,
empty or cut-short file is one :class:`~fedmedbench.errors.DataError` naming the file (and the line
and column at fault) wherever it is read, and no figure or table is drawn from part of a run.

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from fedmedbench.errors import DataError, plain
from fedmedbench.finals import check_digest

# What the report layer reads from every final.json (the engine always writes them).
FINAL_KEYS = ("task", "run", "seed", "clients", "selection", "test", "val")
HISTORY_COLUMNS = ("round", "client", "split", "metric", "value")
RERUN = "rerun the training job that wrote it"


def read_final(path: Path | str) -> dict:
    """A run's ``final.json`` as a dict; DataError naming the file when it is not valid JSON or
    lacks what the report reads (a missing file is an OSError, which names it)."""
    path = Path(path)
    try:
        text = path.read_text()
        final = json.loads(text)
    except json.JSONDecodeError as err:
        what = (
            "empty file" if not text.strip() else f"not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"
        )
        raise DataError(f"{path}: {what}; damaged or cut short? {RERUN}") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not a text file ({err.reason} at byte {err.start}); {RERUN}") from None
    if not isinstance(final, dict):
        raise DataError(f"{path}: expected a JSON object, found a JSON {type(final).__name__}")
    missing = [key for key in FINAL_KEYS if key not in final]
    if missing:
        raise DataError(
            f"{path}: lacks {', '.join(map(repr, missing))}; not a final.json written by fedmedbench train?"
        )
    if not isinstance(final["clients"], list) or not final["clients"]:
        raise DataError(f"{path}: clients is {final['clients']!r}; expected the list of the run's clients")
    rounds = final["selection"].get("rounds") if isinstance(final["selection"], dict) else None
    if type(rounds) is not int or rounds < 1:
        raise DataError(f"{path}: selection.rounds is {rounds!r}; expected the run's number of rounds")
    check_digest(path, final)  # a score edited by hand never reaches a table
    return final


def _rounds_text(rounds: list[int]) -> str:
    shown = ", ".join(map(str, rounds[:5]))
    return shown if len(rounds) <= 5 else f"{shown}, ... ({len(rounds)} rounds)"


def curve_every(config: dict) -> int:
    """Test rows every this many rounds: the same rule as ``fl.evaluation.curve_every`` (which needs torch)."""
    return config.get("curve_every") or max(1, config["rounds"] // 50)


def expected_rounds(final: dict) -> dict[str, list[int]]:
    """split -> the rounds the engine writes rows of that split for, for every client: ``train``
    (the loss) every round, ``test`` every ``curve_every`` rounds and on the last one, and with
    ``local_epoch_curve`` ``test_local`` every round."""
    rounds = final["selection"]["rounds"]
    config = {**(final.get("config") or {}), "rounds": rounds}
    every = curve_every(config)
    expected = {
        "train": list(range(1, rounds + 1)),
        "test": [r for r in range(1, rounds + 1) if r % every == 0 or r == rounds],
    }
    if config.get("local_epoch_curve"):
        expected["test_local"] = list(range(1, rounds + 1))
    return expected


def _check_cells(path: Path, history: pd.DataFrame) -> None:
    """Round numbers must be whole numbers, values numbers or empty (NaN); names the first bad cell."""
    rounds = pd.to_numeric(history["round"], errors="coerce")
    values = pd.to_numeric(history["value"], errors="coerce")
    for column, bad, what in (
        ("round", rounds.isna() | (rounds % 1 != 0), "not a round number"),
        ("value", values.isna() & history["value"].notna(), "not a number"),
    ):
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            cell = plain([history[column].iloc[i]])[0]
            raise DataError(f"{path}: line {i + 2}, column {column!r}: {cell!r} is {what}")  # line 1: the header


def read_history(path: Path | str, final: dict) -> pd.DataFrame:
    """A run's ``history.csv``, exactly as ``pd.read_csv`` reads it, once it is known to hold every
    round the run's ``final`` (from :func:`read_final`) says it trained: a history cut short would
    otherwise draw a shorter curve (or pick another round) without a word. DataError naming the
    file and what is missing."""
    path = Path(path)
    rounds = final["selection"]["rounds"]
    try:
        history = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise DataError(f"{path}: empty file, but final.json says {rounds} rounds; {RERUN}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a readable CSV ({' '.join(str(err).split())}); {RERUN}") from None
    with open(path, "rb") as handle:
        handle.seek(-1, 2)
        if handle.read(1) != b"\n":  # pandas ends every line with one; a cut-short file does not
            raise DataError(f"{path}: cut short (its last line is incomplete); {RERUN}")
    missing = [c for c in HISTORY_COLUMNS if c not in history.columns]
    if missing:
        raise DataError(f"{path}: lacks column(s) {missing} (has {list(history.columns)})")
    _check_cells(path, history)

    last = int(history["round"].max()) if len(history) else 0
    if last != rounds:
        where = "holds no rows" if not len(history) else f"ends at round {last}"
        raise DataError(f"{path}: {where} but final.json says {rounds} rounds; {RERUN}")
    # as text: a client named "1" reads back from the CSV as the number 1
    held = history["round"].groupby([history["split"].astype(str), history["client"].astype(str)]).agg(set).to_dict()
    every = curve_every({**(final.get("config") or {}), "rounds": rounds})
    for split, wanted in expected_rounds(final).items():
        for client in final["clients"]:
            lacking = [r for r in wanted if r not in held.get((split, str(client)), ())]
            if lacking:
                schedule = f", {split} rows every {every} and on the last" if split == "test" else ""
                raise DataError(
                    f"{path}: no {split!r} rows of client {client!r} at round(s) {_rounds_text(lacking)} (final.json: {rounds} rounds{schedule}); {RERUN}"
                )
    return history


def read_run_history(path: Path | str) -> tuple[dict, pd.DataFrame]:
    """(final, history) of the run whose ``history.csv`` is ``path`` (its final.json lies next to it)."""
    path = Path(path)
    final = read_final(path.with_name("final.json"))
    return final, read_history(path, final)


def histories_by_run(paths: Iterable[Path | str], runs: Iterable[str]) -> dict[str, list[pd.DataFrame]]:
    """run -> its seeds' histories (read with :func:`read_history`), for the experiment's ``runs``."""
    histories: dict[str, list[pd.DataFrame]] = {run: [] for run in runs}
    for path in paths:
        final, history = read_run_history(path)
        if final["run"] not in histories:
            raise DataError(
                f"{Path(path).with_name('final.json')}: run {final['run']!r} is not one of the experiment's runs {list(histories)}"
            )
        histories[final["run"]].append(history)
    return histories


def finals_beside(paths: Iterable[Path | str]) -> list[dict]:
    """The final.json beside each of a run's files (history.csv, predictions.npz, final.json)."""
    return [read_final(Path(p).with_name("final.json")) for p in paths]


def is_synthetic(task_specs: dict, finals: Iterable[dict] = ()) -> bool:
    """Whether a figure or table is drawn from synthetic data: a task of the experiment reads a
    dataset's synthetic twin (``synthetic`` in its task spec, added by the workflow) or a run says
    so in its final.json."""
    return any(bool((spec or {}).get("synthetic")) for spec in task_specs.values()) or any(
        bool(f.get("synthetic")) for f in finals
    )


def count_test_items(finals: Iterable[dict], client: str) -> int | None:
    """How many test items ``client`` holds (``test_class_counts`` of its final.json), when known."""
    for final in finals:
        counts = (final.get("test_class_counts") or {}).get(client)
        if counts and "samples" in counts:
            return int(counts["samples"])
    return None
