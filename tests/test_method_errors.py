"""A method's hook that fails is one line naming the method, the hook, the round and the client, then
the original error (``MethodError``), in the engine and on Flower's runtime alike; ``-v`` shows the
traceback. KeyboardInterrupt, SystemExit and the project's own errors (a divergence names its round
already) pass unchanged. The method is a user's plug-in, defined here; a built-in gets the same."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedmedbench.errors import DivergenceError, MethodError
from fedmedbench.fl import engine
from fedmedbench.models import build_model
from fedmedbench.registry import forget
from fedmedbench.runconfig import RunConfig
from tests.conftest import install_lab_plugin, tiny_run_config

ROOT = Path(__file__).resolve().parents[1]

BROKEN = '''
"""FedAvg that fails where its parameter ``fail`` says."""
import numpy as np
import torch

from fedmedbench.errors import DivergenceError
from fedmedbench.fl.client import Client as BaseClient
from fedmedbench.fl.server import Server as BaseServer

DEFAULTS = {"fail": "nothing"}
PERSONALIZED = False


class Client(BaseClient):
    def train(self, epochs):
        if self.params["fail"] == "key" and self.round_index == 2 and self.name == "B":
            return {}["x"]
        if self.params["fail"] == "interrupt" and self.round_index == 1:
            raise KeyboardInterrupt
        return super().train(epochs)

    def state_dict(self):
        state = super().state_dict()
        if self.params["fail"] == "numpy" and self.name == "B":
            state["anchor"] = np.zeros(3)
        return state


class Server(BaseServer):
    def aggregate(self, round_index, replies):
        super().aggregate(round_index, replies)
        if self.params["fail"] == "value" and round_index == 2:
            raise ValueError("the weights sum to 0.9")
        if self.params["fail"] == "shape":
            key = next(iter(self.global_state))
            self.global_state[key] = torch.zeros(5)
        if self.params["fail"] == "diverge":
            raise DivergenceError(f"round {round_index}, server: its own check")
'''


@pytest.fixture()
def plugin_root(tmp_path, monkeypatch):
    """``my_lab.brokenfed`` on sys.path and PYTHONPATH (a CLI process and Ray's workers import it)."""
    root = install_lab_plugin(tmp_path / "plugins", monkeypatch, "brokenfed", BROKEN)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    yield root
    forget()


def broken(store, split, fail, rounds=2):
    return tiny_run_config(
        store, split, "brokenfed", method_module="my_lab.brokenfed", method_params={"fail": fail}, rounds=rounds
    )


def test_a_key_error_in_client_train_names_method_hook_round_and_client(tmp_path, tiny_task, plugin_root):
    store, split = tiny_task
    with pytest.raises(MethodError) as caught:
        engine.run_training(broken(store, split, "key"), tmp_path / "run", threads=1, progress=False)
    assert str(caught.value) == "method 'brokenfed', Client.train, round 2, client 'B': KeyError: 'x'"
    assert type(caught.value.__cause__) is KeyError  # -v's traceback goes down to it


def test_a_value_error_in_aggregate_names_the_server_hook_and_round(tmp_path, tiny_task, plugin_root):
    store, split = tiny_task
    with pytest.raises(MethodError) as caught:
        engine.run_training(broken(store, split, "value"), tmp_path / "run", threads=1, progress=False)
    assert str(caught.value) == "method 'brokenfed', Server.aggregate, round 2: ValueError: the weights sum to 0.9"


def test_a_wrong_shaped_tensor_left_by_aggregate_names_the_parameter_and_both_shapes(tmp_path, tiny_task, plugin_root):
    store, split = tiny_task
    cfg = broken(store, split, "shape")
    key, tensor = next(iter(build_model(RunConfig.from_dict(cfg).model).state_dict().items()))
    with pytest.raises(MethodError) as caught:
        engine.run_training(cfg, tmp_path / "run", threads=1, progress=False)
    assert str(caught.value) == (
        f"method 'brokenfed', Client.receive, round 1, client 'A': ValueError: the package's tensor {key!r} has shape [5], "
        f"the model's has {list(tensor.shape)} (the server's aggregate or package made it so)"
    )


def test_a_numpy_value_in_client_state_dict_is_named_before_the_checkpoint_is_written(tmp_path, tiny_task, plugin_root):
    store, split = tiny_task
    with pytest.raises(MethodError) as caught:
        engine.run_training(broken(store, split, "numpy"), tmp_path / "run", threads=1, progress=False)
    assert str(caught.value) == (
        "method 'brokenfed', Client.state_dict, round 1, client 'B': the value at ['anchor'] is a numpy.ndarray, which a checkpoint "
        "cannot hold (it holds tensors, numbers, strings, bytes and dicts/lists/tuples/sets of them: torch.as_tensor turns an array into a tensor)"
    )
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_interrupts_and_the_projects_own_errors_pass_unchanged(tmp_path, tiny_task, plugin_root):
    store, split = tiny_task
    with pytest.raises(KeyboardInterrupt):
        engine.run_training(broken(store, split, "interrupt"), tmp_path / "interrupt", threads=1, progress=False)
    with pytest.raises(DivergenceError) as caught:
        engine.run_training(broken(store, split, "diverge"), tmp_path / "diverge", threads=1, progress=False)
    assert str(caught.value) == "round 1, server: its own check"


def test_a_builtin_methods_error_is_named_the_same_way(tmp_path, tiny_task, monkeypatch):
    from fedmedbench.methods import fedprox

    def receive(self, package):
        raise RuntimeError("boom")

    monkeypatch.setattr(fedprox.Client, "receive", receive)
    store, split = tiny_task
    with pytest.raises(
        MethodError, match=r"^method 'fedprox', Client\.receive, round 0, client 'A': RuntimeError: boom$"
    ):
        engine.run_training(
            tiny_run_config(store, split, "fedprox", rounds=1), tmp_path / "run", threads=1, progress=False
        )


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "fedmedbench", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([os.environ["PYTHONPATH"], str(ROOT / "src")])},
    )


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_the_cli_prints_one_line_and_the_traceback_only_with_v(tmp_path, tiny_task, plugin_root):
    store, split = tiny_task
    run_config = json.dumps(broken(store, split, "key"))
    quiet = run_cli(
        "train", "--run-config", run_config, "--out", str(tmp_path / "quiet"), "--threads", "1", "--no-progress"
    )
    assert quiet.returncode == 1
    assert quiet.stderr.splitlines()[-1].endswith(
        "ERROR fedmedbench: MethodError: method 'brokenfed', Client.train, round 2, client 'B': KeyError: 'x'"
    ), quiet.stderr[-2000:]
    assert "Traceback" not in quiet.stderr
    loud = run_cli(
        "-v", "train", "--run-config", run_config, "--out", str(tmp_path / "loud"), "--threads", "1", "--no-progress"
    )
    assert loud.returncode == 1
    assert "Traceback" in loud.stderr and 'return {}["x"]' in loud.stderr and "KeyError: 'x'" in loud.stderr


@pytest.mark.slow
def test_flowers_runtime_says_the_engines_line(tmp_path, tiny_task, plugin_root):
    """The same failure on ``runtime: flower-simulation`` reads exactly as the engine's line (the
    hook ran in the site's ClientApp, through the same guard, and the server raises it as it came)."""
    from fedmedbench.errors import MethodError
    from fedmedbench.federation.simulation import run_simulated

    store, split = tiny_task
    with pytest.raises(MethodError) as caught:
        run_simulated(broken(store, split, "key"), tmp_path / "flower", threads=1)
    assert str(caught.value) == "method 'brokenfed', Client.train, round 2, client 'B': KeyError: 'x'"


def test_what_state_dicts_guard_refuses_is_what_a_checkpoint_cannot_hold(tmp_path):
    """``hooks.uncheckpointable`` mirrors fl/checkpoint.py's checkpoint: the same verdict on every kind
    of value, and the same place named."""
    import collections

    import numpy as np
    import torch

    from fedmedbench.fl import checkpoint
    from fedmedbench.fl.hooks import uncheckpointable

    point = collections.namedtuple("point", "x y")
    values = [None, "s", 3, True, 1.5, np.float64(2.0), 1j, b"x", bytearray(b"y"), torch.Size([2]), torch.float32, torch.device("cpu"),
              torch.zeros(2), torch.nn.Parameter(torch.ones(1)), [1, (2, {3})], collections.OrderedDict(a=1), collections.Counter(a=1), {1: "an int key"},
              np.zeros(3), np.int64(3), np.float32(1.0), collections.defaultdict(int), point(1, 2), frozenset(), object(), {np.int64(1): 2}]  # fmt: skip
    for value in values:
        refused = uncheckpointable({"v": value}) is not None
        try:
            checkpoint.save({"v": value}, tmp_path / "c.pt")
            saved = True
        except TypeError:
            saved = False
        assert refused is not saved, repr(value)
    nested = {"clients": [{}, {"anchor": np.zeros(3)}]}
    assert uncheckpointable(nested) == ("['clients'][1]['anchor']", "numpy.ndarray")
    with pytest.raises(TypeError, match=re.escape("at ['clients'][1]['anchor']: numpy.ndarray")):
        checkpoint.save(nested, tmp_path / "c.pt")
