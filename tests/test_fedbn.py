"""FedBN: BN tensors stay local (by module type), the rest is the weighted average; no BN = FedAvg."""

import torch
from torch import nn

from fedmedbench.fl import checkpoint, engine
from fedmedbench.fl.engine import run_training
from fedmedbench.methods import fedbn
from fedmedbench.models import build_model
from fedmedbench.ops.aggregate import aggregation_weights, batchnorm_keys
from tests.conftest import build_federation, interrupt_after_round, tiny_run_config


def federation(store, split, model, cfg):
    _, _, server, clients = build_federation(fedbn, cfg, model)
    return server, clients


def test_after_communication_bn_is_local_and_the_rest_is_the_average(tiny_task):
    store, split = tiny_task
    cfg = tiny_run_config(
        store, split, "fedbn", augment="none", aggregation={"weighting": "samples", "bn_buffers": "average"}
    )
    torch.manual_seed(0)
    model = build_model(cfg["model"])
    server, clients = federation(store, split, model, cfg)
    bn = batchnorm_keys(model)
    assert {
        "encoders.0.1.weight",
        "encoders.0.1.bias",
        "encoders.0.1.running_mean",
        "encoders.0.1.running_var",
        "encoders.0.1.num_batches_tracked",
    } <= bn
    for c in clients:
        c.train(1)
    before = [{k: v.clone() for k, v in c.model.state_dict().items()} for c in clients]
    replies = [c.reply() for c in clients]
    assert all(not (set(r["state"]) & bn) for r in replies)  # BN tensors never leave the client
    server.aggregate(1, replies)
    for c in clients:
        c.receive(server.package(c.index, 1))
    after = [c.model.state_dict() for c in clients]

    p = aggregation_weights([len(c.data.train) for c in clients], "samples")
    assert p == [8 / 18, 6 / 18, 4 / 18]
    for key in before[0]:
        if key in bn:
            for b, a in zip(before, after):
                assert torch.equal(a[key], b[key]), key  # unchanged by communication
        else:
            expected = sum(p_k * b[key].double() for p_k, b in zip(p, before))
            for a in after:
                assert torch.equal(a[key], after[0][key]), key  # one shared value
                assert torch.allclose(a[key].double(), expected, rtol=0, atol=1e-6), key
    # the test can fail: clients' BN differ, and the shared tensors moved
    assert not torch.equal(after[0]["encoders.0.1.weight"], after[1]["encoders.0.1.weight"])
    assert not torch.equal(after[0]["encoders.0.1.running_mean"], after[1]["encoders.0.1.running_mean"])
    assert not torch.equal(after[0]["head.weight"], before[0]["head.weight"])


class Oddly(nn.Module):
    """BN under names without 'bn', a GroupNorm, and a layer *named* bn that is no BN."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.downsample = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
        self.gn = nn.GroupNorm(2, 4)
        self.bn_like = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        return self.bn_like(self.gn(self.downsample(self.norm(self.conv(x)))))


def test_local_keys_by_module_type(tiny_task):
    store, split = tiny_task
    _, clients = federation(store, split, Oddly(), tiny_run_config(store, split, "fedbn"))
    stats = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    assert clients[0].local_keys == {f"{m}.{s}" for m in ("norm", "downsample.1") for s in stats}


def test_stateless_bn_has_no_local_keys():
    assert batchnorm_keys(build_model({"name": "unet", "init_features": 2, "bn": "stateless"})) == set()


def strip_bn(module):
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            setattr(module, name, nn.Identity())
        else:
            strip_bn(child)
    return module


def test_model_without_bn_is_fedavg_bitwise(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    monkeypatch.setattr(engine, "build_model", lambda model_cfg: strip_bn(build_model(model_cfg)))
    runs = {}
    for method in ("fedbn", "fedavg"):
        final = run_training(tiny_run_config(store, split, method, rounds=2), tmp_path / method, progress=False)
        runs[method] = (
            final,
            checkpoint.load_plain(tmp_path / method / "model_best.pt"),
            (tmp_path / method / "history.csv").read_text(),
        )
    (bn_final, bn_best, bn_hist), (avg_final, avg_best, avg_hist) = runs["fedbn"], runs["fedavg"]
    assert not any("running_mean" in k for k in avg_best["models"]["base"])  # really no BN
    assert bn_hist == avg_hist and bn_final["test"] == avg_final["test"]
    for key, value in avg_best["models"]["base"].items():
        assert torch.equal(bn_best["models"]["base"][key], value), key


def test_whole_run_keeps_bn_per_client_and_resumes(tmp_path, tiny_task, monkeypatch):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedbn", rounds=2)
    straight = run_training(cfg, tmp_path / "straight", progress=False)
    best = checkpoint.load_plain(tmp_path / "straight" / "model_best.pt")
    assert straight["selection"]["per_client"] is False and isinstance(straight["selection"]["best_round"], int)
    bn = {k for k in best["models"]["base"] if k.rsplit(".", 1)[0] + ".running_mean" in best["models"]["base"]}
    for diffs in best["models"]["diffs"].values():
        assert diffs and set(diffs) <= bn  # each client's model differs from client A's in BN tensors only
        assert any(k.endswith(".weight") for k in diffs) and any(k.endswith(".running_var") for k in diffs)

    interrupt_after_round(cfg, tmp_path / "resumed", monkeypatch)
    resumed = run_training(cfg, tmp_path / "resumed", progress=False)
    assert straight == resumed
    assert (tmp_path / "straight" / "history.csv").read_text() == (tmp_path / "resumed" / "history.csv").read_text()
