"""Every site works on its own copy of what it is sent, in the engine as over Flower's wire: a method
that edits its received package in place, or a server that sums the replies into the first one,
changes nothing but its own copy. So the engine's numbers are the Flower runtime's, whatever a
method does with its tensors.

The method here is a user's plug-in (a module on PYTHONPATH named by ``method_module``). Its
``copy_first`` twin copies everything before editing it: what each site with its own copy computes.
"""

from __future__ import annotations

import filecmp
import json
import os
import sys

import pytest
import torch

from fedmedbench.fl import engine
from fedmedbench.registry import forget
from tests.conftest import strip, tiny_run_config

EDITING = '''
"""Edits what it is given in place: a client blends the received package into its own weights in
the package's own tensors; the server sums the replies into the first reply's tensors."""
from fedmedbench.fl.client import Client as BaseClient
from fedmedbench.fl.server import Server as BaseServer

DEFAULTS = {"copy_first": False}
PERSONALIZED = False


def copied(state):
    return {key: value.clone() for key, value in state.items()}


class Client(BaseClient):
    def receive(self, package):
        if package is not None:
            if self.params["copy_first"]:
                package = {**package, "state": copied(package["state"])}
            own = self.model.state_dict()
            for key, value in package["state"].items():
                if value.is_floating_point():
                    value.mul_(0.5).add_(own[key], alpha=0.5)
        super().receive(package)


class Server(BaseServer):
    def aggregate(self, round_index, replies):
        if self.params["copy_first"]:
            replies = [{**reply, "state": copied(reply["state"])} for reply in replies]
        total, weight = replies[0]["state"], 1.0 / len(replies)
        for key, value in total.items():
            if value.is_floating_point():
                value.mul_(weight)
                for reply in replies[1:]:
                    value.add_(reply["state"][key], alpha=weight)
        self.global_state.update(total)
'''


@pytest.fixture()
def editing_plugin(tmp_path, monkeypatch):
    """The package ``my_lab`` with ``my_lab.editfed`` on sys.path and on PYTHONPATH (Flower's
    simulated sites run in Ray's worker processes, which import it by name)."""
    root = tmp_path / "plugins"
    (root / "my_lab").mkdir(parents=True)
    (root / "my_lab" / "__init__.py").write_text("")
    (root / "my_lab" / "editfed.py").write_text(EDITING)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    for name in [m for m in sys.modules if m == "my_lab" or m.startswith("my_lab.")]:
        monkeypatch.delitem(sys.modules, name)  # another test's my_lab, in another folder
    forget()
    yield root
    forget()


def editing_config(store, split, copy_first=False, **overrides):
    return tiny_run_config(
        store, split, "editfed", method_module="my_lab.editfed", method_params={"copy_first": copy_first}, **overrides
    )


def test_in_place_edits_reach_no_other_site_in_the_engine(tmp_path, tiny_task, editing_plugin):
    """The engine's run of the editing method equals its copy-first twin: a client's edit of its
    package reached neither the server nor the next client, and the server's sum into the first
    reply did not reach that client's model. (Before: the clients received the server's own
    tensors and the server the clients' model tensors; round 1's mean val Dice differed.)"""
    store, split = tiny_task
    edits = engine.run_training(editing_config(store, split), tmp_path / "edits", threads=1, progress=False)
    copies = engine.run_training(
        editing_config(store, split, copy_first=True), tmp_path / "copies", threads=1, progress=False
    )
    assert strip(edits) == strip(copies)
    assert (tmp_path / "edits" / "history.csv").read_bytes() == (tmp_path / "copies" / "history.csv").read_bytes()


def test_the_server_state_is_not_the_clients_and_a_package_is_not_the_servers(tmp_path, tiny_task, editing_plugin):
    """Direct look at the tensors: after a round of the engine's transport, no client's model
    shares memory with the server's global state, and a package a site received is its own."""
    from fedmedbench.fl.rounds import InProcessTransport
    from fedmedbench.registry import load_method, merge_params
    from fedmedbench.runconfig import RunConfig
    from tests.in_process import in_process_sites

    store, split = tiny_task
    cfg = RunConfig.from_dict(editing_config(store, split))
    cfg = cfg.replace(method_params=merge_params(cfg.method, cfg.method_params, "test", cfg.method_module))
    sites = in_process_sites(cfg)
    server = load_method(cfg.method, cfg.method_module).Server(cfg, sites[0].client.model, len(sites))
    transport = InProcessTransport(sites)
    transport.start([server.package(i, 0) for i in range(len(sites))])
    server.aggregate(1, [reply for reply, _, _ in transport.train(1)])
    # The server summed into the first reply: that is no client's model.
    storages = {value.untyped_storage().data_ptr() for value in server.global_state.values()}
    for site in sites:
        assert not storages & {p.untyped_storage().data_ptr() for p in site.client.model.state_dict().values()}, (
            site.name
        )
    # Each client blends its package into its trained weights in place, in its own copy: the
    # server's state is as it was.
    before = {key: value.clone() for key, value in server.global_state.items()}
    transport.evaluate(1, [server.package(i, 1) for i in range(len(sites))], with_test=False)
    assert [k for k in before if not torch.equal(server.global_state[k], before[k])] == []


@pytest.mark.slow
def test_the_editing_method_gives_the_flower_runtimes_numbers(tmp_path, tiny_task, editing_plugin):
    """The same plug-in through ``runtime: flower-simulation`` (each site its own copy, by the wire)
    and the engine: the same files, byte for byte (one process, the same code and inputs)."""
    from fedmedbench.federation.simulation import run_simulated

    store, split = tiny_task
    cfg = editing_config(store, split, rounds=2)
    engine.run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    final = run_simulated(cfg, tmp_path / "flower", threads=1, progress=False)
    assert final == json.loads((tmp_path / "engine" / "final.json").read_text())
    for name in ("final.json", "history.csv", "model_best.pt"):
        assert filecmp.cmp(tmp_path / "engine" / name, tmp_path / "flower" / name, shallow=False), name


def test_a_copy_has_the_same_numbers_layout_and_containers_and_shares_nothing():
    from collections import OrderedDict

    from fedmedbench.fl.rounds import own_copy

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).to(memory_format=torch.channels_last)
    state = model.state_dict()  # an OrderedDict with the modules' versions in _metadata
    package = {"state": state, "extras": [torch.arange(3.0), (1, "a")], "weight": 0.5, "none": None}
    copied = own_copy(package)
    assert type(copied["state"]) is OrderedDict and copied["state"]._metadata == state._metadata
    for key, value in state.items():
        mine = copied["state"][key]
        assert (
            torch.equal(mine, value)
            and mine.dtype == value.dtype
            and mine.stride() == value.stride()
            and mine.device == value.device
        )
        assert mine.untyped_storage().data_ptr() != value.untyped_storage().data_ptr() and not mine.requires_grad
    assert copied["extras"][1] == (1, "a") and copied["weight"] == 0.5 and copied["none"] is None
    copied["extras"][0].add_(1.0)
    copied["state"]["0.weight"].zero_()
    assert torch.equal(package["extras"][0], torch.arange(3.0)) and bool(state["0.weight"].abs().sum() > 0)
