"""Report inputs that are damaged, empty or cut short: one line naming the file (and row, column or
round), a non-zero exit, and no table or figure drawn from part of a run (docs/troubleshooting.md).

The run folders here are written the way ``fl.engine`` writes them: history rows ``round, client,
split, metric, value``; ``train`` and ``val`` every round, ``test`` every ``curve_every`` rounds and
on the last one, ``test_local`` (with an ``epoch`` column) every round with ``local_epoch_curve``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from fedmedbench import cli
from fedmedbench.errors import DataError
from fedmedbench.finals import write_final
from fedmedbench.report.compare import load_paper_table
from fedmedbench.report.inputs import expected_rounds, read_final, read_history

CLIENTS = ("A", "B")
METRICS = ("dice_paper", "dice_fg")


def history_rows(rounds, curve_every=0, local_epoch_curve=False, local_epochs=2):
    every = curve_every or max(1, rounds // 50)
    rows = []
    for r in range(1, rounds + 1):
        value = lambda i, r=r: round(0.5 + 0.04 * r + 0.1 * i, 4)  # noqa: E731
        if local_epoch_curve:
            rows += [
                dict(round=r, client=c, split="test_local", metric=m, value=value(i), epoch=e)
                for i, c in enumerate(CLIENTS)
                for e in range(local_epochs + 1)
                for m in METRICS
            ]
        rows += [
            dict(round=r, client=c, split="server", metric="cka:enc.0", value=value(i)) for i, c in enumerate(CLIENTS)
        ]
        for i, c in enumerate(CLIENTS):
            rows.append(dict(round=r, client=c, split="train", metric="loss", value=1.0 / r))
            rows += [dict(round=r, client=c, split="val", metric=m, value=value(i)) for m in METRICS]
            if r % every == 0 or r == rounds:
                rows += [dict(round=r, client=c, split="test", metric=m, value=value(i)) for m in METRICS]
    return rows


def write_run(root: Path, run="fedavg", seed=0, rounds=10, curve_every=0, local_epoch_curve=False, keep=None) -> Path:
    """A run folder; ``keep`` filters the history rows (to cut the file short). Returns the folder."""
    folder = root / "train" / "tiny" / run / f"seed{seed}"
    folder.mkdir(parents=True)
    rows = history_rows(rounds, curve_every, local_epoch_curve)
    if keep is not None:
        rows = [row for row in rows if keep(row)]
    columns = ["round", "client", "split", "metric", "value"] + (["epoch"] if local_epoch_curve else [])
    (folder / "history.csv").write_text(pd.DataFrame(rows, columns=columns).to_csv(index=False))
    scores = {c: {"dice_paper": 0.8 + 0.05 * i, "dice_fg": 0.7} for i, c in enumerate(CLIENTS)}
    final = {
        "task": "tiny", "method": run.split("-")[0], "run": run, "seed": seed, "clients": list(CLIENTS),
        "client_labels": list(CLIENTS), "synthetic": True, "primary_metric": "dice_paper",
        "selection": {"split": "val", "metric": "dice_paper", "per_client": False, "best_round": rounds, "rounds": rounds},
        "test": scores, "val": scores, "metric_descriptions": {"dice_paper": "Dice", "dice_fg": "foreground Dice"},
        "config": {"rounds": rounds, "curve_every": curve_every, "local_epoch_curve": local_epoch_curve, "local_epochs": 2},
    }  # fmt: skip
    write_final(folder / "final.json", final)  # as fedmedbench train writes it
    return folder


EXPERIMENT = {
    "title": "Tiny: table", "seeds": [0], "task": "tiny", "runs": ["fedavg"], "metric": "dice_paper",
    "client": "A", "task_specs": {"tiny": {"clients": list(CLIENTS)}}, "paper_table": "tiny.csv", "paper_metric": "dice",
}  # fmt: skip


def run_cli(capsys, *argv) -> tuple[int, list[str]]:
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip().splitlines()


def one_line_error(capsys, *argv) -> str:
    code, lines = run_cli(capsys, *argv)
    assert code == 1
    assert len(lines) == 1, lines  # one line, no traceback
    assert "DataError: " in lines[0]
    return lines[0]


# --- 1. a history cut short -----------------------------------------------------------------------
def test_a_cut_short_history_is_refused_not_drawn(tmp_path, capsys):
    """Rounds 1-2 of a 10-round run drew a 2-round convergence figure with exit 0."""
    run = write_run(tmp_path, rounds=10, keep=lambda row: row["round"] <= 2)
    line = one_line_error(
        capsys, "figure", "--experiment", json.dumps(EXPERIMENT), "--out-prefix", tmp_path / "fig", run / "history.csv"
    )
    assert line.endswith(
        f"{run / 'history.csv'}: ends at round 2 but final.json says 10 rounds; rerun the training job that wrote it"
    )
    assert not list(tmp_path.glob("fig*"))


@pytest.mark.parametrize(
    "command", ["figure", "fairness-curves", "retrogress-figure", "layer-cka-figure", "table-select-on-test"]
)
def test_every_command_that_reads_a_history_checks_it_against_final_json(tmp_path, capsys, command):
    run = write_run(tmp_path, rounds=6, curve_every=1, local_epoch_curve=True, keep=lambda row: row["round"] <= 4)
    if command == "table-select-on-test":  # the official Fed-LWR selection reads history.csv next to each final.json
        argv = [
            "table",
            "--experiment",
            json.dumps({**EXPERIMENT, "select_on": "test"}),
            "--out-prefix",
            tmp_path / "out",
            run / "final.json",
        ]
    else:
        argv = [command, "--experiment", json.dumps(EXPERIMENT), "--out-prefix", tmp_path / "out", run / "history.csv"]
    line = one_line_error(capsys, *argv)
    assert f"{run / 'history.csv'}: ends at round 4 but final.json says 6 rounds" in line
    assert not list(tmp_path.glob("out*"))


def test_a_complete_history_is_read_as_pandas_reads_it(tmp_path):
    run = write_run(tmp_path, rounds=7, curve_every=3, local_epoch_curve=True)
    final = read_final(run / "final.json")
    pd.testing.assert_frame_equal(read_history(run / "history.csv", final), pd.read_csv(run / "history.csv"))
    # test rows at 3, 6 and the last round 7; train and test_local every round
    assert expected_rounds(final) == {
        "train": [1, 2, 3, 4, 5, 6, 7],
        "test": [3, 6, 7],
        "test_local": [1, 2, 3, 4, 5, 6, 7],
    }


@pytest.mark.parametrize(
    ("keep", "message"),
    [
        # a client's test rows missing at one scheduled round (every 3: rounds 3, 6, 9, 10)
        (
            lambda r: not (r["split"] == "test" and r["round"] == 6 and r["client"] == "B"),
            "no 'test' rows of client 'B' at round(s) 6 (final.json: 10 rounds, test rows every 3 and on the last)",
        ),
        # the last round's test rows: always written, whatever curve_every says
        (lambda r: not (r["split"] == "test" and r["round"] == 10), "no 'test' rows of client 'A' at round(s) 10"),
        # rounds missing in the middle (a history of another run glued together)
        (lambda r: r["round"] not in (4, 5), "no 'train' rows of client 'A' at round(s) 4, 5 (final.json: 10 rounds)"),
        # a local-epoch curve without some rounds
        (
            lambda r: not (r["split"] == "test_local" and r["round"] > 8),
            "no 'test_local' rows of client 'A' at round(s) 9, 10",
        ),
        # header only
        (lambda r: False, "holds no rows but final.json says 10 rounds"),
    ],
    ids=["a-clients-test-round", "last-round-test", "rounds-in-the-middle", "local-epoch-rounds", "header-only"],
)
def test_a_history_missing_rounds_names_what_is_missing(tmp_path, keep, message):
    run = write_run(tmp_path, rounds=10, curve_every=3, local_epoch_curve=True, keep=keep)
    with pytest.raises(DataError, match=r"history\.csv: ") as err:
        read_history(run / "history.csv", read_final(run / "final.json"))
    assert message in str(err.value)


def test_a_history_longer_than_its_run_is_refused(tmp_path):
    run = write_run(tmp_path, rounds=12)
    final = read_final(run / "final.json")
    final["selection"]["rounds"] = 10
    with pytest.raises(DataError, match="ends at round 12 but final.json says 10 rounds"):
        read_history(run / "history.csv", final)


def test_the_readers_schedule_is_the_engines():
    """``inputs.curve_every`` repeats ``fl.evaluation.curve_every`` (which needs torch): they must agree."""
    from fedmedbench.fl import evaluation
    from fedmedbench.report.inputs import curve_every

    for rounds in (1, 2, 49, 50, 120, 300):
        for every in (0, 1, 3, 7):
            assert curve_every({"rounds": rounds, "curve_every": every}) == evaluation.curve_every(
                SimpleNamespace(rounds=rounds, curve_every=every)
            )


# --- 2. messages that name the file, line and column -----------------------------------------------
@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{\n  "run": "fedavg",\n',
            "final.json: not valid JSON (Expecting property name enclosed in double quotes at line 3, column 1); damaged or cut short?",
        ),
        ("", "final.json: empty file; damaged or cut short?"),
        ("[1, 2]", "final.json: expected a JSON object, found a JSON list"),
        ('{"run": "fedavg"}', "final.json: lacks 'task', 'seed', 'clients', 'selection', 'test', 'val'"),
    ],
    ids=["cut-short", "empty", "not-an-object", "missing-keys"],
)
@pytest.mark.parametrize("command", ["collect", "table"])
def test_a_damaged_final_json_is_one_line_naming_the_file(tmp_path, capsys, text, message, command):
    run = write_run(tmp_path)
    (run / "final.json").write_text(text)
    if command == "collect":
        argv = ["collect", "--out", tmp_path / "metrics.csv", run / "final.json"]
    else:
        argv = ["table", "--experiment", json.dumps(EXPERIMENT), "--out-prefix", tmp_path / "table", run / "final.json"]
    line = one_line_error(capsys, *argv)
    assert (
        f"{run / 'final.json'}: " in line and message in line
    )  # was "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    assert not (tmp_path / "metrics.csv").exists() and not list(tmp_path.glob("table*"))


def test_a_final_json_without_its_rounds_is_refused(tmp_path):
    run = write_run(tmp_path)
    final = json.loads((run / "final.json").read_text())
    del final["selection"]["rounds"]
    (run / "final.json").write_text(json.dumps(final))
    with pytest.raises(DataError, match=r"final\.json: selection\.rounds is None; expected the run's number of rounds"):
        read_final(run / "final.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "",
            "history.csv: empty file, but final.json says 10 rounds",
        ),  # was "EmptyDataError: No columns to parse from file"
        (None, "history.csv: cut short (its last line is incomplete)"),
        (
            "round,client,split,metric,value\n1,A,train,loss,0.5\n1,A,val,dice_paper,0.9x\n",
            "history.csv: line 3, column 'value': '0.9x' is not a number",
        ),
        (
            "round,client,split,metric,value\n1,A,train,loss,0.5\n2.5,A,train,loss,0.4\n",
            "history.csv: line 3, column 'round': 2.5 is not a round number",
        ),
        ("round,client,split\n1,A,train\n", "history.csv: lacks column(s) ['metric', 'value']"),
    ],
    ids=["empty", "cut-mid-line", "bad-value", "bad-round", "missing-columns"],
)
def test_a_damaged_history_is_one_line_naming_the_file(tmp_path, capsys, content, message):
    run = write_run(tmp_path)
    history = run / "history.csv"
    history.write_text(history.read_text()[:-30] if content is None else content)  # None: cut mid-line
    line = one_line_error(
        capsys, "figure", "--experiment", json.dumps(EXPERIMENT), "--out-prefix", tmp_path / "fig", history
    )
    assert f"{history}: " in line and message in line


PAPER = """paper,table,task,method,method_id,client,metric,mean,std
harmofl,1,tiny,FedAvg,fedavg,A,dice,90.04,1.27
harmofl,1,tiny,FedAvg,fedavg,B,dice,{b_mean},{b_std}
harmofl,1,tiny,FedAvg,fedavg,Avg,dice,91.00,
"""


@pytest.mark.parametrize(
    ("b_mean", "b_std", "message"),
    [
        ("90.04*", "0.28", "line 3 (method_id 'fedavg', client 'B'), column 'mean': '90.04*' is not a number"),
        ("94.31", "0.28†", "line 3 (method_id 'fedavg', client 'B'), column 'std': '0.28†' is not a number"),
        ("", "0.28", "line 3 (method_id 'fedavg', client 'B'), column 'mean': '' is empty"),
    ],
    ids=["footnote-mark-in-mean", "mark-in-std", "empty-mean"],
)
def test_a_bad_cell_of_a_paper_table_names_file_line_column_and_value(tmp_path, b_mean, b_std, message):
    path = tmp_path / "tiny.csv"
    path.write_text(PAPER.format(b_mean=b_mean, b_std=b_std))
    with pytest.raises(DataError) as err:  # was "ValueError: Unable to parse string "90.04*" at position 1"
        load_paper_table(path)
    assert str(err.value) == f"{path}: {message}"


def test_a_valid_paper_table_reads_as_before(tmp_path):
    path = tmp_path / "tiny.csv"
    path.write_text(PAPER.format(b_mean="94.31", b_std=""))
    paper = load_paper_table(path)
    assert paper["mean"].tolist() == [90.04, 94.31, 91.0] and paper["std"].isna().tolist() == [False, True, True]
    assert paper["decimals"].tolist() == [2, 2, 2]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (PAPER.format(b_mean="90.04*", b_std=""), "column 'mean': '90.04*' is not a number"),
        ("", "empty file; expected a paper result table"),
    ],
    ids=["bad-cell", "empty-file"],
)
def test_the_report_command_names_the_bad_paper_table(tmp_path, capsys, table, message):
    run = write_run(tmp_path)
    (tmp_path / "paper").mkdir()
    (tmp_path / "paper" / "tiny.csv").write_text(table)
    line = one_line_error(
        capsys,
        "report",
        "--experiments",
        json.dumps({"t": EXPERIMENT}),
        "--paper-tables",
        tmp_path / "paper",
        "--out",
        tmp_path / "report.md",
        run / "final.json",
    )
    assert f"{tmp_path / 'paper' / 'tiny.csv'}: " in line and message in line
    assert not (tmp_path / "report.md").exists()


def test_valid_runs_still_give_a_figure_and_a_report(tmp_path, capsys):
    run = write_run(tmp_path, rounds=10, curve_every=3)
    (tmp_path / "paper").mkdir()
    (tmp_path / "paper" / "tiny.csv").write_text(PAPER.format(b_mean="94.31", b_std="0.28"))
    code, lines = run_cli(
        capsys, "figure", "--experiment", json.dumps(EXPERIMENT), "--out-prefix", tmp_path / "fig", run / "history.csv"
    )
    assert code == 0 and lines == [] and (tmp_path / "fig.png").stat().st_size > 1000
    code, _ = run_cli(
        capsys,
        "report",
        "--experiments",
        json.dumps({"t": EXPERIMENT}),
        "--paper-tables",
        tmp_path / "paper",
        "--out",
        tmp_path / "report.md",
        run / "final.json",
    )
    assert code == 0 and "| fedavg | A | 80.00 (–) | 90.04 (1.27) | -10.04 |" in (tmp_path / "report.md").read_text()


def test_what_the_engine_writes_passes_the_cross_check(tmp_path, tiny_task):
    """The reader's idea of a complete history is the engine's: a real run (test every 2 of 3 rounds,
    local-epoch curve on) is read unchanged, and cutting it after round 2 is refused."""
    from fedmedbench.fl.engine import run_training
    from tests.conftest import tiny_run_config

    store, split = tiny_task
    out = tmp_path / "run"
    run_training(
        tiny_run_config(store, split, "fedavg", rounds=3, curve_every=2, local_epoch_curve=True), out, progress=False
    )
    final = read_final(out / "final.json")
    pd.testing.assert_frame_equal(read_history(out / "history.csv", final), pd.read_csv(out / "history.csv"))
    lines = (out / "history.csv").read_text().splitlines(keepends=True)
    (out / "history.csv").write_text("".join(line for line in lines if not line.startswith("3,")))
    with pytest.raises(DataError, match="ends at round 2 but final.json says 3 rounds"):
        read_history(out / "history.csv", final)
