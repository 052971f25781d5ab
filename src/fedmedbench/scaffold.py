"""``fedmedbench new-method NAME --out DIR``: a pip-installable package holding a method of your own.

It registers the method under the entry point group ``fedmedbench.methods`` (so, once installed,
``NAME`` is a method name like ``fedavg``), documents in a line each hook the method may override,
and carries a test that trains it for two rounds on a tiny synthetic federation.
"""

from __future__ import annotations

import re
from pathlib import Path

from fedmedbench.errors import ConfigError
from fedmedbench.files import atomic_write_text

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")

PYPROJECT = '''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "{name}: a federated learning method for fedmedbench"
requires-python = ">=3.10"
dependencies = ["fedmedbench"]

[project.optional-dependencies]
dev = ["pytest"]

# fedmedbench finds the method by this entry point: `{name}` becomes a method name like `fedavg`.
[project.entry-points."fedmedbench.methods"]
{name} = "{name}.method"

[tool.setuptools.packages.find]
where = ["src"]
'''

METHOD = '''"""{name}: a federated learning method of your own, run by fedmedbench like a built-in one.

The contract: ``DEFAULTS``, ``PARAM_SCHEMA`` (optional), ``PERSONALIZED``, ``Server`` and ``Client``.
The base classes are FedAvg; override only the hooks your method changes (each is listed below
with what it does). As written, with ``mu = 0`` this method is FedAvg; ``mu > 0`` adds FedProx's
proximal term, to show a hyperparameter in use.
"""

import torch

from fedmedbench.fl.client import Client as BaseClient
from fedmedbench.fl.server import Server as BaseServer

# Hyperparameters: `methods.{name}.<key>` in config.yaml (and its variants). Types come from these
# values (a string is never read as a number or a boolean); checked when Snakemake builds the DAG.
DEFAULTS = {{"mu": 0.0}}
# Optional: ranges, choices, and the type of a parameter whose default is None (JSON Schema).
PARAM_SCHEMA = {{"mu": {{"type": "number", "minimum": 0}}}}
# True: every client keeps its own model (model selection per client).
PERSONALIZED = False


class Client(BaseClient):
    """Hooks (self.cfg: the run config, self.params: the hyperparameters, self.model, self.data):
    receive(package)        load the server's package (default: the shared weights)
    before_epoch(epoch)     called before each local epoch of a round
    loss(x, y)              the training loss of a batch (default: the task's loss)
    after_backward()        between backward() and optimizer.step(): gradient corrections
    train_step(x, y)        one optimizer step (override for e.g. a two-pass step)
    reply()                 what goes up to the server (default: model, sample count, steps)
    answer(query)           reply to the server's optional second exchange
    eval_model()            the model that is validated, selected and tested
    state_dict() / load_state_dict(state)   extra state to checkpoint (resume is exact)
    """

    def receive(self, package):
        super().receive(package)
        self.anchor = [p.detach().clone() for p in self.model.parameters()]

    @torch.no_grad()
    def after_backward(self):
        mu = self.params["mu"]
        if mu:
            for param, anchor in zip(self.model.parameters(), self.anchor):
                if param.grad is not None:
                    param.grad.add_(param - anchor, alpha=mu)


class Server(BaseServer):
    """Hooks (self.cfg, self.params, self.global_state: the global weights):
    package(client_index, round_index)   what each client receives
    query(round_index, replies)          an optional second exchange before aggregation
    aggregate(round_index, replies)      combine the replies (default: FedAvg)
    round_log(round_index)               per-client scalars for history.csv
    state_dict() / load_state_dict(state)   extra state to checkpoint
    """
'''

TEST = '''"""{name} trains for two rounds on a tiny synthetic three-site federation (seconds on a CPU)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.data.store import write_client, write_split_csv
from fedmedbench.fl.engine import run_training


def tiny_federation(root: Path):
    """Three sites of 16x16 images with a bright square; the label is the square."""
    rng = np.random.default_rng(0)
    rows = []
    for site in ("siteA", "siteB", "siteC"):
        images = rng.integers(0, 60, (10, 16, 16, 3), dtype=np.uint8)
        labels = np.zeros((10, 16, 16), np.uint8)
        for i in range(10):
            y, x = rng.integers(2, 8, 2)
            labels[i, y : y + 6, x : x + 6] = 1
            images[i, y : y + 6, x : x + 6] += 150
        meta = pd.DataFrame({{"id": [f"{{site}}/{{i}}" for i in range(10)], "group": [f"{{site}}/{{i}}" for i in range(10)], "source": "synthetic"}})
        write_client(root / "store", site, images, labels, meta)
        parts = ["train"] * 6 + ["val"] * 2 + ["test"] * 2
        rows += [{{"client": site, "split": s, "row": i, "id": f"{{site}}/{{i}}", "group": f"{{site}}/{{i}}"}} for i, s in enumerate(parts)]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv"


def test_{name}_trains_two_rounds(tmp_path):
    store, split = tiny_federation(tmp_path / "data")
    cfg = {{
        "task": "tiny", "method": "{name}", "method_module": "{name}.method", "run": "{name}", "seed": 0,
        "kind": "segmentation", "clients": ["siteA", "siteB", "siteC"],
        "data": {{"store": str(store), "split": str(split), "synthetic": True}},
        "model": {{"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2}},
        "loss": "dice_ce", "optimizer": {{"name": "adam", "lr": 1e-2}},
        "rounds": 2, "local_epochs": 1, "batch_size": 4, "intensity_scale": 1 / 255,
        "selection_metric": "dice_paper", "method_params": {{"mu": 0.01}},
    }}
    final = run_training(cfg, tmp_path / "run", progress=False)
    assert final["selection"]["rounds"] == 2
    assert set(final["test"]) == {{"siteA", "siteB", "siteC"}}
    assert all(0.0 <= scores["dice_paper"] <= 1.0 for scores in final["test"].values())
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    assert sorted(history["round"].unique()) == [1, 2]
    assert json.loads((tmp_path / "run" / "final.json").read_text())["config"]["method_params"] == {{"mu": 0.01}}
'''

README = '''# {name}

A federated learning method for [fedmedbench](https://github.com/fedmedbench/fedmedbench).

    pip install -e .            # registers `{name}` as a fedmedbench method (entry point)
    pytest                      # trains it for two rounds on a tiny synthetic federation

Then name it in a table of your config, like any built-in method:

    methods:
      {name}: {{mu: 0.01}}
    experiments:
      my_table: {{title: "...", task: prostate, runs: [fedavg, fedprox, {name}], seeds: [0], metric: dice_paper}}
'''


def new_method(name: str, out: Path) -> list[Path]:
    """Write the package into ``out`` (which must not exist yet, or be empty); the files written."""
    from fedmedbench.methods import builtin_methods

    if not NAME_PATTERN.match(name):
        raise ConfigError(f"new-method: {name!r} is not a valid method name (lowercase letters, digits and _, starting with a letter)")
    if name in builtin_methods():
        raise ConfigError(f"new-method: {name!r} is a built-in method; choose another name")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"new-method: {out} exists and is not empty")
    files = {
        out / "pyproject.toml": PYPROJECT,
        out / "README.md": README,
        out / "src" / name / "__init__.py": f'"""{name}: a fedmedbench method (see method.py)."""\n',
        out / "src" / name / "method.py": METHOD,
        out / "tests" / f"test_{name}.py": TEST,
    }
    for path, template in files.items():
        atomic_write_text(path, template.format(name=name))
    return list(files)
