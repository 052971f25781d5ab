"""``fedmedbench new-method NAME [--out DIR]``: a pip-installable package holding a method of your own
(in ``./NAME`` by default).

It registers the method under the entry point group ``fedmedbench.methods`` (so, once installed,
``NAME`` is a method name like ``fedavg``), documents in a line each hook the method may override,
and carries a test that trains it for two rounds on a tiny synthetic federation, built by the public
helper ``fedmedbench.testing.tiny_run_config`` from the method's own ``DEFAULTS``. ``NAME`` is both
the distribution and the import package, so a name that is installed, importable, in the standard
library, a keyword or a built-in method is refused (``check_name``), and so is a name too long for
the file system. The package is written in a hidden folder beside ``DIR`` and renamed into place at
the end: a failure leaves nothing behind.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import keyword
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from fedmedbench.errors import ConfigError
from fedmedbench.files import atomic_write_text, new_folder, public_mode
from fedmedbench.registry import builtin_methods, entry_point_methods

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
# The longest file name that holds NAME, beyond NAME itself: the wheel `pip install -e` builds,
# NAME-0.1.0-0.editable-py3-none-any.whl (35 more), with room to spare for its temporaries.
NAME_OVERHEAD = 40

PYPROJECT = """[build-system]
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
"""

METHOD = '''"""{name}: a federated learning method of your own, run by fedmedbench like a built-in one.

The contract: ``DEFAULTS``, ``PARAM_SCHEMA`` (optional), ``PERSONALIZED``, ``Server`` and ``Client``.
The base classes are FedAvg; override only the hooks your method changes (each is listed below
with what it does). As written, with ``mu = 0`` this method is FedAvg; ``mu > 0`` adds FedProx's
proximal term, to show a hyperparameter in use.
"""

import torch

from fedmedbench.fl.client import Client as BaseClient
from fedmedbench.fl.server import Server as BaseServer

# Hyperparameters: `methods.{name}.<key>` in config/config.yaml (and its variants). Types come from these
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

import pandas as pd

from fedmedbench.fl.engine import run_training
from fedmedbench.testing import tiny_run_config

from {name}.method import DEFAULTS


def test_{name}_trains_two_rounds(tmp_path):
    # The run's parameters are the method's own DEFAULTS: rename, add or remove one and this test holds.
    cfg = tiny_run_config("{name}.method", tmp_path / "data")
    final = run_training(cfg, tmp_path / "run", progress=False)
    assert final["selection"]["rounds"] == 2
    assert set(final["test"]) == set(cfg["clients"])
    assert all(0.0 <= scores["dice_paper"] <= 1.0 for scores in final["test"].values())
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    assert sorted(history["round"].unique()) == [1, 2]
    assert json.loads((tmp_path / "run" / "final.json").read_text())["config"]["method_params"] == DEFAULTS
'''

README = """# {name}

A federated learning method for [fedmedbench](https://github.com/fedmedbench/fedmedbench).

    pip install -e .            # registers `{name}` as a fedmedbench method (entry point)
    pytest                      # trains it for two rounds on a tiny synthetic federation

Then run it beside the baselines on multi-site data of your own, one folder per site
(`<root>/<site>/images/` and `<root>/<site>/masks/`, the `folders` family of fedmedbench's
docs/extending.md). In the fedmedbench checkout, write a tiny three-site example dataset there and
an overlay `{name}.yaml`:

    python -c "from fedmedbench.data.folders import write_example; write_example('mydata')"
    snakemake --cores 2 --configfile {name}.yaml

with `{name}.yaml`:

    run_name: {name}
    data:
      mydata: {{family: folders, root: mydata, kind: segmentation, mask_values: {{0: 0, 128: 1, 255: 2}}}}
    tasks:
      mydata: {{dataset: mydata, kind: segmentation, rounds: 5}}
    # installed, {name} needs no section; `methods: {{{name}: {{mu: 0.1}}}}` sets its parameters (DEFAULTS in src/{name}/method.py)
    selected_experiments: [mydata_table]
    experiments:
      mydata_table: {{title: "My data: test Dice (%) per site", task: mydata, runs: [fedavg, fedprox, {name}], seeds: [0], metric: dice_paper}}

The table is `results/{name}/tables/mydata_table.md`, the report `results/{name}/report.md`.
"""


def check_name(name: str) -> None:
    """``name`` can be a new package and method: a lowercase identifier that names nothing installed,
    importable or built in, so that the package's own ``pip install -e`` never replaces a distribution
    and its import never shadows a module (or is shadowed by one). One line naming ``name`` and why."""
    where = f"new-method: {name!r}"
    if not NAME_PATTERN.match(name):
        raise ConfigError(
            f"{where} is not a valid method name (lowercase letters, digits and _, starting with a letter)"
        )
    if keyword.iskeyword(name):
        raise ConfigError(f"{where} is a Python keyword: `import {name}` cannot work; choose another name")
    if name in builtin_methods():
        raise ConfigError(f"{where} is a built-in method; choose another name")
    if name in sys.stdlib_module_names:
        raise ConfigError(
            f"{where} is a module of Python's standard library, which the new package would shadow; choose another name"
        )
    wanted = _distribution_key(name)
    for dist in importlib.metadata.distributions():
        if _distribution_key(dist.metadata["Name"] or "") == wanted:
            raise ConfigError(
                f"{where} is the name of the installed distribution {dist.metadata['Name']} {dist.version}, which "
                f"`pip install -e` of the new package would replace; choose another name"
            )
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    # A bare folder (a namespace package) shadows nothing: a real module or package wins over it.
    if spec is not None and spec.origin not in (None, "namespace"):
        raise ConfigError(
            f"{where} is an importable module ({spec.origin}); the new package would shadow it or be shadowed by it; choose another name"
        )
    if name in entry_point_methods():
        raise ConfigError(
            f"{where} is already a method (entry point of {entry_point_methods()[name][1]}); choose another name"
        )


def _distribution_key(name: str) -> str:
    """A distribution name as pip compares them (PEP 503: case, and runs of - _ . alike)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def name_max(path: Path) -> int:
    """The longest file name the file system of ``path`` (or of its nearest existing parent) takes."""
    existing = next(
        (p for p in (path, *path.parents) if os.path.exists(p)), Path(".")
    )  # os.path: False, not an error, for a name too long
    try:
        return os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def new_method(name: str, out: Path) -> list[Path]:
    """Write the package into ``out`` (which must not exist yet, or be an empty folder); the files
    written. All or nothing: they appear in ``out`` in one rename."""
    # The length first: looking a name up (check_name) already fails on one the file system cannot hold.
    limit = name_max(out.absolute()) - NAME_OVERHEAD
    if len(name) > limit:
        raise ConfigError(
            f"new-method: the name is {len(name)} characters long; at most {limit} here (the file system takes "
            f"{limit + NAME_OVERHEAD} per file name, and pip's files add up to {NAME_OVERHEAD} to it); choose a shorter name"
        )
    check_name(name)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"new-method: {out} exists and is {'not empty' if out.is_dir() else 'a file'}; give another --out"
        )
    files = {
        Path("pyproject.toml"): PYPROJECT,
        Path("README.md"): README,
        Path("src") / name / "__init__.py": f'"""{name}: a fedmedbench method (see method.py)."""\n',
        Path("src") / name / "method.py": METHOD,
        Path("tests") / f"test_{name}.py": TEST,
    }
    out = out.absolute()
    with new_folder(out.parent) as parent:  # parents it creates go again if anything below fails
        staging = Path(tempfile.mkdtemp(prefix=".new-method-", dir=parent))
        try:
            for path, template in files.items():
                atomic_write_text(staging / path, template.format(name=name))
            public_mode(staging)  # mkdtemp's folder is private (0700); a package folder is not
            os.rename(staging, out)  # replaces an empty folder; fails on a non-empty one
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return [out / path for path in files]
