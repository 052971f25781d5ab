"""Shared fixtures: a tiny federated segmentation task written in the canonical store format, and
the one path to ../shared (design notes, real data samples) for the tests that read it."""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

# One CPU thread per test process and per process it starts (Snakemake's jobs, Flower's apps): pytest
# runs three workers on machines with as few as two cores, where torch's default (a thread per core in
# every process) oversubscribes them, and OpenMP threads spin while they wait: CPU lost, not shared.
# Set before anything imports torch, which reads it once.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from fedmedbench.data.store import write_client, write_split_csv  # noqa: E402

# Tests that read ../shared use it when it is beside the checkout and skip (or fall back to synthetic
# data) when it is not. FEDMEDBENCH_SHARED overrides where it is: `make test-without-shared` (part of
# `make test-all`, hence of .ci/run) sets it to a missing path
# and runs the tests marked `shared` again, as a fresh clone without ../shared would run them.
SHARED_ENV = "FEDMEDBENCH_SHARED"


def shared_dir() -> Path:
    """``$FEDMEDBENCH_SHARED``, else ``<repository>/../shared``; it may not exist."""
    return Path(os.environ.get(SHARED_ENV) or Path(__file__).resolve().parents[2] / "shared")


def realdata_dir() -> Path:
    """The real data samples (``shared/realdata``, see its PROVENANCE*.md); it may not exist."""
    return shared_dir() / "realdata"


def pytest_configure(config):
    # The tiers (pyproject.toml registers `slow` and `federation`; Makefile: `make test` runs
    # `-m "not slow"`, `make test-all` every tier).
    config.addinivalue_line(
        "markers", f"shared: reads ../shared (${SHARED_ENV}) where present; make test-all runs these again without it"
    )


@pytest.hookimpl(trylast=True)  # after `-m` deselected what this run leaves out
def pytest_collection_modifyitems(config, items):
    """The files with the longest tests first, each file's tests kept together and in order: pytest-xdist
    (`--dist loadfile`) hands files to workers in this order, so the real federations and Ray (marked
    `federation`; the slow ones longest) start at once and the short files fill the other workers
    around them, instead of one long file starting last and running alone. Among those, the files with
    the most such tests (the equivalence matrix) first."""

    def weight(item) -> int:
        return 2 * bool(item.get_closest_marker("federation")) + bool(item.get_closest_marker("slow"))

    heaviest, count = {}, Counter()
    for item in items:
        heaviest[item.path] = max(heaviest.get(item.path, 0), weight(item))
    for item in items:
        count[item.path] += weight(item) == heaviest[item.path]
    # Stable: a file's tests stay together and in order, files of equal weight in collection order.
    items.sort(key=lambda item: (-heaviest[item.path], -count[item.path] if heaviest[item.path] else 0))


# --- no logging handler outlives its stream ----------------------------------------------------------
# A handler made during a test (``cli.main`` in-process, a library imported there) may hold that test's
# captured stderr, which pytest closes afterwards: every later record then printed "--- Logging error
# --- ValueError: I/O operation on closed file". Each test's own handlers are removed after it, and at
# the end of the session a handler still on pytest's capture is pointed at the real stderr.
def _loggers():
    yield logging.getLogger()
    yield from (lg for lg in list(logging.Logger.manager.loggerDict.values()) if isinstance(lg, logging.Logger))


def _pytests(handler) -> bool:
    """pytest's own capture handlers (caplog, the report's), which come and go with each phase."""
    return type(handler).__module__.startswith("_pytest")


@pytest.fixture(autouse=True)
def _no_logging_handler_outlives_its_test():
    before = {lg: set(lg.handlers) for lg in _loggers()}
    root_level = logging.getLogger().level
    yield
    for lg in _loggers():
        for handler in [h for h in lg.handlers if not _pytests(h) and h not in before.get(lg, ())]:
            lg.removeHandler(handler)
            handler.close()
        for handler in lg.handlers:  # one made before the test whose stream the test replaced and closed
            if (
                isinstance(handler, logging.StreamHandler)
                and not _pytests(handler)
                and getattr(handler.stream, "closed", False)
            ):
                handler.stream = sys.__stderr__  # not setStream: it flushes the closed stream first
    logging.getLogger().setLevel(root_level)


def pytest_unconfigure(config):
    for lg in _loggers():
        for handler in lg.handlers:
            stream = getattr(handler, "stream", None)
            if (
                isinstance(handler, logging.StreamHandler)
                and not _pytests(handler)
                and type(stream).__module__.startswith("_pytest")
            ):
                handler.stream = (
                    sys.__stderr__
                )  # pytest closes its capture after this hook (at exit, Ray and Flower still log)


def write_tiny_task(root, clients=("A", "B", "C"), n=(12, 10, 8), size=16, seed=0):
    """Per client: images with a bright square (site-specific brightness), label = the square."""
    rng = np.random.default_rng(seed)
    store, rows = root / "store", []
    for c, (name, count) in enumerate(zip(clients, n)):
        images = rng.integers(0, 60, (count, size, size, 3), dtype=np.uint8)
        labels = np.zeros((count, size, size), np.uint8)
        for i in range(count):
            y, x = rng.integers(2, size - 8, 2)
            labels[i, y : y + 6, x : x + 6] = 1
            images[i, y : y + 6, x : x + 6] += np.uint8(120 + 30 * c)
        meta = pd.DataFrame(
            {
                "id": [f"{name}/s{i}" for i in range(count)],
                "group": [f"{name}/case{i % 3}" for i in range(count)],
                "source": "synthetic",
            }
        )
        write_client(store, name, images, labels, meta)
        parts = ["train"] * (count - 4) + ["val"] * 2 + ["test"] * 2
        rows += [
            {"client": name, "split": s, "row": i, "id": f"{name}/s{i}", "group": f"{name}/case{i % 3}"}
            for i, s in enumerate(parts)
        ]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return store, root / "split.csv"


def tiny_run_config(store, split, method="fedavg", clients=("A", "B", "C"), **overrides):
    cfg = {
        "task": "tiny",
        "method": method,
        "variant": None,
        "run": method,
        "seed": 0,
        "kind": "segmentation",
        "clients": list(clients),
        "client_labels": list(clients),
        "data": {"store": str(store), "split": str(split), "synthetic": True},
        "model": {"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2},
        "loss": "dice_ce",
        "optimizer": {"name": "adam", "lr": 1e-2, "betas": [0.9, 0.99], "weight_decay": 1e-4},
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 4,
        "augment": "harmofl",
        "intensity_scale": 1 / 255,
        "truncate_to_smallest": False,
        "aggregation": {"weighting": "uniform", "bn_buffers": "average"},
        "selection_metric": "dice_paper",
        "method_params": {},
    }
    cfg.update(overrides)
    return cfg


def toy_run_config(**fields):
    """A RunConfig with placeholder task fields, for unit tests of one server or client hook."""
    from fedmedbench.config import deep_merge
    from fedmedbench.runconfig import RunConfig

    base = {
        "task": "toy", "method": "toy", "run": "toy", "seed": 0, "data": {"store": "-", "split": "-"},
        "kind": "classification", "clients": ["a"], "model": {"name": "unet"}, "loss": "ce",
        "optimizer": {"name": "sgd", "lr": 0.1}, "rounds": 1, "local_epochs": 1, "batch_size": 1,
        "selection_metric": "accuracy",
    }  # fmt: skip
    return RunConfig.from_dict(deep_merge(base, fields))


def train(tmp_path, name, cfg):
    """Run a config; return (final.json, model_best.pt, history.csv text)."""
    from fedmedbench.fl import checkpoint
    from fedmedbench.fl.engine import run_training

    final = run_training(cfg, tmp_path / name, progress=False)
    return (
        final,
        checkpoint.load_plain(tmp_path / name / "model_best.pt"),
        (tmp_path / name / "history.csv").read_text(),
    )


def strip(final):
    """final.json without the fields that name the method (and the digest, which covers them)."""
    return {k: v for k, v in final.items() if k not in ("config", "method", "run", "digest")}


def assert_same_models(a, b):
    import torch

    assert a["models"]["base"].keys() == b["models"]["base"].keys()
    for key in a["models"]["base"]:
        assert torch.equal(a["models"]["base"][key], b["models"]["base"][key]), key


def build_federation(method, cfg, model=None):
    """A method's server and clients on the tiny task, as the engine builds them, after round 0's
    package: (cfg with the method's defaults merged, model, server, clients)."""
    import copy
    from pathlib import Path

    import torch

    from fedmedbench.fl.data import load_clients
    from fedmedbench.fl.seeding import client_generator
    from fedmedbench.models import build_model
    from fedmedbench.runconfig import RunConfig

    cfg = RunConfig.from_dict({**cfg, "method_params": {**method.DEFAULTS, **cfg["method_params"]}})
    data = load_clients(Path(cfg.data.store), Path(cfg.data.split), list(cfg.clients), False)
    if model is None:
        torch.manual_seed(0)
        model = build_model(cfg.model)
    server = method.Server(cfg, model, len(data))
    clients = [
        method.Client(cfg, i, d, copy.deepcopy(model), client_generator(0, i), torch.device("cpu"))
        for i, d in enumerate(data)
    ]
    for c in clients:
        c.receive(server.package(c.index, 0))
    return cfg, model, server, clients


class Killed(Exception):
    """Stands in for SIGKILL in in-process resume tests."""


def interrupt_after_round(cfg, out, monkeypatch, round_index=1):
    """Train until the checkpoint of ``round_index`` is written, then stop as a killed job would."""
    from fedmedbench import faults
    from fedmedbench.fl import engine

    def fake_kill(pid, sig):
        raise Killed

    monkeypatch.setenv(faults.KILL_AT_ENV, f"round_end:{round_index}")
    monkeypatch.setattr(faults.os, "kill", fake_kill)
    with pytest.raises(Killed):
        engine.run_training(cfg, out, progress=False)
    monkeypatch.delenv(faults.KILL_AT_ENV)


def install_lab_plugin(root, monkeypatch, name: str, source: str):
    """A plug-in method ``my_lab.<name>`` (``source``) importable from ``root`` for this test: written,
    put first on sys.path, any earlier ``my_lab`` forgotten (a method registry cache included).
    Returns ``root``; the caller ``forget()``s the registry again when done."""
    from fedmedbench.registry import forget

    (root / "my_lab").mkdir(parents=True)
    (root / "my_lab" / "__init__.py").write_text("")
    (root / "my_lab" / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(root))
    for module in [m for m in sys.modules if m == "my_lab" or m.startswith("my_lab.")]:
        monkeypatch.delitem(sys.modules, module)
    forget()
    return root


@pytest.fixture()
def tiny_task(tmp_path):
    return write_tiny_task(tmp_path / "data")
