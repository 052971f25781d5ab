"""A score edited by hand in final.json never reaches a table: the training job seals each
final.json with a digest of its content (fedmedbench/finals.py) and every report job checks it,
refusing a mismatch in one line naming the file."""

from __future__ import annotations

import json

import pytest

from fedmedbench import cli
from fedmedbench.errors import DataError
from fedmedbench.finals import content_digest, write_final
from fedmedbench.fl import engine
from fedmedbench.report.inputs import read_final
from tests.conftest import tiny_run_config

EXPERIMENT = {"title": "T", "seeds": [0], "task": "tiny", "runs": ["fedavg"], "metric": "dice_paper"}


def table(prefix, capsys, final_path) -> tuple[int, list[str]]:
    code = cli.main(
        [
            "table",
            "--experiment",
            json.dumps({**EXPERIMENT, "task": json.loads(final_path.read_text())["task"]}),
            "--out-prefix",
            str(prefix),
            str(final_path),
        ]
    )
    return code, capsys.readouterr().err.strip().splitlines()


def test_the_engine_seals_final_json_and_a_hand_edited_score_is_refused_by_the_table(tmp_path, tiny_task, capsys):
    store, split = tiny_task
    final = engine.run_training(
        tiny_run_config(store, split, "fedavg", rounds=1), tmp_path / "run", threads=1, progress=False
    )
    path = tmp_path / "run" / "final.json"
    written = json.loads(path.read_text())
    assert written == final and written["digest"] == content_digest(written) and written["digest"].startswith("sha256:")
    code, _ = table(tmp_path / "sealed", capsys, path)
    assert code == 0

    # A reviewer's "small fix": one client's Dice raised by hand.
    client = written["clients"][0]
    written["test"][client]["dice_paper"] = 0.99
    path.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    code, lines = table(tmp_path / "edited", capsys, path)
    assert code == 1 and len(lines) == 1, lines  # was: exit 0, 99.00 in the table
    assert lines[0].endswith(
        f"DataError: {path}: its content does not match its digest (edited after the training job wrote it?); rerun the training job that wrote it"
    )
    assert not list(tmp_path.glob("edited.*"))


def test_a_final_json_without_a_digest_is_refused_and_indentation_is_not_content(tmp_path):
    final = {
        "task": "tiny", "method": "fedavg", "run": "fedavg", "seed": 0, "clients": ["A"], "client_labels": ["A"],
        "selection": {"split": "val", "metric": "dice_paper", "per_client": False, "best_round": 1, "rounds": 1},
        "test": {"A": {"dice_paper": 0.8}}, "val": {"A": {"dice_paper": 0.7}}, "config": {"rounds": 1},
    }  # fmt: skip
    path = tmp_path / "final.json"
    path.write_text(json.dumps(final))
    with pytest.raises(DataError) as caught:
        read_final(path)
    assert (
        str(caught.value)
        == f"{path}: has no digest of its scores (written by hand, or by a fedmedbench before digests); rerun the training job that wrote it"
    )

    written = write_final(path, final)
    assert read_final(path) == written
    path.write_text(json.dumps(written))  # the same content on one line: the same digest
    assert read_final(path)["test"] == {"A": {"dice_paper": 0.8}}
    for edit in ({"seed": 1}, {"run": "fedprox"}, {"val": {"A": {"dice_paper": 0.9}}}):
        path.write_text(json.dumps({**written, **edit}))
        with pytest.raises(DataError, match="its content does not match its digest"):
            read_final(path)
