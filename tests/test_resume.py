"""A job killed (SIGKILL) after a checkpoint resumes and ends with the same final.json."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedmedbench.faults import KILL_AT_ENV
from tests.conftest import tiny_run_config

SRC = Path(__file__).resolve().parents[1] / "src"


def train_cli(cfg, out, kill_after=None):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    if kill_after:
        env[KILL_AT_ENV] = f"round_end:{kill_after}"
    cmd = [
        sys.executable,
        "-m",
        "fedmedbench",
        "train",
        "--run-config",
        json.dumps(cfg),
        "--out",
        str(out),
        "--threads",
        "1",
        "--no-progress",
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def test_kill_and_resume_gives_the_same_final_json(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedprox", rounds=4, method_params={"mu": 0.1})

    straight = train_cli(cfg, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr

    killed = train_cli(cfg, tmp_path / "resumed", kill_after=2)
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "resumed" / "checkpoint.pt").exists()
    assert not (tmp_path / "resumed" / "final.json").exists()

    resumed = train_cli(cfg, tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and "after round 2" in resumed.stderr

    for name in ("final.json", "history.csv"):
        assert (tmp_path / "straight" / name).read_text() == (tmp_path / "resumed" / name).read_text(), name


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_a_checkpoint_of_another_config_is_ignored(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=3)
    assert train_cli(cfg, tmp_path / "run", kill_after=1).returncode == -signal.SIGKILL
    changed = {**cfg, "rounds": 2}
    result = train_cli(changed, tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "different configuration" in result.stderr
    assert json.loads((tmp_path / "run" / "final.json").read_text())["selection"]["rounds"] == 2
