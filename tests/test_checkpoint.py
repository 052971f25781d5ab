"""Checkpoints (fl/checkpoint.py): a federated state's repeated tensors written once (by structure: the
same key, equal bits), read back with the same values, aliasing and independence; any damage reported;
a write killed at any moment leaves the last two checkpoints byte for byte."""

from __future__ import annotations

import collections
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedmedbench.fl import checkpoint

SRC = Path(__file__).resolve().parents[1] / "src"  # for the subprocess
MIB = 1 << 20


def saved_copies(path: Path) -> list:
    """The (path, source path) pairs a checkpoint file lists: the tensors it did not store again."""
    data = path.read_bytes()
    copies = torch.load(io.BytesIO(data[: -checkpoint.TRAILER.size]), weights_only=True)["copies"]
    return [(tuple(path), tuple(source)) for path, source in json.loads(copies)]


def fedavg_state(clients: int = 3) -> dict:
    """A FedAvg checkpoint's shape after distribution: every client's model holds the global values
    (copies, not views), and each has its own optimizer moments and generator state."""
    torch.manual_seed(0)
    glob = {
        "conv.weight": torch.randn(MIB // 4),
        "bn.running_mean": torch.randn(64),
        "bn.num_batches_tracked": torch.tensor(7),
    }
    return {
        "server": {"global_state": glob},
        "clients": [
            {
                "model": {k: v.clone() for k, v in glob.items()},
                "optimizer": {
                    "state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.randn(MIB // 4)}},
                    "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": [0]}],
                },
                "generator": torch.Generator().manual_seed(i).get_state(),
            }
            for i in range(clients)
        ],
    }


# --- structural deduplication -------------------------------------------------------------------------
def test_the_global_state_is_written_once_and_each_client_adds_only_its_own_tensors(tmp_path):
    state = fedavg_state()
    checkpoint.save(state, tmp_path / "c.pt")
    size = (tmp_path / "c.pt").stat().st_size
    # The global model (1 MiB) once, 3 clients' moments (1 MiB each), their generators (3 x 5,056 bytes)
    # and a few KiB of structure.
    assert 4 * MIB < size < 4 * MIB + 32 * 1024
    # Left out: every client's model (the global values) and the step counts equal to client 0's.
    models = {("clients", i, "model", k) for i in range(3) for k in state["server"]["global_state"]}
    steps = {("clients", i, "optimizer", "state", 0, "step") for i in (1, 2)}
    assert {p for p, _ in saved_copies(tmp_path / "c.pt")} == models | steps
    back = checkpoint.load(tmp_path / "c.pt")
    for client, original in zip(back["clients"], state["clients"]):
        assert all(torch.equal(client["model"][k], v) for k, v in state["server"]["global_state"].items())
        assert torch.equal(client["optimizer"]["state"][0]["exp_avg"], original["optimizer"]["state"][0]["exp_avg"])
        assert torch.equal(client["generator"], original["generator"]) and client["generator"].dtype == torch.uint8
    # Each copy has its own memory: an in-place step on one client's model reaches no one else.
    weights = [back["server"]["global_state"]["conv.weight"], *(c["model"]["conv.weight"] for c in back["clients"])]
    assert len({w.data_ptr() for w in weights}) == 4
    back["clients"][0]["model"]["conv.weight"].add_(1.0)
    assert torch.equal(back["clients"][1]["model"]["conv.weight"], state["server"]["global_state"]["conv.weight"])
    assert torch.equal(back["server"]["global_state"]["conv.weight"], state["server"]["global_state"]["conv.weight"])


def test_a_shared_key_a_client_holds_differently_is_stored_and_read_back_as_it_was(tmp_path):
    """Mid-round, or under FedBN (local BN statistics), a client's value of a shared key is its own."""
    state = fedavg_state()
    state["clients"][1]["model"]["conv.weight"][MIB // 8] += 1.0  # one element in the middle
    state["clients"][2]["model"]["bn.running_mean"].mul_(2.0)
    checkpoint.save(state, tmp_path / "c.pt")
    left_out = {p for p, _ in saved_copies(tmp_path / "c.pt")}
    assert ("clients", 1, "model", "conv.weight") not in left_out and (
        "clients",
        2,
        "model",
        "bn.running_mean",
    ) not in left_out
    assert len(left_out) == 9 + 2 - 2  # the models' 9 tensors and 2 step counts, less the two changed
    back = checkpoint.load(tmp_path / "c.pt")
    for client, original in zip(back["clients"], state["clients"]):
        assert all(torch.equal(client["model"][k], v) for k, v in original["model"].items())


def test_contents_that_differ_only_in_nan_payload_or_the_sign_of_zero_are_not_merged(tmp_path):
    nan1 = torch.tensor([float("nan")] * 64)
    nan2 = nan1.view(torch.int32).add(1).view(torch.float32)  # another NaN payload
    a = {"w": torch.zeros(4096), "nan": nan1, "ints": torch.zeros(4096, dtype=torch.int32), "same": torch.arange(64.0)}
    b = {"w": -torch.zeros(4096), "nan": nan2, "ints": torch.zeros(4096, dtype=torch.int32), "same": torch.arange(64.0)}
    checkpoint.save({"a": a, "b": b}, tmp_path / "c.pt")
    assert sorted(saved_copies(tmp_path / "c.pt")) == [(("b", "ints"), ("a", "ints")), (("b", "same"), ("a", "same"))]
    back = checkpoint.load(tmp_path / "c.pt")
    for name, original in (("a", a), ("b", b)):
        for key, value in original.items():
            assert back[name][key].dtype == value.dtype and torch.equal(
                back[name][key].view(torch.uint8), value.view(torch.uint8)
            ), (name, key)


def test_a_copy_keeps_its_type_gradient_flag_and_memory_layout(tmp_path):
    weight = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    obj = {
        "a": {"w": torch.nn.Parameter(weight.clone()), "cl": weight},
        "b": {"w": torch.nn.Parameter(weight.clone()), "cl": weight.clone()},
    }
    checkpoint.save(obj, tmp_path / "c.pt")
    assert len(saved_copies(tmp_path / "c.pt")) == 2
    back = checkpoint.load(tmp_path / "c.pt")
    assert (
        type(back["b"]["w"]) is torch.nn.Parameter and back["b"]["w"].requires_grad and back["b"]["w"].grad_fn is None
    )
    assert back["b"]["cl"].stride() == weight.stride() and torch.equal(back["b"]["cl"], weight)


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
        "complex": torch.complex(torch.arange(4.0), -torch.arange(4.0)),
        "channels_last": torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last),
        "empty": torch.empty(0),
        "step": torch.tensor(3),
    }
    checkpoint.save(obj, tmp_path / "c.pt")
    back = checkpoint.load(tmp_path / "c.pt")
    assert type(back["model"]) is collections.OrderedDict and back["model"]._metadata == state._metadata
    for key, value in state.items():
        assert torch.equal(back["model"][key], value) and back["model"][key].dtype == value.dtype
    v0, v1, v2 = back["views"]
    assert v1.untyped_storage().data_ptr() == v0.untyped_storage().data_ptr() and v1.storage_offset() == 2
    assert v2.stride() == (1, 4) and torch.equal(v2, base.view(3, 4).t())
    v0[3] = 100.0
    assert v1[1] == 100.0 and v2[3, 0] == 100.0  # one storage, as before the save
    scalars = back["scalars"]
    assert (
        scalars[:2] == (1, 2.5)
        and math.isnan(scalars[2])
        and math.copysign(1, scalars[3]) == -1
        and scalars[4:] == (float("inf"), None, True, "x", 2**70, 1 + 2j)
    )
    assert list(back["int_keys"]) == [0, 1] and back["int_keys"][0].data_ptr() != back["int_keys"][1].data_ptr()
    assert back["a"] is back["b"]  # one list in two places stays one list (as pickle keeps it)
    assert back["set"] == {1, 2} and back["bytes"] == b"\x00\x01"
    assert type(back["param"]) is torch.nn.Parameter and back["param"].requires_grad
    assert back["misc"] == [
        torch.Size([2, 3]),
        torch.float16,
        torch.device("cpu"),
        collections.Counter("aab"),
        bytearray(b"z"),
    ]
    assert back["bf16"].dtype == torch.bfloat16 and torch.equal(back["bf16"], obj["bf16"])
    assert back["complex"].dtype == torch.complex64 and torch.equal(back["complex"], obj["complex"])
    assert back["channels_last"].stride() == obj["channels_last"].stride() and torch.equal(
        back["channels_last"], obj["channels_last"]
    )
    assert back["empty"].shape == (0,) and back["step"].item() == 3 and back["step"].dim() == 0


# --- what a checkpoint refuses ----------------------------------------------------------------------
@pytest.mark.filterwarnings(
    "ignore:torch.quantize_per_tensor"
)  # deprecated in torch; still a dtype a checkpoint must refuse
def test_a_value_a_checkpoint_cannot_hold_is_named_and_nothing_is_written(tmp_path):
    import numpy as np

    with pytest.raises(
        TypeError, match=r"c\.pt: cannot checkpoint the value at \['clients'\]\[1\]\['anchor'\]: numpy\.ndarray"
    ):
        checkpoint.save({"clients": [{}, {"anchor": np.zeros(3)}]}, tmp_path / "c.pt")
    z = torch.complex(torch.arange(4.0), -torch.arange(4.0))
    for value, what in [
        (z.conj(), r"a Tensor of layout torch\.strided and dtype torch\.complex64"),
        (
            torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),
            r"a Tensor of layout torch\.strided and dtype torch\.qint8",
        ),
        (torch.ones(3).to_sparse(), r"a Tensor of layout torch\.sparse_coo and dtype torch\.float32"),
        (torch.empty(3, device="meta"), r"a tensor on the meta device"),
    ]:
        with pytest.raises(TypeError, match=r"bad\.pt: cannot checkpoint the value at \['w'\]\[1\]: " + what):
            checkpoint.save({"w": [torch.ones(1), value]}, tmp_path / "bad.pt")
    assert list(tmp_path.iterdir()) == []


# --- damage -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["header", "tensor", "end_of_payload", "trailer", "cut", "empty"])
def test_damage_anywhere_is_reported_as_a_corrupt_checkpoint(tmp_path, where):
    """torch.load alone reads a flipped byte in a tensor's data without a word; the checksum catches it."""
    torch.manual_seed(0)
    weights = torch.randn(1000)
    checkpoint.save({"w": weights, "x": [1, 2]}, tmp_path / "c.pt")
    data = bytearray((tmp_path / "c.pt").read_bytes())
    tensor_at = bytes(data).index(weights.numpy().tobytes())
    position = {
        "header": 10,
        "tensor": tensor_at + 2000,
        "end_of_payload": len(data) - checkpoint.TRAILER.size - 5,
        "trailer": len(data) - 3,
    }.get(where)
    if where == "cut":
        data = data[: len(data) // 2]
    elif where == "empty":
        data = bytearray()
    else:
        data[position] ^= 0xFF
    (tmp_path / "c.pt").write_bytes(bytes(data))
    with pytest.raises(checkpoint.CorruptCheckpoint, match=r"c\.pt: damaged or cut short \(checksum mismatch\)"):
        checkpoint.load(tmp_path / "c.pt")


# --- atomic replacement -----------------------------------------------------------------------------
def test_each_checkpoint_keeps_the_one_before_as_prev_byte_for_byte_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "checkpoint.pt"
    states = [{"w": torch.full((n,), float(i)), "round": i} for i, n in enumerate((50_000, 40_000, 10_000, 60_000))]
    fresh = []
    for i, state in enumerate(states):
        checkpoint.save(state, tmp_path / f"fresh{i}.pt")
        fresh.append((tmp_path / f"fresh{i}.pt").read_bytes())
    for i, state in enumerate(states):
        checkpoint.save(state, path)
        assert path.read_bytes() == fresh[i] and checkpoint.load(path)["round"] == i  # the same bytes as a fresh write
        if i >= 1:
            assert checkpoint.previous(path).read_bytes() == fresh[i - 1]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("fresh")) == [
        "checkpoint.pt",
        "checkpoint.pt.prev",
    ]


def test_a_failed_write_leaves_the_last_two_checkpoints_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    for i in range(3):
        checkpoint.save({"round": i, "w": torch.arange(1000.0) + i}, path)
    last, prev = path.read_bytes(), checkpoint.previous(path).read_bytes()
    with pytest.raises(TypeError, match=r"checkpoint\.pt: cannot checkpoint the value at \['bad'\]"):
        checkpoint.save({"w": torch.zeros(3000), "bad": object()}, path)

    def full_disk(obj, handle):
        handle.write(b"x" * 1000)
        raise OSError(28, "No space left on device")

    crc_option = torch.serialization.get_crc32_options()
    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save({"w": torch.zeros(3000)}, path)
    assert torch.serialization.get_crc32_options() == crc_option  # torch's own option given back
    assert path.read_bytes() == last and checkpoint.previous(path).read_bytes() == prev
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "checkpoint.pt.prev"]


KILLED_WRITES = """
import json, os, signal, sys, torch
from pathlib import Path
from fedmedbench.fl import checkpoint
torch.set_num_threads(1)
folder = Path(sys.argv[1])
path = folder / "checkpoint.pt"
states = [{"round": r, "server": {"global_state": {"w": torch.full((20_000,), float(r))}}, "clients": [{"model": {"w": torch.full((20_000,), float(r))}, "m": torch.randn(5_000)} for _ in range(3)]} for r in range(3)]
checkpoint.save(states[0], path)
checkpoint.save(states[1], path)
before = {"path": path.read_bytes().hex(), "prev": checkpoint.previous(path).read_bytes().hex()}
writes = [0]
real_write, real_replace = checkpoint._ChecksummedWriter.write, os.replace
def counting(self, data):
    writes[0] += 1
    return real_write(self, data)
checkpoint._ChecksummedWriter.write = counting
checkpoint.save(states[2], folder / "count.pt")  # how many pieces a write of state 2 hands over
outcomes = []
for moment in [*range(1, writes[0] + 1), "before_rename", "between_renames"]:
    pid = os.fork()
    if pid == 0:  # the child: state 2's checkpoint, killed at ``moment``
        calls = [0]
        def write(self, data):
            calls[0] += 1
            if calls[0] == moment:
                os.kill(os.getpid(), signal.SIGKILL)
            return real_write(self, data)
        def replace(a, b):
            if moment == "before_rename":
                os.kill(os.getpid(), signal.SIGKILL)
            real_replace(a, b)
            if moment == "between_renames":
                os.kill(os.getpid(), signal.SIGKILL)
        checkpoint._ChecksummedWriter.write = write
        os.replace = replace
        checkpoint.save(states[2], path)
        os._exit(3)
    _, status = os.waitpid(pid, 0)
    after = {name: (file.read_bytes().hex() if file.exists() else None) for name, file in (("path", path), ("prev", checkpoint.previous(path)))}
    temporaries = [p.name for p in folder.glob(".*.tmp")]
    outcomes.append({"moment": moment, "killed": os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, "after": after, "temporaries": temporaries})
    for p in folder.glob(".*.tmp"):
        p.unlink()
    # Put the two checkpoints back as they were for the next moment.
    path.write_bytes(bytes.fromhex(before["path"]))
    checkpoint.previous(path).write_bytes(bytes.fromhex(before["prev"]))
print(json.dumps({"before": before, "outcomes": outcomes, "writes": writes[0]}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_a_write_killed_at_any_moment_leaves_the_last_two_checkpoints_byte_for_byte(tmp_path):
    """SIGKILL after each piece torch.save hands over, before the renames and between them: ``path``
    and ``.prev`` hold the two last complete checkpoints byte for byte, or (killed between the two
    renames) ``path`` is missing and ``.prev`` holds the last one; what a kill leaves besides is a
    temporary that ``runfolder.remove_stale_files`` removes. A resume reads the last checkpoint."""
    out = subprocess.run(
        [sys.executable, "-c", KILLED_WRITES, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    before, outcomes = result["before"], result["outcomes"]
    assert result["writes"] >= 10 and len(outcomes) == result["writes"] + 2
    for outcome in outcomes:
        assert outcome["killed"], outcome["moment"]
        if outcome["moment"] == "between_renames":
            assert outcome["after"] == {"path": None, "prev": before["path"]}
        else:
            assert outcome["after"] == before, outcome["moment"]
            assert len(outcome["temporaries"]) == 1 and outcome["temporaries"][0].startswith(".checkpoint.pt."), outcome
    last = checkpoint.load(tmp_path / "checkpoint.pt")  # the state the test put back: round 1
    assert last["round"] == 1 and torch.equal(last["clients"][2]["model"]["w"], torch.full((20_000,), 1.0))


# --- a plain torch.save file --------------------------------------------------------------------------
def test_a_plain_file_is_written_atomically_and_read_by_torch_load(tmp_path):
    checkpoint.save_plain({"models": {"w": torch.arange(3.0)}}, tmp_path / "model_best.pt")
    assert torch.equal(torch.load(tmp_path / "model_best.pt", weights_only=True)["models"]["w"], torch.arange(3.0))
    assert torch.equal(checkpoint.load_plain(tmp_path / "model_best.pt")["models"]["w"], torch.arange(3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["model_best.pt"]
