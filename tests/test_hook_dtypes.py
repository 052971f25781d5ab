"""A method hook that hands on a non-floating tensor (int64, bool) where the model's is floating is
one line naming the method, the hook, the round and the key, as a wrong shape is: the
next ``receive`` would cast it back without a word, the weights rounded. The method is a user's
plug-in, defined here."""

from __future__ import annotations

import pytest
import torch

from fedmedbench.errors import MethodError
from fedmedbench.fl import engine
from fedmedbench.models import build_model
from fedmedbench.registry import forget
from fedmedbench.runconfig import RunConfig
from tests.conftest import install_lab_plugin, tiny_run_config

INTFED = '''
"""FedAvg whose state turns integer where its parameter ``where`` says."""
import torch

from fedmedbench.fl.client import Client as BaseClient
from fedmedbench.fl.server import Server as BaseServer

DEFAULTS = {"where": "nowhere"}
PERSONALIZED = False


def first_float(state):
    return next(k for k, v in state.items() if v.is_floating_point())


class Client(BaseClient):
    def reply(self):
        message = super().reply()
        if self.params["where"] == "reply" and self.name == "B":
            key = first_float(message["state"])
            message["state"] = {**message["state"], key: message["state"][key].round().to(torch.int64)}
        return message


class Server(BaseServer):
    def aggregate(self, round_index, replies):
        super().aggregate(round_index, replies)
        if self.params["where"] == "aggregate" and round_index == 2:
            key = first_float(self.global_state)
            self.global_state[key] = (self.global_state[key] * 100).to(torch.int64)  # "fixed point", forgot to divide

    def package(self, client_index, round_index):
        package = super().package(client_index, round_index)
        if self.params["where"] == "package" and round_index == 1:
            key = first_float(package["state"])
            package = {"state": {**package["state"], key: package["state"][key] > 0}}
        return package
'''


@pytest.fixture()
def intfed(tmp_path, monkeypatch):
    install_lab_plugin(tmp_path / "plugins", monkeypatch, "intfed", INTFED)
    yield
    forget()


def intfed_config(tiny_task, where):
    store, split = tiny_task
    return tiny_run_config(
        store, split, "intfed", method_module="my_lab.intfed", method_params={"where": where}, rounds=2
    )


def first_float_key(cfg) -> str:
    state = build_model(RunConfig.from_dict(cfg).model).state_dict()
    return next(k for k, v in state.items() if v.is_floating_point())


@pytest.mark.parametrize(
    ("where", "line"),
    [
        (
            "aggregate",
            "method 'intfed', Server.aggregate, round 2: the global state's tensor {key!r} is torch.int64, the model's is torch.float32",
        ),
        (
            "package",
            "method 'intfed', Server.package, round 1, client 'A': the package's tensor {key!r} is torch.bool, the model's is torch.float32",
        ),
        (
            "reply",
            "method 'intfed', Client.reply, round 1, client 'B': the reply's tensor {key!r} is torch.int64, the model's is torch.float32",
        ),
    ],
)
def test_a_non_floating_tensor_a_hook_hands_on_is_named_with_method_hook_round_and_key(
    tmp_path, tiny_task, intfed, where, line
):
    cfg = intfed_config(tiny_task, where)
    with pytest.raises(MethodError) as caught:  # was: accepted, the run finished with rounded weights
        engine.run_training(cfg, tmp_path / "run", threads=1, progress=False)
    key = first_float_key(cfg)
    assert str(caught.value) == line.format(key=key) + (
        ": keep the model's floating dtype (integer arithmetic rounds the weights; divide with / or cast back with .to(torch.float32))"
    )
    assert not (tmp_path / "run" / "final.json").exists()


def test_the_models_own_integer_buffers_and_a_floating_state_pass(tmp_path, tiny_task, intfed):
    final = engine.run_training(intfed_config(tiny_task, "nowhere"), tmp_path / "run", threads=1, progress=False)
    assert final["selection"]["rounds"] == 2
    model = build_model(RunConfig.from_dict(intfed_config(tiny_task, "nowhere")).model)
    assert any(
        v.dtype == torch.int64 for v in model.state_dict().values()
    )  # BN's num_batches_tracked: int64 in the model too
