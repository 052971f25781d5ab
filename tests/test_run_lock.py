"""One writer per run folder: `train` on a folder another process is training into stops in one
line, having touched nothing; the lock is the kernel's, so a holder killed with SIGKILL frees it."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedmedbench.faults import KILL_AT_ENV
from fedmedbench.fl import runlock
from tests.conftest import tiny_run_config

SRC = Path(__file__).resolve().parents[1] / "src"
ENV = {**os.environ, "PYTHONPATH": str(SRC)}

HOLDER = """
import sys, time
from fedmedbench.fl.runlock import run_folder_lock
with run_folder_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def train_cli(cfg, out, **env):
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
    return subprocess.run(
        cmd, env={**ENV, **env}, capture_output=True, text=True, timeout=600
    )  # a hang fails, never blocks the suite


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_a_second_writer_is_refused_and_the_lock_file_goes_with_its_holder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with runlock.run_folder_lock(out) as path:
        assert path == out / runlock.LOCK_NAME and path.is_file()
        with (
            pytest.raises(runlock.RunFolderBusy, match=rf"^{out}: another training job is writing this run folder"),
            runlock.run_folder_lock(out),
        ):
            pass
        assert path.is_file()  # the refused one removed nothing
    assert sorted(p.name for p in out.iterdir()) == []  # a finished run folder holds only its own files
    with runlock.run_folder_lock(out):
        pass


def test_a_lock_file_removed_by_its_ending_holder_is_not_trusted(tmp_path, monkeypatch):
    """Between our open and our lock the holder ended and removed the file: our lock is on a file
    nobody else can find, so the lock is taken again on the file the path names."""
    out = tmp_path / "run"
    out.mkdir()
    real_try, calls = runlock._try_lock, []

    def racing(path):
        handle = real_try(path)
        calls.append(path)
        if len(calls) == 1:
            path.unlink()  # what an ending holder does after we opened the file
        return handle

    monkeypatch.setattr(runlock, "_try_lock", racing)
    with runlock.run_folder_lock(out) as path:
        assert len(calls) == 2 and path.is_file()
        with open(path, "a") as other:  # anyone who opens the path now finds it locked
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_train_by_hand_on_a_folder_a_running_job_owns_stops_in_one_line_until_the_job_is_killed(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=2)
    out = tmp_path / "run"
    # A job killed after round 1 left its checkpoint; another process now owns the folder.
    assert train_cli(cfg, out, **{KILL_AT_ENV: "round_end:1"}).returncode == -signal.SIGKILL
    assert (out / "checkpoint.pt").is_file() and (out / runlock.LOCK_NAME).is_file()  # its lock file, locked by nobody
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        busy = train_cli(cfg, out)
        assert busy.returncode == 1
        errors = [
            line for line in busy.stderr.splitlines() if " ERROR " in line
        ]  # (after the usual INFO line of the run config)
        assert (
            len(errors) == 1 and f"RunFolderBusy: {out}: another training job is writing this run folder" in errors[0]
        ), busy.stderr
        assert busy.stderr.strip().splitlines()[-1] == errors[0] and "Traceback" not in busy.stderr
        assert snapshot(out) == before  # nothing touched: the checkpoint, the lock file, nothing new
    finally:
        holder.send_signal(signal.SIGKILL)  # freed by the kernel, however the holder ends
        holder.wait()
        holder.stdout.close()
    assert holder.returncode == -signal.SIGKILL
    assert (out / runlock.LOCK_NAME).exists()  # left by the killed holder: an empty file, locked by nobody
    resumed = train_cli(cfg, out)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and json.loads((out / "final.json").read_text())["selection"]["rounds"] == 2
    assert sorted(p.name for p in out.iterdir()) == [
        "final.json",
        "history.csv",
        "model_best.pt",
        "predictions.npz",
        "run_config.json",
    ]
