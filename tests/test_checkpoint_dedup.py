"""Checkpoints in the engine (fl/checkpoint.py, fl/runfolder.py): a FedAvg checkpoint holds each distinct
tensor about once, streamed; history in an append-only log; a cadence by wall time. Engine-level cases
run the tiny FedAvg task and compare outputs byte for byte. The format itself: tests/test_checkpoint.py."""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedmedbench.errors import ConfigError
from fedmedbench.fl import checkpoint, engine, runfolder
from fedmedbench.fl.history_log import HistoryLog
from fedmedbench.fl.runfolder import history_file
from tests.conftest import interrupt_after_round, tiny_run_config
from tests.test_checkpoint import saved_copies

SRC = Path(engine.__file__).resolve().parent.parent.parent  # src/, for the subprocess

MIB = 1 << 20
OUTPUTS = ("final.json", "history.csv", "model_best.pt", "predictions.npz")


def tensors_of(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tensors_of(v)
    elif isinstance(tree, (list, tuple, set)):
        for v in tree:
            yield from tensors_of(v)


PER_TENSOR = 512  # bytes of structure per stored tensor, at most: its zip record and pickle entry (and the copies list)


def stored_tensors(tree, path: Path) -> int:
    """Tensors a checkpoint file stores: those of the tree it holds, less those it lists as copies."""
    return sum(1 for _ in tensors_of(tree)) - len(saved_copies(path))


def unique_bytes(tree) -> int:
    """Bytes of the distinct storage contents (SHA-256): what a checkpoint must at least hold."""
    digests = {}
    for t in tensors_of(tree):
        s = t.untyped_storage()
        digests[hashlib.sha256(torch.empty(0, dtype=torch.uint8).set_(s).numpy()).digest()] = s.nbytes()
    return sum(digests.values())


PEAK = """
import io, sys, tempfile, torch
from pathlib import Path
from fedmedbench.fl import checkpoint

def in_memory(obj, path):  # the whole file built in memory first, as torch.save into a BytesIO
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    path.write_bytes(buffer.getbuffer())

writers = {"save": checkpoint.save, "in_memory": in_memory}
obj = {f"t{i}": torch.full((16 << 20,), float(i)) for i in range(4)}  # 4 x 64 MiB, distinct
status = lambda key: int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark to the current size
before = status("VmRSS")
with tempfile.TemporaryDirectory() as tmp:
    writers[sys.argv[1]](obj, Path(tmp) / "c.pt")
print((status("VmHWM") - before) / 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_a_checkpoint_is_streamed_so_its_size_does_not_raise_peak_memory():
    def rise(writer: str) -> float:
        out = subprocess.run(
            [sys.executable, "-c", PEAK, writer],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
        if out.returncode and "clear_refs" in out.stderr:
            pytest.skip("cannot reset the memory high-water mark here")
        assert out.returncode == 0, out.stderr
        return float(out.stdout)

    assert rise("save") < 40  # MiB: torch.save hands over the tensors' own memory, piece by piece
    assert rise("in_memory") > 250  # the whole file in memory: what streaming avoids


def test_the_history_log_keeps_exact_rows_and_drops_what_follows_its_position(tmp_path):
    log = HistoryLog(tmp_path / "h.jsonl")
    rows = [
        {"round": 1, "client": "A", "split": "val", "metric": "dice", "value": 0.1 + 0.2},
        {"round": 1, "client": "A", "split": "test_local", "metric": "loss", "value": float("nan"), "epoch": 0},
    ]
    log.append(rows[:1])
    position = log.position()
    log.append(rows[1:])
    assert log.read(log.position())[0] == rows[0] and math.isnan(log.read(log.position())[1]["value"])
    with open(tmp_path / "h.jsonl", "ab") as handle:
        handle.write(b'{"round": 2, "cli')  # a torn line: a job killed mid-append
    assert log.read(position) == rows[:1]
    log.continue_from(position)
    log.append([{"round": 2, "value": 1e-300}])
    assert log.read(log.position()) == [rows[0], {"round": 2, "value": 1e-300}]
    assert (tmp_path / "h.jsonl").read_bytes().count(b"\n") == 2  # the torn line and the old row 2 are gone
    (tmp_path / "h.jsonl").write_bytes(b"")
    with pytest.raises(checkpoint.CorruptCheckpoint, match=r"h\.jsonl: does not hold the 2 history rows"):
        log.read(log.position())


# --- in the engine ----------------------------------------------------------------------------------
@pytest.fixture()
def straight_and_killed(tmp_path, tiny_task, monkeypatch):
    """The tiny FedAvg run straight through, and the same run stopped after round 2's checkpoint."""
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=3)
    engine.run_training(cfg, tmp_path / "straight", progress=False)
    interrupt_after_round(cfg, tmp_path / "killed", monkeypatch, round_index=2)
    return cfg, tmp_path / "straight", tmp_path / "killed"


def resume_copy(cfg, killed: Path, out: Path, caplog) -> str:
    shutil.copytree(killed, out)
    with caplog.at_level("INFO", logger="fedmedbench.engine"):
        engine.run_training(cfg, out, progress=False)
    return caplog.text


def assert_same_outputs(a: Path, b: Path) -> None:
    for name in OUTPUTS:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert sorted(p.name for p in b.iterdir()) == sorted(
        [*OUTPUTS, "run_config.json"]
    )  # checkpoints and the history log removed


def test_a_fedavg_checkpoint_holds_each_distinct_tensor_once_and_the_history_outside(
    straight_and_killed, tmp_path, caplog
):
    cfg, straight, killed = straight_and_killed
    checkpoint_file = killed / "checkpoint.pt"
    saved = checkpoint.load(checkpoint_file)
    assert "history" not in saved and saved["history_log"]["rows"] == len(
        HistoryLog(history_file(killed)).read(saved["history_log"])
    )
    copies = sum(t.untyped_storage().nbytes() for t in tensors_of(saved))
    unique = unique_bytes(saved)
    model = sum(t.untyped_storage().nbytes() for t in saved["server"]["global_state"].values())
    assert copies - unique >= 3 * model  # the 3 clients' models are copies of the server's global weights
    # Each distinct content about once; torch.save adds a zip record and a pickle entry per stored
    # tensor (~350-430 bytes: a fifth of this tiny model's file; a thousandth of a paper-sized one's,
    # benchmarks/bench_checkpoint.py).
    assert checkpoint_file.stat().st_size <= unique + PER_TENSOR * stored_tensors(saved, checkpoint_file)
    # The selection file: one global model selected for 3 clients, its tensors written once.
    selection = next(killed.glob("selection-v*.pt"))
    heavy = checkpoint.load(selection)
    left_out = {path for path, _ in saved_copies(selection)}
    assert len(heavy["all"]["models"]) == 3 and left_out >= {
        ("all", "models", n, k) for n in ("B", "C") for k in heavy["all"]["models"]["A"]
    }
    assert selection.stat().st_size <= unique_bytes(heavy) + PER_TENSOR * stored_tensors(heavy, selection)
    text = resume_copy(cfg, killed, tmp_path / "resumed", caplog)
    assert "after round 2" in text
    assert_same_outputs(straight, tmp_path / "resumed")


def test_a_torn_history_line_is_dropped_and_a_lost_log_falls_back_to_a_fresh_start(
    straight_and_killed, tmp_path, caplog
):
    cfg, straight, killed = straight_and_killed
    with open(history_file(killed), "ab") as handle:
        handle.write(b'{"round": 3, "client": "A", "split": "tr')  # killed mid-append after round 2's checkpoint
    resume_copy(cfg, killed, tmp_path / "torn", caplog)
    assert_same_outputs(straight, tmp_path / "torn")

    caplog.clear()
    shutil.copytree(killed, tmp_path / "lost")
    history_file(tmp_path / "lost").write_bytes(b"")  # neither checkpoint's rows are there
    with caplog.at_level("INFO", logger="fedmedbench.engine"):
        engine.run_training(cfg, tmp_path / "lost", progress=False)
    assert "checkpoint-history.jsonl: does not hold the" in caplog.text and "resumed" not in caplog.text
    assert_same_outputs(straight, tmp_path / "lost")


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_a_wall_time_cadence_skips_checkpoints_and_changes_no_number(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=3)
    saved_rounds = []
    real = runfolder.save_state

    def recording(out_dir, checkpoint_path, round_index, *args):
        saved_rounds.append(round_index)
        return real(out_dir, checkpoint_path, round_index, *args)

    monkeypatch.setattr(engine, "save_state", recording)  # the name the engine's round loop calls
    engine.run_training(cfg, tmp_path / "every", progress=False)
    assert saved_rounds == [1, 2, 3]
    saved_rounds.clear()
    engine.run_training(cfg, tmp_path / "hourly", progress=False, checkpoint_every_seconds=3600)
    assert saved_rounds == [3]  # the last round always (it guards the final evaluation)
    assert_same_outputs(tmp_path / "every", tmp_path / "hourly")
    with pytest.raises(ConfigError, match=r"checkpoint_every_seconds: expected a number of seconds >= 0, got -1"):
        engine.run_training(cfg, tmp_path / "bad", progress=False, checkpoint_every_seconds=-1)
    assert not (tmp_path / "bad").exists()
