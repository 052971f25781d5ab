"""The engine's generic hooks, exercised by a throwaway method defined here."""

from __future__ import annotations

import types

import pandas as pd
import pytest

from fedmedbench.fl import client as base_client
from fedmedbench.fl import engine
from fedmedbench.fl import server as base_server
from tests.conftest import tiny_run_config


def probe_method():
    """Asks every client for its validation-set size after training, logs it, records learning rates."""
    seen = {"answers": [], "lrs": []}

    class Server(base_server.Server):
        def query(self, round_index, replies):
            return [{"round": round_index, "client": i} for i in range(len(replies))]

        def aggregate(self, round_index, replies):
            seen["answers"].append([r["answer"] for r in replies])
            super().aggregate(round_index, replies)

        def round_log(self, round_index):
            return {i: {"answer": a["val_size"]} for i, a in enumerate(seen["answers"][-1])}

    class Client(base_client.Client):
        def answer(self, query):
            assert query == {"round": self.round_index, "client": self.index}
            return {"val_size": len(self.data.val)}

        def before_epoch(self, epoch):
            seen["lrs"].append((self.round_index, epoch, self.optimizer.param_groups[0]["lr"]))

    module = types.SimpleNamespace(Server=Server, Client=Client, DEFAULTS={}, PERSONALIZED=False)
    return module, seen


def test_query_answer_round_log_epochs_and_lr_decay(tmp_path, tiny_task, monkeypatch):
    module, seen = probe_method()
    monkeypatch.setattr(engine, "load_method", lambda name, module_path=None: module)
    monkeypatch.setattr(engine, "merge_params", lambda name, given, where, module=None: given)
    store, split = tiny_task
    optimizer = {"name": "sgd", "lr": 0.1, "lr_decay_every_rounds": 2, "lr_decay_factor": 0.5}
    cfg = tiny_run_config(store, split, "fedavg", rounds=5, local_epochs=2, optimizer=optimizer, local_epoch_curve=True)
    engine.run_training(cfg, tmp_path / "run", progress=False)

    assert seen["answers"] == [[{"val_size": 2}] * 3] * 5
    # lr 0.1 in rounds 1-2, 0.05 in rounds 3-4, 0.025 in round 5; each round has epochs 0 and 1
    lrs = {(r, e): lr for r, e, lr in seen["lrs"]}
    assert [lrs[(r, 0)] for r in range(1, 6)] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025])
    assert all((r, 1) in lrs for r in range(1, 6))

    history = pd.read_csv(tmp_path / "run" / "history.csv")
    server_rows = history[history.split == "server"]
    assert len(server_rows) == 5 * 3 and set(server_rows.value) == {2.0}
    local = history[(history.split == "test_local") & (history.metric == "dice_paper")]
    # per round and client: as received (epoch 0) and after each of the 2 local epochs
    assert sorted(local.epoch.unique()) == [0, 1, 2]
    assert len(local) == 5 * 3 * 3
