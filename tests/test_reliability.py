"""Trust in a run: divergence is an error, resume works from any moment and onto any device, a bad
config key is named, outputs are readable by the group, logs hold plain progress lines."""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fedmedbench import config as cfgmod
from fedmedbench import faults
from fedmedbench.errors import ConfigError, DivergenceError
from fedmedbench.fl import checkpoint, engine
from fedmedbench.fl.evaluation import check_finite
from fedmedbench.fl.runfolder import restore
from fedmedbench.fl.selection import Selection
from fedmedbench.runconfig import RunConfig
from tests.conftest import interrupt_after_round, tiny_run_config

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = Path(__file__).resolve().parents[1]


def train_cli(cfg, out, kill_at=None):
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop(faults.KILL_AT_ENV, None)
    if kill_at:
        env[faults.KILL_AT_ENV] = kill_at
    # The test process's thread count: float sums depend on it, and resumes are compared bit for bit.
    threads = str(torch.get_num_threads())
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
        threads,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


# --- 1. divergence ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("optimizer", "quantity"),
    [
        ({"name": "adam", "lr": 1e8, "betas": [0.9, 0.99]}, "running_var' is not finite"),  # BN statistics blow up
        ({"name": "sgd", "lr": 1e30}, "mean training loss is nan"),  # every loss NaN
    ],
)
def test_a_diverged_run_is_an_error_not_a_score(tmp_path, tiny_task, optimizer, quantity):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", optimizer=optimizer, rounds=2)
    with pytest.raises(DivergenceError, match=rf"round 1, client A: .*{quantity}"):
        engine.run_training(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "final.json").exists()


def test_the_cli_reports_divergence_in_one_line(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", optimizer={"name": "sgd", "lr": 1e30}, rounds=2)
    result = train_cli(cfg, tmp_path / "run")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "DivergenceError: round 1, client A: mean training loss is nan" in last_line(result.stderr)
    assert not (tmp_path / "run").exists()  # nothing half-written, not even an empty folder


def test_check_finite_names_the_tensor():
    state = {
        "a.weight": torch.ones(3),
        "a.num_batches_tracked": torch.tensor(3),
        "b.running_var": torch.tensor([1.0, float("inf")]),
    }
    with pytest.raises(DivergenceError, match=r"round 7, client X: evaluated model tensor 'b.running_var'"):
        check_finite(7, "X", "evaluated model", 0.5, state)
    check_finite(7, "X", "evaluated model", 0.5, {"a.weight": torch.ones(3)})  # finite: no error


# --- 2. resume onto any device ----------------------------------------------------------------------
def test_a_checkpoint_restores_onto_a_non_cpu_device(tmp_path, tiny_task, monkeypatch):
    """The checkpoint is read on the CPU; clients on another device (here 'meta', which CPU torch has)
    get their model/optimizer/method tensors there while the data generator keeps its CPU state.
    Loading with map_location=<device>, as before, moved the generator state and raised
    'RNG state must be a torch.ByteTensor' on CUDA."""
    from fedmedbench.fl.data import data_digest, load_clients
    from fedmedbench.fl.seeding import client_generator
    from fedmedbench.methods import fedprox
    from fedmedbench.models import build_model

    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedprox", method_params={"mu": 0.1})
    interrupt_after_round(cfg, tmp_path / "run", monkeypatch)
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.pt")
    assert all(t.device.type == "cpu" for t in saved["clients"][0]["anchor"])

    run_cfg = RunConfig.from_dict(cfg)
    data = load_clients(store, split, list(run_cfg.clients), False)
    model = build_model(run_cfg.model)
    meta = torch.device("meta")
    clients = [
        fedprox.Client(run_cfg, i, d, copy.deepcopy(model), client_generator(99, i), meta) for i, d in enumerate(data)
    ]
    server = fedprox.Server(run_cfg, model, len(data))
    selection = Selection(list(run_cfg.clients), run_cfg.selection_metric, per_client=False)
    with pytest.warns(UserWarning, match="meta"):  # torch: copying into a meta parameter is a no-op
        digest = data_digest(store, split, list(run_cfg.clients))
        last_round, history = restore(
            tmp_path / "run" / "checkpoint.pt", run_cfg.fingerprint(), digest, server, clients, selection
        )
    assert last_round == 1 and history
    for client, state in zip(clients, saved["clients"]):
        assert all(anchor.device == meta for anchor in client.anchor)
        assert client.generator.get_state().device.type == "cpu"
        assert torch.equal(client.generator.get_state(), state["generator"])


# --- kill anywhere ----------------------------------------------------------------------------------
def kill_moments(seed=8, count=5):
    """Five random moments of a 3-round run on the tiny task (5 train steps, 6 evaluation batches and
    one checkpoint per round), always including mid-round, mid-evaluation and mid-checkpoint-write."""
    rng = random.Random(seed)
    kinds = ["train_step", "eval_batch", "checkpoint_write"] + rng.choices(
        ["train_step", "eval_batch", "checkpoint_write"], k=count - 3
    )
    limits = {"train_step": 15, "eval_batch": 18, "checkpoint_write": 3}
    return [f"{kind}:{rng.randint(1, limits[kind])}" for kind in kinds]


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_a_job_killed_at_any_moment_resumes_to_the_same_final_json(tmp_path, tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedprox", method_params={"mu": 0.1})
    straight = engine.run_training(cfg, tmp_path / "straight", progress=False)
    expected = (tmp_path / "straight" / "final.json").read_text()
    for i, moment in enumerate(kill_moments()):
        out = tmp_path / f"killed{i}"
        killed = train_cli(cfg, out, kill_at=moment)
        assert killed.returncode == -signal.SIGKILL, (moment, killed.stderr)
        assert not (out / "final.json").exists()
        engine.run_training(cfg, out, progress=False)
        assert (out / "final.json").read_text() == expected, moment
        assert not (out / "checkpoint.pt").exists() and not checkpoint.previous(out / "checkpoint.pt").exists()
    assert straight["selection"]["rounds"] == 3


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "both_damaged"])
def test_a_damaged_checkpoint_falls_back_and_gives_the_same_numbers(tmp_path, tiny_task, monkeypatch, caplog, damage):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg")
    engine.run_training(cfg, tmp_path / "straight", progress=False)
    out = tmp_path / "run"
    interrupt_after_round(cfg, out, monkeypatch, round_index=2)
    checkpoint_file = out / "checkpoint.pt"
    data = checkpoint_file.read_bytes()
    if damage == "truncate":
        checkpoint_file.write_bytes(data[: len(data) // 2])
    else:
        checkpoint_file.write_bytes(data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:])
    if damage == "both_damaged":
        checkpoint.previous(checkpoint_file).write_bytes(b"garbage")
    with caplog.at_level("INFO", logger="fedmedbench.engine"):
        engine.run_training(cfg, out, progress=False)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "checkpoint.pt: damaged or cut short" in messages
    if damage == "both_damaged":
        assert "resumed" not in messages  # from scratch
    else:
        assert "checkpoint.pt.prev after round 1" in messages
    assert (out / "final.json").read_text() == (tmp_path / "straight" / "final.json").read_text()


# --- 4. config keys ---------------------------------------------------------------------------------
def config_with(tmp_path, edit):
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    edit(config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c["tasks"]["prostate"].update(batch_sise=4),
            r"tasks\.prostate: unknown key 'batch_sise' \(did you mean 'batch_size'\?\)",
        ),
        (
            lambda c: c["tasks"]["prostate"]["optimizer"].update(beta=[0.9, 0.9]),
            r"tasks\.prostate\.optimizer: unknown key 'beta' \(did you mean 'betas'\?\)",
        ),
        (
            lambda c: c["tasks"]["prostate"]["model"].update(init_feature=8),
            r"tasks\.prostate\.model: unknown key 'init_feature' \(did you mean 'init_features'\?\)",
        ),
        (
            lambda c: c["methods"]["fedprox"].update(muu=0.1),
            r"methods\.fedprox: unknown key 'muu' \(did you mean 'mu'\?\)",
        ),
        (
            lambda c: c["methods"]["harmofl"]["variants"]["e2"].update(local_epoch=2),
            r"methods\.harmofl\.variants\.e2 \(run harmofl-e2\): unknown key 'local_epoch' \(did you mean 'local_epochs'\?\)",
        ),
        (
            lambda c: c["experiments"]["harmofl_table1_prostate"].update(seed=[0]),
            r"experiments\.harmofl_table1_prostate: unknown key 'seed' \(did you mean 'seeds'\?\)",
        ),
    ],
)
def test_an_unknown_config_key_is_named_with_its_closest_spelling(tmp_path, edit, message):
    with pytest.raises(ConfigError, match=message):
        cfgmod.load_config(config_with(tmp_path, edit))


def test_the_run_config_json_is_read_strictly(tmp_path, tiny_task):
    store, split = tiny_task
    with pytest.raises(
        ConfigError, match=r"run config\.optimizer: unknown key 'weight_decy' \(did you mean 'weight_decay'\?\)"
    ):
        RunConfig.from_dict(tiny_run_config(store, split, optimizer={"name": "sgd", "lr": 0.1, "weight_decy": 0.1}))
    bad = tiny_run_config(store, split, "fedprox", method_params={"muu": 0.1})
    result = train_cli(bad, tmp_path / "run")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "unknown key 'muu' (did you mean 'mu'?)" in last_line(result.stderr)
    assert not (tmp_path / "run").exists()


def test_every_task_key_of_the_schema_is_a_run_config_field():
    """The schema (what config.yaml may say) and RunConfig (what a run reads) cannot drift apart."""
    schema = yaml.safe_load(cfgmod.SCHEMA.read_text())
    task_keys = set(schema["properties"]["tasks"]["additionalProperties"]["properties"])
    # dataset/protocol say which data; the execution keys say how to run, not what (no run-config field).
    assert task_keys - {"dataset", "protocol", *cfgmod.EXECUTION_KEYS} == set(cfgmod.TRAINING_KEYS)


# --- outputs and logs -------------------------------------------------------------------------------
def test_outputs_and_checkpoints_follow_the_umask(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=2)
    old = os.umask(0o022)
    try:
        interrupt_after_round(cfg, tmp_path / "run", monkeypatch, round_index=1)
        assert stat.S_IMODE((tmp_path / "run" / "checkpoint.pt").stat().st_mode) == 0o644
        engine.run_training(cfg, tmp_path / "run", progress=False)
    finally:
        os.umask(old)
    for name in ("final.json", "history.csv", "model_best.pt", "predictions.npz"):
        assert stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) == 0o644, name


def test_job_logs_get_plain_progress_lines(tmp_path, tiny_task):
    store, split = tiny_task
    result = train_cli(tiny_run_config(store, split, "fedavg", rounds=2), tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr
    assert "tiny/fedavg/seed0: 1/2 round" in result.stderr and "tiny/fedavg/seed0: 2/2 round" in result.stderr
