"""Fed-LWR's paper row (the default parameters): Eq. 2-4 as printed (biased HSIC of centred Grams over
the client's training data), the Fig. 1(b) quantity (CKA between pairs of local models) in the round
log, the parameters, and the figure that plots it."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from fedmedbench.errors import ConfigError
from fedmedbench.methods import fedlwr
from fedmedbench.registry import merge_params
from fedmedbench.report import fedlwr as fedlwr_report
from tests.conftest import build_federation, tiny_run_config
from tests.test_fedlwr_official import write_task

TRAIN = 8  # write_task: rows 0..7 of every client are its training split


def one_round(server, clients, round_index=1):
    replies = []
    for c in clients:
        c.round_index = round_index
        c.train(c.cfg.local_epochs)
        replies.append(c.reply())
    queries = server.query(round_index, replies)
    for c, q, r in zip(clients, queries, replies):
        r["answer"] = c.answer(q)
    server.aggregate(round_index, replies)
    return replies, queries


def outputs(model, state, x):
    """Every hooked layer's flattened outputs for all samples at once (float64 numpy)."""
    model.load_state_dict(state)
    model.eval()
    found, handles = {}, []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.ConvTranspose2d, torch.nn.BatchNorm2d)):
            handles.append(
                module.register_forward_hook(
                    lambda m, i, o, name=name: found.__setitem__(name, o.detach().flatten(1).double().numpy().copy())
                )
            )
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return found


def eq2(U, V):
    """Fed-LWR Eq. 2: HSIC(K, L) = vec(K')·vec(L') / (n-1)², K' = HKH, δ = HSIC(K,L) / sqrt(HSIC(K,K) HSIC(L,L))."""
    n = len(U)
    H = np.eye(n) - np.ones((n, n)) / n
    Kc, Lc = H @ U @ U.T @ H, H @ V @ V.T @ H
    hsic = lambda A, B: A.ravel() @ B.ravel() / (n - 1) ** 2  # noqa: E731
    return hsic(Kc, Lc) / np.sqrt(hsic(Kc, Kc) * hsic(Lc, Lc))


def test_paper_row_is_eq2_on_the_training_data_and_logs_pairs_of_local_models(tmp_path):
    store, split, _ = write_task(tmp_path / "data")
    cfg = tiny_run_config(store, split, "fedlwr", augment="none", intensity_scale=1.0)
    cfg, model, server, clients = build_federation(fedlwr, cfg)
    assert (
        cfg.method_params["hsic"] == "biased"
        and cfg.method_params["gram"] == "dataset"
        and cfg.method_params["similarity_data"] == "train"
    )
    replies, queries = one_round(server, clients)
    assert set(queries[0]["peers"]) == {"B", "C"}  # round 1 is a Fig. 1(b) round
    states = [r["state"] for r in replies]
    anchor = {k: sum(s[k] for s in states) / 3 if states[0][k].is_floating_point() else states[0][k] for k in states[0]}
    log = server.round_log(1)
    scratch = copy.deepcopy(model)
    checked = 0
    for k, c in enumerate(clients):
        images = np.asarray(c.data.train.images[c.data.train.rows])  # D_k: all n_k training samples
        assert len(images) == TRAIN
        x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
        own, anchor_out = outputs(scratch, states[k], x), outputs(scratch, anchor, x)
        peers = {name: outputs(scratch, states[j], x) for j, name in enumerate("ABC") if j != k}
        for layer in own:
            expected = eq2(own[layer], anchor_out[layer])
            if not np.isfinite(expected):
                continue
            assert log[k][f"cka:{layer}"] == pytest.approx(expected, rel=2e-4, abs=5e-5), (k, layer)
            for name, out in peers.items():
                assert log[k][f"pair_cka:{name}:{layer}"] == pytest.approx(
                    eq2(own[layer], out[layer]), rel=2e-4, abs=5e-5
                ), (k, name, layer)
            checked += 1
    assert checked > 3 * 30
    # the anchor similarities are not all clipped: ρ is not uniform
    rho = np.array([[log[k][key] for key in log[k] if key.startswith("rho:")] for k in range(3)])
    assert np.abs(rho - 1 / 3).max() > 1e-3


def test_pairs_are_logged_on_the_first_and_last_rounds_or_every_n():
    params = dict(fedlwr.DEFAULTS)
    assert [r for r in range(1, 11) if fedlwr.pairwise_round(params, r, 10)] == [1, 10]
    params["pairwise_every"] = 4
    assert [r for r in range(1, 11) if fedlwr.pairwise_round(params, r, 10)] == [1, 4, 8, 10]
    params["log_pairwise"] = False
    assert not any(fedlwr.pairwise_round(params, r, 10) for r in range(1, 11))


def test_parameters_and_the_legacy_unbiased_switch():
    params = merge_params("fedlwr", {}, "test")
    assert not fedlwr.unbiased_hsic(params)  # Eq. 2: the biased HSIC
    assert fedlwr.unbiased_hsic(merge_params("fedlwr", {"hsic": "unbiased"}, "test"))
    assert fedlwr.unbiased_hsic(merge_params("fedlwr", {"unbiased": True}, "test"))  # the old switch still works
    assert not fedlwr.unbiased_hsic(merge_params("fedlwr", {"hsic": "unbiased", "unbiased": False}, "test"))
    for bad in ({"hsic": "kernel"}, {"similarity_data": "test"}, {"gram": "full"}, {"passes": 0}, {"unbiased": "yes"}):
        with pytest.raises(ConfigError):
            merge_params("fedlwr", bad, "test")


def pair_history():
    layers = ("enc.0", "enc.1", "head")
    rows = []
    for rnd in (1, 2, 3):
        for k, client in enumerate("ABC"):
            for i, layer in enumerate(layers):
                rows.append(
                    {
                        "round": rnd,
                        "client": client,
                        "split": "server",
                        "metric": f"cka:{layer}",
                        "value": 0.9 - 0.1 * i,
                    }
                )
                if rnd in (1, 3):
                    for j, peer in enumerate("ABC"):
                        if j != k:  # the pair (A, B) measured 0.5 on A's data and 0.7 on B's: pair value 0.6
                            base = {frozenset("AB"): 0.6, frozenset("AC"): 0.4, frozenset("BC"): 0.8}[
                                frozenset((client, peer))
                            ]
                            rows.append(
                                {
                                    "round": rnd,
                                    "client": client,
                                    "split": "server",
                                    "metric": f"pair_cka:{peer}:{layer}",
                                    "value": base + (0.1 if k < j else -0.1) - 0.1 * i,
                                }
                            )
    return pd.DataFrame(rows)


def test_layer_cka_figure_plots_the_mean_and_range_over_pairs_of_local_models(tmp_path, monkeypatch):
    figures = []
    original = fedlwr_report.save_figure
    monkeypatch.setattr(fedlwr_report, "save_figure", lambda fig, prefix: figures.append(fig) or original(fig, prefix))
    paths = fedlwr_report.layer_cka_figure(pair_history(), tmp_path / "cka", "Fig. 1b")
    assert all(p.exists() for p in paths)
    axes = figures[0].axes
    assert [ax.get_title() for ax in axes] == ["round 1", "round 3"]  # the rounds that have pairs
    lines = {line.get_label(): line for line in axes[0].lines}
    mean = lines["mean over pairs of local models"]
    assert list(mean.get_xdata()) == [0, 1, 2]
    assert list(mean.get_ydata()) == pytest.approx(
        [0.6, 0.5, 0.4]
    )  # mean of the pairs 0.6, 0.4, 0.8 (per layer - 0.1 i)
    band = axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() == pytest.approx(0.2) and band.max() == pytest.approx(0.8)  # range over pairs
    assert list(lines["mean CKA(local, FedAvg anchor)"].get_ydata()) == pytest.approx([0.9, 0.8, 0.7])
    assert axes[0].get_ylabel() == "CKA between local models"
