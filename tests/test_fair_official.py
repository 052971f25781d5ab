"""The official-rule rows of the Fed-LWR tables' fairness baselines (``qfedavg-official``,
``cgsv-official``, ``cffl-official``, parameters read from config.yaml) against independent
transcriptions of the official codes, one real round of our engine each.

The transcriptions are written from the official codes' behaviour in plain torch and call none of
``methods.qfedavg / cgsv / cffl`` or ``ops.sparsify``:
- q-FedAvg: litian96/fair_flearn ``flearn/trainers/qffedavg.py`` + ``fedbase.aggregate2``
  (../shared/specs/methods.md §2.11): F_k on the whole training set at the received model,
  grads = (w^t - w̄_k)/lr, Δ_k = (F_k + 1e-10)^q grads, h_k = q (F_k + 1e-10)^(q-1) ||grads||² +
  (1/lr)(F_k + 1e-10)^q, w^{t+1} = w^t - ΣΔ_k / Σh_k;
- CGSV: XinyiYS/Gradient-Driven-Rewards... ``main.py`` L220-292 and ``utils/utils.py``
  (``mask_grad_update_by_order``, mode 'layer'; §2.13);
- CFFL: XinyiYS/CollaborativeFairFederatedLearning ``pytorch/utils/Federated_Learner.py``
  (``train_locally``, ``compute_reputations_sinh``, ``aggregate_gradients_and_update_federated_model``,
  ``assign_updates_with_filter``, 'all' criterion, 'mean' mode; §2.12).
Shared inputs only: the initial model, the engine's local training (each client's trained model), the
data, the loss and the evaluation metric. CFFL's server validation set is our documented adaptation
(every client scores each candidate on its own validation split with its own BN statistics; the mean
is acc_i), so the transcription scores candidates that way.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import yaml

from fedmedbench.fl.data import load_clients
from fedmedbench.fl.engine import run_training
from fedmedbench.fl.evaluation import evaluate
from fedmedbench.losses import build_loss
from fedmedbench.methods import cffl, cgsv, qfedavg
from fedmedbench.models import build_model
from fedmedbench.runconfig import RunConfig
from tests.conftest import tiny_run_config, write_tiny_task

CONFIG = Path(__file__).resolve().parents[1] / "config" / "config.yaml"


def official_params(method: str) -> dict:
    """The ``official`` variant's parameters as config.yaml declares them."""
    return yaml.safe_load(CONFIG.read_text())["methods"][method]["variants"]["official"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_task(tmp_path_factory.mktemp("tiny"))


def one_round_config(tiny, method, **params):
    store, split = tiny
    # Fed-LWR's loss (soft Dice), no augmentation; two local epochs (4, 4 and 2 Adam steps at lr 1e-2), so
    # every coordinate moves past CFFL's clip 1e-3 as it does at paper size (lr 1e-3, 10-40 steps).
    return tiny_run_config(
        store,
        split,
        method,
        rounds=1,
        local_epochs=2,
        loss="dice",
        augment="none",
        eval_batch_size=64,
        method_params=params,
    )


def record(monkeypatch, module, seen):
    """Record the server's state before aggregate, the replies, its state after, and each client's
    model after it receives the round's package."""
    aggregate, receive = module.Server.aggregate, module.Client.receive

    def recording_aggregate(self, round_index, replies):
        seen["before"] = {k: v.detach().clone() for k, v in self.global_state.items()}
        seen["replies"] = copy.deepcopy(replies)
        aggregate(self, round_index, replies)
        seen["after"] = {k: v.detach().clone() for k, v in self.global_state.items()}
        seen["server"] = self

    def recording_receive(self, package):
        receive(self, package)
        if package is not None and "state" not in package:
            seen.setdefault("received", {})[self.index] = {
                n: p.detach().clone() for n, p in self.model.named_parameters()
            }

    monkeypatch.setattr(module.Server, "aggregate", recording_aggregate)
    monkeypatch.setattr(module.Client, "receive", recording_receive)


def param_names(cfg):
    return [n for n, p in build_model(RunConfig.from_dict(cfg).model).named_parameters()]


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


# --- q-FedAvg: fair_flearn ---------------------------------------------------------------------------
@torch.no_grad()
def whole_train_loss(cfg, state, split):
    """fair_flearn's ``c.get_loss()``: the loss of the received model over the whole training set."""
    rc = RunConfig.from_dict(cfg)
    model = build_model(rc.model)
    model.load_state_dict(state)
    model.eval()
    images = torch.from_numpy(split.images[split.rows]).permute(0, 3, 1, 2).float() * rc.intensity_scale
    labels = torch.from_numpy(split.labels[split.rows].astype("int64"))
    return float(build_loss(rc.loss)(model(images), labels))


def fair_flearn_round(latest, local_params, losses, q, lr):
    """qffedavg.py's round and aggregate2 (float32 weights, as the TF arrays)."""
    deltas, hs = [], []
    for new, loss in zip(local_params, losses):
        grads = [(latest[n] - new[n]) * (1.0 / lr) for n in latest]
        deltas.append([math.pow(loss + 1e-10, q) * g.double() for g in grads])
        norm_grad = float(flat(grads).double().pow(2).sum())
        hs.append(q * math.pow(loss + 1e-10, q - 1) * norm_grad + (1.0 / lr) * math.pow(loss + 1e-10, q))
    denominator = sum(hs)
    return {n: latest[n].double() - sum(d[i] / denominator for d in deltas) for i, n in enumerate(latest)}, hs


def test_qfedavg_official_row_matches_fair_flearn(tiny, tmp_path, monkeypatch):
    params = official_params("qfedavg")
    assert params == {"lipschitz_rule": "inverse_lr"}  # fair_flearn's L = 1/lr; q stays the row's 0.5
    cfg = one_round_config(tiny, "qfedavg", **params)
    seen = {}
    record(monkeypatch, qfedavg, seen)
    run_training(cfg, tmp_path / "run", progress=False)

    names = param_names(cfg)
    data = load_clients(Path(cfg["data"]["store"]), Path(cfg["data"]["split"]), cfg["clients"], False)
    losses = [whole_train_loss(cfg, seen["before"], d.train) for d in data]
    assert [r["loss"] for r in seen["replies"]] == pytest.approx(losses, rel=1e-6)
    latest = {n: seen["before"][n] for n in names}
    local = [{n: r["state"][n] for n in names} for r in seen["replies"]]
    expected, hs = fair_flearn_round(latest, local, losses, q=qfedavg.DEFAULTS["q"], lr=cfg["optimizer"]["lr"])
    assert [seen["server"].last_log[i]["h"] for i in range(3)] == pytest.approx(hs, rel=1e-6)
    for n in names:
        assert torch.allclose(seen["after"][n].double(), expected[n], rtol=1e-6, atol=1e-9), n

    # The finding: with Adam, ||grads||² = ||w - w̄||²/lr² dominates h, and the model hardly moves.
    moved = float(flat([seen["after"][n] - latest[n] for n in names]).norm())
    mean_local = float(flat([sum(s[n] for s in local) / 3 - latest[n] for n in names]).norm())  # q = 0: FedAvg
    assert moved / mean_local < 0.01, moved / mean_local


# --- CGSV: main.py -----------------------------------------------------------------------------------
def cgsv_layer_mask(layer, percentile):
    """utils.mask_grad_update_by_order(mode='layer') for one tensor."""
    mod = layer.abs().reshape(-1)
    order = math.ceil(len(mod) * max(0.0, percentile))
    if order == 0:
        return torch.zeros_like(layer)
    top = torch.topk(mod, min(order, len(mod) - 1)).values
    out = layer.clone()
    out[layer.abs() < top[-1]] = 0
    return out


def cgsv_round(server_params, before, after, shard_sizes, gamma, alpha, beta):
    """main.py, iteration 0: normalised gradients, FedAvg weights, cosine reputations from 0, rewards."""
    names = list(server_params)
    gradients = []
    for b, a in zip(before, after):
        gradient = [a[n] - b[n] for n in names]
        flattened = flat(gradient)
        unit = torch.tensor(gamma) * (flattened / (flattened.norm() + 1e-7))
        gradients.append(list(torch.split(unit, [g.numel() for g in gradient])))
        gradients[-1] = [g.reshape(ref.shape) for g, ref in zip(gradients[-1], gradient)]
    weights = torch.tensor(shard_sizes, dtype=torch.float32) / sum(shard_sizes)
    aggregated = [torch.zeros_like(server_params[n]) for n in names]
    for gradient, weight in zip(gradients, weights):
        for agg, g in zip(aggregated, gradient):
            agg += g * weight
    new_server = {n: server_params[n] + agg for n, agg in zip(names, aggregated)}
    phis = torch.tensor(
        [float(torch.nn.functional.cosine_similarity(flat(g), flat(aggregated), 0, 1e-10)) for g in gradients]
    )
    rs = alpha * torch.zeros(len(before)) + (1 - alpha) * phis
    rs = torch.clamp(rs, min=1e-3)
    rs = rs / rs.sum()
    q = torch.tanh(beta * rs)
    q = q / q.max()
    agents = []
    for i, b in enumerate(before):
        reward = [cgsv_layer_mask(agg, float(q[i])) for agg in aggregated]
        agents.append({n: b[n] + r for n, r in zip(names, reward)})
    return new_server, rs.tolist(), agents


def test_cgsv_official_row_matches_the_official_main(tiny, tmp_path, monkeypatch):
    params = official_params("cgsv")
    assert params == {"gamma": 1.0, "official_code": True}
    cfg = one_round_config(tiny, "cgsv", **params)
    seen, trained = {}, {}
    record(monkeypatch, cgsv, seen)
    reply = cgsv.Client.reply

    def recording_reply(self):  # the agent's model before and after local training
        trained[self.index] = (
            {n: b.clone() for n, b in self.before.items()},
            {n: p.detach().clone() for n, p in self.model.named_parameters()},
        )
        return reply(self)

    monkeypatch.setattr(cgsv.Client, "reply", recording_reply)
    run_training(cfg, tmp_path / "run", progress=False)

    names = param_names(cfg)
    shard = [r["num_samples"] for r in seen["replies"]]
    assert shard == [8, 6, 4]
    expected_server, rs, agents = cgsv_round(
        {n: seen["before"][n] for n in names},
        [trained[i][0] for i in range(3)],
        [trained[i][1] for i in range(3)],
        shard,
        gamma=1.0,
        alpha=cgsv.DEFAULTS["alpha"],
        beta=cgsv.DEFAULTS["beta"],
    )
    for n in names:
        assert torch.allclose(seen["after"][n], expected_server[n], rtol=1e-5, atol=1e-7), n
    assert seen["server"].reputation == pytest.approx(rs, rel=1e-5)
    for i in range(3):
        for n in names:
            assert torch.allclose(seen["received"][i][n], agents[i][n], rtol=1e-5, atol=1e-7), (i, n)
    # ||u_N|| <= Γ = 1: the server moves by at most 1 whatever the updates' length.
    step = float(flat([seen["after"][n] - seen["before"][n] for n in names]).norm())
    assert 0.5 < step <= 1.0 + 1e-6
    # the reference's mask for the best agent (q = 1) drops each tensor's smallest entry, ours would not
    best = max(range(3), key=lambda i: rs[i])
    dropped = [
        n
        for n in names
        if seen["server"].rewards[best][n].numel() > 1 and int((seen["server"].rewards[best][n] == 0).sum()) >= 1
    ]
    assert len(dropped) == len([n for n in names if seen["server"].rewards[best][n].numel() > 1])


# --- CFFL: Federated_Learner.py ----------------------------------------------------------------------
def cffl_mask_by_order(update, mask_order):
    """utils' mask_grad_update_by_order(mode='all') / mask_grad_update_by_magnitude."""
    mods = flat([u.abs() for u in update])
    if mask_order == 0:
        threshold = float("inf")
    else:
        threshold = torch.topk(mods, mask_order).values[-1]
    return [torch.where(u.abs() < threshold, torch.zeros_like(u), u) for u in update]


def cffl_round(cfg, federated, trained, clip, theta, alpha, coef, data, names):
    """One CFFL epoch from reputations 0: clip, upload mask, one-on-one candidate scores, sinh
    reputations, 'mean' aggregation, 'all'-criterion downloads minus the own upload."""
    rc = RunConfig.from_dict(cfg)
    n_participants = len(trained)
    D = sum(federated[n].numel() for n in names)
    shard = torch.tensor([float(len(d.train)) for d in data])
    models, filtered = [], []
    for before, after, _ in trained:
        clipped = [torch.clamp(after[n] - before[n], min=-clip, max=clip) for n in names]
        models.append([before[n] + c for n, c in zip(names, clipped)])
        filtered.append(cffl_mask_by_order(clipped, int(D * theta)))
    # one_on_one_evaluate: federated model + upload_i, scored (our adaptation) on every client's
    # validation split with that client's BN statistics, then averaged over clients
    accs = []
    for i in range(n_participants):
        candidate = {n: federated[n] + u for n, u in zip(names, filtered[i])}
        scores = []
        for j, d in enumerate(data):
            model = build_model(rc.model)
            model.load_state_dict({**trained[j][2], **candidate})
            scores.append(evaluate(model, d.val, rc, torch.device("cpu"))[rc.selection_metric])
        accs.append(sum(scores) / len(scores))
    # compute_reputations_sinh from torch.zeros, reputation_fade = 1
    reputations = torch.zeros(n_participants, dtype=torch.float64)
    R = list(range(n_participants))
    threshold = coef / n_participants
    total = sum(accs[i] for i in R)
    for i in R:
        reputations[i] = reputations[i] * 0.8 + accs[i] / total * 0.2
    reputations = torch.sinh(alpha * reputations)
    reputations /= reputations.sum()
    size = len(R)
    R = [i for i in R if reputations[i] >= threshold]
    reputations[reputations < threshold] = 0
    if size != len(R):
        reputations /= reputations.sum()
    # aggregate 'mean': n_i / Σ n over every participant
    aggregated = [torch.zeros_like(federated[n]) for n in names]
    for i in R:
        for agg, u in zip(aggregated, filtered[i]):
            agg += u * (shard[i] / shard.sum())
    new_federated = {n: federated[n] + a for n, a in zip(names, aggregated)}
    # assign_updates_with_filter, 'all' criterion, 'topk' download
    weights = shard / shard.max()
    top = torch.topk(flat([a.abs() for a in aggregated]), D).values
    for i in R:
        num_downloads = int(float(reputations[i]) / float(reputations.max()) * float(shard[i]) / float(shard.max()) * D)
        allocated = [torch.where(a.abs() < top[num_downloads - 1], torch.zeros_like(a), a) for a in aggregated]
        models[i] = [m + a - u * weights[i] for m, a, u in zip(models[i], allocated, filtered[i])]
    return new_federated, reputations.tolist(), R, models, accs, filtered


def test_cffl_official_row_matches_the_official_federated_learner(tiny, tmp_path, monkeypatch):
    params = official_params("cffl")
    assert params == {"score": "metric", "clip": 0.001, "official_code": True}
    cfg = one_round_config(tiny, "cffl", **params)
    seen, trained = {}, {}
    record(monkeypatch, cffl, seen)
    reply = cffl.Client.reply

    def recording_reply(self):  # before, after local training, and the whole trained state (BN statistics)
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        trained[self.index] = (
            {n: b.clone() for n, b in self.before.items()},
            {n: p.detach().clone() for n, p in self.model.named_parameters()},
            state,
        )
        return reply(self)

    monkeypatch.setattr(cffl.Client, "reply", recording_reply)
    run_training(cfg, tmp_path / "run", progress=False)

    names = param_names(cfg)
    data = load_clients(Path(cfg["data"]["store"]), Path(cfg["data"]["split"]), cfg["clients"], False)
    d = cffl.DEFAULTS
    federated, reputations, R, models, accs, filtered = cffl_round(
        cfg,
        {n: seen["before"][n] for n in names},
        [trained[i] for i in range(3)],
        clip=0.001,
        theta=d["upload_fraction"],
        alpha=d["alpha"],
        coef=d["threshold_coef"],
        data=data,
        names=names,
    )
    server = seen["server"]
    assert [server.last_log[i]["validation"] for i in range(3)] == pytest.approx(accs, abs=1e-9)
    assert server.reputation == pytest.approx(reputations, rel=1e-6)
    assert [i for i in range(3) if server.reputable[i]] == R
    for n in names:
        assert torch.allclose(seen["after"][n], federated[n], rtol=1e-5, atol=1e-8), n
    for i in R:
        for n, expected in zip(names, models[i]):
            assert torch.allclose(seen["received"][i][n], expected, rtol=1e-5, atol=1e-8), (i, n)

    # The finding: nearly every coordinate reaches the clip, so the reference's threshold mask (ties at
    # |Δ| = clip kept) uploads far more than θ_u = 10 % of the model; our exact top-k would keep 10 %.
    D = sum(seen["before"][n].numel() for n in names)
    shares = [float(sum(int((u != 0).sum()) for u in f)) / D for f in filtered]
    assert min(shares) > 0.5, shares
    uploaded = [sum(int((r["upload"][n] != 0).sum()) for n in names) / D for r in seen["replies"]]
    assert uploaded == pytest.approx(shares)


# --- the reference masks by hand, and the switch's type ---------------------------------------------
def test_threshold_mask_keeps_ties_and_reference_reward_drops_the_smallest():
    from fedmedbench.ops.sparsify import threshold_mask

    update = {"a": torch.tensor([0.001, -0.001, 0.0005]), "b": torch.tensor([-0.001, 0.0002])}
    # k = int(0.2·5) = 1: the largest magnitude is 0.001, tied three times: all three kept (exact top-k: 1)
    kept = threshold_mask(update, 1)
    assert kept["a"].tolist() == pytest.approx([0.001, -0.001, 0.0]) and kept["b"].tolist() == pytest.approx(
        [-0.001, 0.0]
    )
    assert sum(int((v != 0).sum()) for v in cffl.top_fraction(update, 0.2).values()) == 1
    assert all(int((v != 0).sum()) == 0 for v in threshold_mask(update, 0).values())  # k = 0: nothing
    assert torch.equal(threshold_mask(update, 5)["b"], update["b"])  # k = D: everything
    assert cffl.share(update, 0.2, official_code=True)["a"].tolist() == pytest.approx([0.001, -0.001, 0.0])

    layer = torch.tensor([4.0, -1.0, 3.0, 2.0])
    # q = 1: the reference keeps min(⌈4⌉, 3) = 3 entries, dropping the smallest (ours keeps all 4)
    assert cgsv.reference_reward(layer, 1.0).tolist() == [4.0, 0.0, 3.0, 2.0]
    assert cgsv.top_magnitude(layer, 1.0).tolist() == [4.0, -1.0, 3.0, 2.0]
    assert cgsv.reference_reward(layer, 0.5).tolist() == [4.0, 0.0, 3.0, 0.0]  # ⌈2⌉ = 2 as ours
    assert cgsv.reference_reward(torch.tensor([0.7]), 1.0).tolist() == pytest.approx([0.7])  # one element: kept


@pytest.mark.parametrize("method", ["cffl", "cgsv"])
def test_official_code_must_be_a_boolean(method):
    from fedmedbench import registry
    from fedmedbench.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"methods\.{method}\.variants\.official\.official_code: expected boolean"):
        registry.merge_params(method, {"official_code": "yes"}, f"methods.{method}.variants.official")
