"""Checkpoints (fl/state.py, FMBCKPT2): each distinct tensor content written once, streamed, read back
with the same aliasing and values; history in an append-only log; old FMBCKPT1 checkpoints resumed;
a cadence by wall time. Engine-level cases run the tiny FedAvg task and compare outputs byte for byte."""

from __future__ import annotations

import collections
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedmedbench.errors import ConfigError
from fedmedbench.fl import engine, runfolder
from fedmedbench.fl import state as ckpt_io
from fedmedbench.fl.runfolder import history_file
from tests.conftest import interrupt_after_round, tiny_run_config

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


def unique_bytes(tree) -> int:
    """Bytes of the distinct storage contents (SHA-256): what a checkpoint must at least hold."""
    digests = {}
    for t in tensors_of(tree):
        s = t.untyped_storage()
        digests[hashlib.sha256(torch.empty(0, dtype=torch.uint8).set_(s).numpy()).digest()] = s.nbytes()
    return sum(digests.values())


# --- the format -------------------------------------------------------------------------------------
def test_equal_copies_are_written_once_and_read_back_as_independent_tensors(tmp_path):
    torch.manual_seed(0)
    weights = torch.randn(MIB // 4)  # 1 MiB
    other = torch.randn(MIB // 4)
    obj = {"server": weights, "clients": [weights.clone(), weights.clone(), weights.clone()], "momentum": other}
    ckpt_io.save_checkpoint(obj, tmp_path / "c.pt")
    size = (tmp_path / "c.pt").stat().st_size
    assert 2 * MIB < size < 2 * MIB + 1024  # two distinct MiB + header, index and trailer
    back = ckpt_io.load_checkpoint(tmp_path / "c.pt")
    assert all(torch.equal(c, weights) for c in back["clients"]) and torch.equal(back["momentum"], other)
    pointers = {t.data_ptr() for t in (back["server"], *back["clients"])}
    assert len(pointers) == 4  # copies stay copies: an in-place step on one client...
    back["clients"][0].add_(1.0)
    assert torch.equal(back["clients"][1], weights) and torch.equal(back["server"], weights)  # ...reaches no other


def test_views_stay_views_and_every_value_type_round_trips(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    state = module.state_dict()
    base = torch.randn(12)
    shared = [1, 2]
    obj = {
        "model": state,
        "views": [base, base[2:5], base.view(3, 4).t()],
        "scalars": (1, 2.5, float("nan"), -0.0, float("inf"), None, True, "x", 2**70, 1 + 2j),
        "int_keys": {0: torch.zeros(3), 1: torch.zeros(3)},
        "a": shared,
        "b": shared,
        "set": {1, 2},
        "bytes": b"\x00\x01",
        "param": torch.nn.Parameter(torch.ones(2)),
        "misc": [torch.Size([2, 3]), torch.float16, torch.device("cpu"), collections.Counter("aab"), bytearray(b"z")],
        "bf16": torch.randn(5).bfloat16(),
        "channels_last": torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
        "empty": torch.empty(0),
        "step": torch.tensor(3),
    }
    ckpt_io.save_checkpoint(obj, tmp_path / "c.pt")
    back = ckpt_io.load_checkpoint(tmp_path / "c.pt")
    assert type(back["model"]) is collections.OrderedDict and back["model"]._metadata == state._metadata
    for key, value in state.items():
        assert torch.equal(back["model"][key], value) and back["model"][key].dtype == value.dtype
    v0, v1, v2 = back["views"]
    assert v1.untyped_storage().data_ptr() == v0.untyped_storage().data_ptr() and v1.storage_offset() == 2
    assert v2.stride() == (1, 4) and torch.equal(v2, base.view(3, 4).t())
    v0[3] = 100.0
    assert v1[1] == 100.0 and v2[3, 0] == 100.0  # one storage, as before the save
    scalars = back["scalars"]
    assert scalars[:2] == (1, 2.5) and math.isnan(scalars[2]) and math.copysign(1, scalars[3]) == -1 and scalars[4:] == (float("inf"), None, True, "x", 2**70, 1 + 2j)
    assert list(back["int_keys"]) == [0, 1] and back["int_keys"][0].data_ptr() != back["int_keys"][1].data_ptr()
    assert back["a"] is back["b"]  # one list in two places stays one list (as pickle keeps it)
    assert back["set"] == {1, 2} and back["bytes"] == b"\x00\x01"
    assert type(back["param"]) is torch.nn.Parameter and back["param"].requires_grad
    assert back["misc"] == [torch.Size([2, 3]), torch.float16, torch.device("cpu"), collections.Counter("aab"), bytearray(b"z")]
    assert back["bf16"].dtype == torch.bfloat16 and torch.equal(back["bf16"], obj["bf16"])
    assert back["channels_last"].stride() == obj["channels_last"].stride() and torch.equal(back["channels_last"], obj["channels_last"])
    assert back["empty"].shape == (0,) and back["step"].item() == 3 and back["step"].dim() == 0


def test_contents_that_differ_only_in_the_middle_or_in_nan_and_sign_bits_are_not_merged(tmp_path):
    a = torch.zeros(4096)
    b = torch.zeros(4096)
    b[2048] = 1.0  # same size, same first and last 64 bytes: a candidate, then told apart in full
    nan1 = torch.tensor([float("nan")] * 64)
    nan2 = nan1.view(torch.int32).add(1).view(torch.float32)  # another NaN payload: torch.equal says NaN != NaN anyway
    obj = {"a": a, "b": b, "zero": torch.zeros(64), "minus_zero": -torch.zeros(64), "nan1": nan1, "nan2": nan2, "ints": torch.zeros(4096, dtype=torch.int32)}
    ckpt_io.save_checkpoint(obj, tmp_path / "c.pt")
    back = ckpt_io.load_checkpoint(tmp_path / "c.pt")
    for key, value in obj.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key].view(torch.uint8), value.view(torch.uint8)), key
    # a, b and ints are three storages of equal size; a and ints hold the same bytes (one blob).
    index = json.loads(read_index(tmp_path / "c.pt"))
    assert sum(index["blobs"]) == 2 * 16384 + 4 * 256


def read_index(path: Path) -> bytes:
    data = path.read_bytes()
    _, offset, length, _, _ = ckpt_io.TRAILER.unpack(data[-ckpt_io.TRAILER.size :])
    return data[offset : offset + length]


@pytest.mark.parametrize("where", ["data", "index", "trailer", "cut"])
def test_damage_anywhere_is_reported_as_a_corrupt_checkpoint(tmp_path, where):
    torch.manual_seed(0)
    ckpt_io.save_checkpoint({"w": torch.randn(1000), "x": [1, 2]}, tmp_path / "c.pt")
    data = bytearray((tmp_path / "c.pt").read_bytes())
    position = {"data": 100, "index": len(data) - ckpt_io.TRAILER.size - 5, "trailer": len(data) - 3}.get(where)
    if position is None:
        data = data[: len(data) // 2]
    else:
        data[position] ^= 0xFF
    (tmp_path / "c.pt").write_bytes(bytes(data))
    with pytest.raises(ckpt_io.CorruptCheckpoint, match=r"c\.pt: damaged or cut short \(checksum mismatch\)"):
        ckpt_io.load_checkpoint(tmp_path / "c.pt")


def test_a_value_a_checkpoint_cannot_hold_is_named_and_nothing_is_written(tmp_path):
    import numpy as np

    with pytest.raises(TypeError, match=r"c\.pt: cannot checkpoint the value at \['clients'\]\[1\]\['anchor'\]: numpy\.ndarray"):
        ckpt_io.save_checkpoint({"clients": [{}, {"anchor": np.zeros(3)}]}, tmp_path / "c.pt")
    assert list(tmp_path.iterdir()) == []


def test_the_old_format_is_still_read(tmp_path):
    obj = {"round": 2, "history": [{"round": 1, "value": 0.5}], "w": torch.arange(5.0)}
    ckpt_io.save_checkpoint_v1(obj, tmp_path / "old.pt")
    assert (tmp_path / "old.pt").read_bytes()[-ckpt_io.LEGACY_TRAILER.size :].startswith(b"FMBCKPT1")
    back = ckpt_io.load_checkpoint(tmp_path / "old.pt")
    assert back["round"] == 2 and back["history"] == obj["history"] and torch.equal(back["w"], obj["w"])



def mixed_state() -> dict:
    """Duplicates (copies of one weight), a view, contents differing only in the middle, small
    tensors below ``SMALL`` (staged on the host path) and an empty one."""
    torch.manual_seed(0)
    weights = torch.randn(3000)
    differ = weights.clone()
    differ[1500] += 1.0
    return {"server": weights, "clients": [weights.clone(), weights.clone()], "differ": differ, "view": weights[10:20], "small": [torch.arange(7.0), torch.arange(7.0), torch.ones(3, dtype=torch.int64)], "empty": torch.empty(0)}


def test_the_device_path_writes_the_same_file_as_the_host_path(tmp_path, monkeypatch):
    """The path for device memory (fl/state_device.py: equal storages found in bulk before the walk,
    new blobs copied to the host PENDING bytes at a time) forced on CPU tensors, with pieces of 1 KiB
    and copies of 4 KiB: byte for byte the file the host path writes (memcmp, views of the tensors'
    memory), and few copies to the host, each of which is a wait for the device on a GPU
    (benchmarks/bench_checkpoint_gpu.py checks the same on a real one)."""
    obj = mixed_state()
    ckpt_io.save_checkpoint(obj, tmp_path / "host.pt")
    monkeypatch.setattr(ckpt_io, "_DEVICE_PATH", True)
    monkeypatch.setattr(ckpt_io, "CHUNK", 1024)  # the 12,000-byte weights: 12 pieces
    monkeypatch.setattr(ckpt_io, "PENDING", 4096)  # copied to the host 4 pieces at a time
    monkeypatch.setattr(ckpt_io, "QUEUE", 1)  # every copied batch waits for the one before to be written
    calls = {"equal": 0, "cpu": 0}
    real_equal, real_cpu = torch.equal, torch.Tensor.cpu
    monkeypatch.setattr(ckpt_io.torch, "equal", lambda a, b: calls.__setitem__("equal", calls["equal"] + 1) or real_equal(a, b))
    monkeypatch.setattr(torch.Tensor, "cpu", lambda t: calls.__setitem__("cpu", calls["cpu"] + 1) or real_cpu(t))
    monkeypatch.setattr(ckpt_io, "_MEMCMP", None)
    ckpt_io.save_checkpoint(obj, tmp_path / "device.pt")
    assert (tmp_path / "device.pt").read_bytes() == (tmp_path / "host.pt").read_bytes()
    # Copies to the host: 1 of every storage's ends; 1 of the answers for the two client copies and
    # `differ` (same size and ends) compared with the server's weights in one stack (`differ`, alone in
    # the next pass, needs no compare); 6 of the new blobs: the weights' and differ's 24 pieces
    # (11 x 1,024 + 736 bytes each) flushed at 4,096, 4,096, 4,832, 4,096, 4,096 bytes, and the last
    # 2,784 bytes with arange(7) and ones(3) at the end. No compare one pair at a time.
    assert calls["equal"] == 0 and calls["cpu"] == 1 + 1 + 6
    back = ckpt_io.load_checkpoint(tmp_path / "device.pt")
    assert torch.equal(back["differ"], obj["differ"]) and all(torch.equal(c, obj["server"]) for c in back["clients"])
    assert back["view"].untyped_storage().data_ptr() == back["server"].untyped_storage().data_ptr()
    index = json.loads(read_index(tmp_path / "device.pt"))
    assert index["blobs"] == [12000, 12000, 28, 24, 0]  # weights, differ, arange(7) once, ones(3) int64, the empty one


def gpu_job_state() -> tuple[dict, list[torch.Tensor]]:
    """A GPU job's checkpoint as torch lays it out: models and Adam moments in device memory, each
    Adam step count a host scalar between two device moments, then the host RNG state (small) and a
    large host tensor. Returns the state and the tensors that play device memory."""
    torch.manual_seed(1)
    weights = {"conv": torch.randn(20_000), "bias": torch.randn(16)}
    clients = [{k: v.clone() for k, v in weights.items()} for _ in range(2)]
    adam = [{i: {"step": torch.tensor(3.0), "exp_avg": torch.randn(5_000), "exp_avg_sq": torch.rand(5_000)} for i in range(3)} for _ in range(2)]
    # "buffers" (device) right before the host ones: device bytes are waiting when the RNG state comes.
    state = {"global": weights, "clients": clients, "optimizers": adam, "buffers": torch.randn(1_000), "host": {"rng": torch.get_rng_state(), "curve": torch.arange(30_000.0)}, "tail": torch.randn(9_000)}
    device = [*weights.values(), *(t for c in clients for t in c.values()), *(m[k] for o in adam for m in o.values() for k in ("exp_avg", "exp_avg_sq")), state["buffers"], state["tail"]]
    return state, device


def test_device_and_host_storages_interleaved_as_in_a_gpu_job_keep_the_files_order(tmp_path, monkeypatch):
    """Device blobs wait for one copy to the host while small host blobs after them wait with them, and
    a large host blob after both goes after them: the file is byte for byte the host path's, whatever
    takes the device path (on an H200 a state like this loaded back wrong before this was fixed)."""
    state, device = gpu_job_state()
    ckpt_io.save_checkpoint(state, tmp_path / "host.pt")
    monkeypatch.setattr(ckpt_io, "_DEVICE_PATH", frozenset(t.untyped_storage().data_ptr() for t in device))
    monkeypatch.setattr(ckpt_io, "CHUNK", 8192)
    monkeypatch.setattr(ckpt_io, "PENDING", 50_000)  # several copies, some with host blobs between them
    copies = []
    real_to_host = ckpt_io.state_device.to_host
    monkeypatch.setattr(ckpt_io.state_device, "to_host", lambda views: copies.append(sum(len(v) for v in views)) or real_to_host(views))
    ckpt_io.save_checkpoint(state, tmp_path / "device.pt")
    assert (tmp_path / "device.pt").read_bytes() == (tmp_path / "host.pt").read_bytes()
    back = ckpt_io.load_checkpoint(tmp_path / "device.pt")
    assert torch.equal(back["host"]["curve"], state["host"]["curve"]) and torch.equal(back["host"]["rng"], state["host"]["rng"])
    assert all(torch.equal(back["optimizers"][c][i][k], state["optimizers"][c][i][k]) for c in range(2) for i in range(3) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert torch.equal(back["tail"], state["tail"]) and torch.equal(back["clients"][1]["conv"], state["global"]["conv"])
    # New device bytes: the global model (80,064), 12 moments of 20,000, the buffers (4,000), the tail
    # (36,000). Copied as soon as 50,000 bytes wait (pieces of at most 8,192): 6 copies; the buffers'
    # 4,000 bytes when the curve (120,000 bytes, host) arrives, with the RNG state waiting behind them;
    # the tail at the end. The client copies are found equal before the walk: never copied.
    assert copies == [57_344, 50_912, 51_808, 56_384, 51_808, 51_808, 4_000, 36_000]
    assert sum(copies) == 80_064 + 12 * 20_000 + 4_000 + 36_000


@pytest.mark.skipif(ckpt_io._SYNC_FILE_RANGE is None, reason="needs Linux's sync_file_range")
def test_the_writer_starts_the_disks_writeback_over_every_byte_and_falls_back_when_refused(tmp_path, monkeypatch):
    obj = {"w": torch.arange(50_000, dtype=torch.float32), "v": torch.arange(30_000, dtype=torch.int64)}
    monkeypatch.setattr(ckpt_io, "CHUNK", 8192)
    monkeypatch.setattr(ckpt_io, "WRITEBACK", 65536)
    ranges = []
    real = ckpt_io._SYNC_FILE_RANGE
    monkeypatch.setattr(ckpt_io, "_SYNC_FILE_RANGE", lambda fd, start, n, flags: ranges.append((start, n, flags)) or real(fd, start, n, flags))
    ckpt_io.save_checkpoint(obj, tmp_path / "c.pt")
    blobs = 200_000 + 240_000
    assert ranges[0][0] == len(ckpt_io.MAGIC) and all(a + n == b for (a, n, _), (b, _, _) in zip(ranges, ranges[1:]))  # contiguous
    assert all(n >= 65536 and flags == 2 for _, n, flags in ranges)  # SYNC_FILE_RANGE_WRITE only: no waiting
    assert blobs + 8 - 65536 < ranges[-1][0] + ranges[-1][1] <= blobs + 8  # the rest: the fsync's
    back = ckpt_io.load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(back["w"], obj["w"]) and torch.equal(back["v"], obj["v"])

    ranges.clear()
    monkeypatch.setattr(ckpt_io, "_SYNC_FILE_RANGE", lambda fd, start, n, flags: ranges.append(start) or -1)  # refused (EINVAL, ...)
    ckpt_io.save_checkpoint(obj, tmp_path / "c.pt")
    assert ranges == [len(ckpt_io.MAGIC)]  # asked once, then left to the fsync
    back = ckpt_io.load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(back["w"], obj["w"]) and torch.equal(back["v"], obj["v"])

# VmHWM, not ru_maxrss: Linux carries the parent's resident size at fork into a child's ru_maxrss,
# and pytest's process is large; VmHWM is this process's own high-water mark, and can be reset.
PEAK = """
import sys, tempfile, torch
from pathlib import Path
from fedmedbench.fl import state
obj = {f"t{i}": torch.full((16 << 20,), float(i)) for i in range(4)}  # 4 x 64 MiB, distinct
status = lambda key: int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark to the current size
before = status("VmRSS")
with tempfile.TemporaryDirectory() as tmp:
    getattr(state, sys.argv[1])(obj, Path(tmp) / "c.pt")
print((status("VmHWM") - before) / 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_a_checkpoint_is_streamed_so_its_size_does_not_raise_peak_memory():
    def rise(writer: str) -> float:
        out = subprocess.run([sys.executable, "-c", PEAK, writer], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
        if out.returncode and "clear_refs" in out.stderr:
            pytest.skip("cannot reset the memory high-water mark here")
        assert out.returncode == 0, out.stderr
        return float(out.stdout)

    assert rise("save_checkpoint") < 40  # MiB: bounded by the writer's queue, not by the 256 MiB written
    assert rise("save_checkpoint_v1") > 250  # the old format built the whole file in memory


def test_the_history_log_keeps_exact_rows_and_drops_what_follows_its_position(tmp_path):
    log = ckpt_io.HistoryLog(tmp_path / "h.jsonl")
    rows = [{"round": 1, "client": "A", "split": "val", "metric": "dice", "value": 0.1 + 0.2}, {"round": 1, "client": "A", "split": "test_local", "metric": "loss", "value": float("nan"), "epoch": 0}]
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
    with pytest.raises(ckpt_io.CorruptCheckpoint, match=r"h\.jsonl: does not hold the 2 history rows"):
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
    assert sorted(p.name for p in b.iterdir()) == sorted([*OUTPUTS, "run_config.json"])  # checkpoints and the history log removed


def test_a_fedavg_checkpoint_holds_each_distinct_tensor_once_and_the_history_outside(straight_and_killed, tmp_path, caplog):
    cfg, straight, killed = straight_and_killed
    checkpoint = killed / "checkpoint.pt"
    saved = ckpt_io.load_checkpoint(checkpoint)
    assert "history" not in saved and saved["history_log"]["rows"] == len(ckpt_io.HistoryLog(history_file(killed)).read(saved["history_log"]))
    copies = sum(t.untyped_storage().nbytes() for t in tensors_of(saved))
    unique = unique_bytes(saved)
    model = sum(t.untyped_storage().nbytes() for t in saved["server"]["global_state"].values())
    assert copies - unique >= 3 * model  # the 3 clients' models are copies of the server's global weights
    assert checkpoint.stat().st_size <= 1.1 * unique
    # The selection file: one global model selected for 3 clients, its tensors written once.
    selection = next(killed.glob("selection-v*.pt"))
    heavy = ckpt_io.load_checkpoint(selection)
    model_bytes = sum(t.untyped_storage().nbytes() for t in heavy["all"]["models"]["A"].values())
    predictions = sum(t.untyped_storage().nbytes() for t in tensors_of(heavy["all"]["predictions"]))
    assert len(heavy["all"]["models"]) == 3 and sum(json.loads(read_index(selection))["blobs"]) <= model_bytes + predictions
    text = resume_copy(cfg, killed, tmp_path / "resumed", caplog)
    assert "after round 2" in text
    assert_same_outputs(straight, tmp_path / "resumed")


def test_a_torn_history_line_is_dropped_and_a_lost_log_falls_back_to_a_fresh_start(straight_and_killed, tmp_path, caplog):
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


def test_a_checkpoint_of_the_old_format_is_resumed(straight_and_killed, tmp_path, caplog):
    """A job killed before the upgrade left FMBCKPT1 files (history inside, no log): it resumes."""
    cfg, straight, killed = straight_and_killed
    old = tmp_path / "old"
    shutil.copytree(killed, old)
    log = ckpt_io.HistoryLog(history_file(old))
    for path in (old / "checkpoint.pt", ckpt_io.previous(old / "checkpoint.pt")):
        state = ckpt_io.load_checkpoint(path)
        state["history"] = log.read(state.pop("history_log"))
        path.unlink()
        ckpt_io.save_checkpoint_v1(state, path)
    for path in old.glob("selection-v*.pt"):
        heavy = ckpt_io.load_checkpoint(path)
        path.unlink()
        ckpt_io.save_checkpoint_v1(heavy, path)
    history_file(old).unlink()
    assert ckpt_io.previous(old / "checkpoint.pt").read_bytes()[-20:].startswith(b"FMBCKPT1")
    caplog.clear()
    with caplog.at_level("INFO", logger="fedmedbench.engine"):
        engine.run_training(cfg, old, progress=False)
    assert "after round 2" in caplog.text
    assert_same_outputs(straight, old)


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
