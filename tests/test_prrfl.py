"""PRR-FL (DET stages, KL directions, PFA packages), its baselines SiloBN / IDA / FML, the VGGs,
classification metrics, OOD scoring, the selection window, and resume for every new method."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from fedmedbench.data.store import write_client, write_split_csv
from fedmedbench.fl.engine import run_training
from fedmedbench.methods import fedavg, fml, ida, prrfl, silobn, solo
from fedmedbench.metrics import ClassificationMeter, macro_auc_ovr, macro_f1
from fedmedbench.models import build_model
from fedmedbench.ops.aggregate import batchnorm_keys, buffer_keys, weighted_average
from fedmedbench.ops.distill import EXCHANGE, NO_STAGE, RECOVER, SUBLIMATE, det_stage, kl_to_teacher
from tests.conftest import build_federation, interrupt_after_round

SIZE = 32


def write_skin_task(root, clients=("A", "B", "C"), count=14, ood=6, seed=0):
    """3-class images whose class sets a colour patch, with a per-client brightness shift, plus a
    test-only client ``OOD``; 8 train / 3 val / 3 test per client."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, name in enumerate([*clients, "OOD"]):
        n = ood if name == "OOD" else count
        labels = np.arange(n) % 3
        images = rng.integers(0, 50, (n, SIZE, SIZE, 3), dtype=np.uint8) + np.uint8(20 * c)
        for i, label in enumerate(labels):
            images[i, 8:24, 8:24, label] += 150
        meta = pd.DataFrame(
            {"id": [f"{name}/{i}" for i in range(n)], "group": [f"{name}/{i}" for i in range(n)], "source": "synthetic"}
        )
        write_client(root / "store", name, images, labels.astype(np.int64), meta)
        parts = ["test"] * n if name == "OOD" else ["train"] * (n - 6) + ["val"] * 3 + ["test"] * 3
        rows += [
            {"client": name, "split": s, "row": i, "id": f"{name}/{i}", "group": f"{name}/{i}"}
            for i, s in enumerate(parts)
        ]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv"


def skin_config(store, split, method, clients=("A", "B", "C"), **overrides):
    cfg = {
        "task": "tiny_skin", "method": method, "variant": None, "run": method, "seed": 0, "kind": "classification",
        "clients": list(clients), "client_labels": list(clients),
        "data": {"store": str(store), "split": str(split), "synthetic": True},
        "model": {"name": "vgg_slim", "init_features": 2, "in_channels": 3, "num_classes": 3},
        "loss": "ce", "optimizer": {"name": "sgd", "lr": 0.05, "weight_decay": 1e-6, "lr_decay_every_rounds": 1},
        "reset_optimizer_each_round": True, "rounds": 2, "local_epochs": 2, "batch_size": 4, "augment": "flip_rotate",
        "intensity_scale": 1 / 255, "aggregation": {"weighting": "uniform", "bn_buffers": "average"},
        "selection_metric": "f1_macro", "method_params": {}, "qualitative_samples": 0,
    }  # fmt: skip
    cfg.update(overrides)
    return cfg


@pytest.fixture()
def skin_task(tmp_path):
    return write_skin_task(tmp_path / "skin")


def run_rounds(server, clients, rounds, first=1):
    for r in range(first, first + rounds):
        replies = []
        for c in clients:
            c.round_index = r
            c.train(c.cfg.local_epochs)
            replies.append(c.reply())
        server.aggregate(r, replies)
        for c in clients:
            c.receive(server.package(c.index, r))
    return replies


def state_of(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- DET stage machine and KL ---------------------------------------------------------------------
def test_det_stage_transitions_on_scripted_phi():
    # (previous, phi_d, phi_p) -> stage, lambda1 = 0.7, lambda2 = 0.9
    assert det_stage(NO_STAGE, 0.0, 1.0) == RECOVER  # no stage yet: Recover whatever phi says
    assert det_stage(NO_STAGE, 1.0, 0.5) == RECOVER
    assert det_stage(RECOVER, 0.6, 1.0) == RECOVER  # 0.6 < 0.7
    assert det_stage(RECOVER, 0.7, 1.0) == EXCHANGE  # >= lambda1
    assert det_stage(RECOVER, 0.99, 1.0) == EXCHANGE  # 1 -> 3 is not one step
    assert det_stage(EXCHANGE, 0.99, 1.0) == SUBLIMATE
    assert det_stage(EXCHANGE, 0.8, 1.0) == EXCHANGE
    assert det_stage(SUBLIMATE, 0.8, 1.0) == EXCHANGE  # fell below lambda2
    assert det_stage(SUBLIMATE, 0.5, 1.0) == RECOVER  # fell below lambda1
    assert det_stage(SUBLIMATE, 0.95, 1.0) == SUBLIMATE


def test_det_jump_from_recover_to_sublimate_needs_two_epochs():
    stage, visited = NO_STAGE, []
    for phi_d in (0.2, 0.95, 0.95, 0.95):  # the deputy is as good as p from the second epoch on
        stage = det_stage(stage, phi_d, 1.0)
        visited.append(stage)
    assert visited == [RECOVER, EXCHANGE, SUBLIMATE, SUBLIMATE]


def test_kl_to_teacher_direction_and_detached_teacher():
    g = torch.Generator().manual_seed(0)
    student = torch.randn(5, 3, generator=g, requires_grad=True)
    teacher = torch.randn(5, 3, generator=g, requires_grad=True)
    loss = kl_to_teacher(student, teacher)
    p_t, p_s = F.softmax(teacher, 1), F.softmax(student, 1)
    by_hand = (p_t * (p_t.log() - p_s.log())).sum(1).mean()  # KL(teacher || student), batchmean
    assert torch.allclose(loss, by_hand)
    loss.backward()
    assert teacher.grad is None and student.grad is not None and student.grad.abs().sum() > 0
    assert kl_to_teacher(teacher, teacher).abs() < 1e-7


def test_det_losses_reach_only_the_student(skin_task):
    """Recover: p's gradient is its CE gradient alone (no KL from d), d's includes KL(p || d);
    Sublimate: the other way round."""
    store, split = skin_task
    _, _, _, clients = build_federation(prrfl, skin_config(store, split, "prrfl"))
    client = clients[0]
    client.deputy.load_state_dict(
        {
            k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
            for k, v in client.deputy.state_dict().items()
        }
    )
    x = torch.rand(4, 3, SIZE, SIZE)
    y = torch.tensor([0, 1, 2, 0])

    def grads(model, loss_fn):
        model.zero_grad(set_to_none=True)
        loss_fn().backward()
        return [p.grad.clone() for p in model.parameters()]

    for stage, p_alone, d_alone in ((RECOVER, True, False), (SUBLIMATE, False, True), (EXCHANGE, False, False)):
        torch.manual_seed(1)
        ce_p = grads(client.model, lambda: F.cross_entropy(client.model(x), y))
        ce_d = grads(client.deputy, lambda: F.cross_entropy(client.deputy(x), y))
        before_p, before_d = state_of(client.model), state_of(client.deputy)
        client.stage = stage
        client.optimizer = torch.optim.SGD(client.model.parameters(), lr=1.0)
        client.deputy_optimizer = torch.optim.SGD(client.deputy.parameters(), lr=1.0)
        client.train_step(x, y)
        step_p = [before_p[n] - p.detach() for n, p in client.model.named_parameters()]
        step_d = [before_d[n] - p.detach() for n, p in client.deputy.named_parameters()]
        same_p = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(step_p, ce_p))
        same_d = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(step_d, ce_d))
        assert same_p == p_alone and same_d == d_alone, stage
        client.model.load_state_dict(before_p)
        client.deputy.load_state_dict(before_d)


def test_det_stage_follows_phi_and_resets_only_when_asked(skin_task, monkeypatch):
    store, split = skin_task
    for reset, expected in (
        (False, [[RECOVER, EXCHANGE, SUBLIMATE], [SUBLIMATE, SUBLIMATE, SUBLIMATE]]),
        (True, [[RECOVER, EXCHANGE, SUBLIMATE], [RECOVER, EXCHANGE, SUBLIMATE]]),
    ):
        cfg = skin_config(
            store,
            split,
            "prrfl",
            clients=("A", "B"),
            local_epochs=3,
            batch_size=8,
            method_params={"reset_stage_each_round": reset},
        )
        _, _, server, clients = build_federation(prrfl, cfg)
        monkeypatch.setattr(prrfl.Client, "phi", lambda self, model: 1.0)  # the deputy is as good as p
        seen = []
        for r in (1, 2):
            replies = run_rounds(server, clients, 1, first=r)
            seen.append(replies[0]["stages"])
        assert seen == expected, reset
        assert server.round_log(2)[0] == {
            "det_recover_epochs": expected[1].count(RECOVER),
            "det_exchange_epochs": expected[1].count(EXCHANGE),
            "det_sublimate_epochs": expected[1].count(SUBLIMATE),
        }


def test_det_stage_resets_to_recover_each_round_by_default(skin_task, monkeypatch):
    """The default (paper and official rows) starts every round in Recover, even when
    the deputy scores as well as p; carry-over is only the switch."""
    assert prrfl.DEFAULTS["reset_stage_each_round"] is True
    store, split = skin_task
    cfg = skin_config(store, split, "prrfl", clients=("A", "B"), local_epochs=3, batch_size=8)
    _, _, server, clients = build_federation(prrfl, cfg)
    monkeypatch.setattr(prrfl.Client, "phi", lambda self, model: 1.0)
    seen = [run_rounds(server, clients, 1, first=r)[0]["stages"] for r in (1, 2)]
    assert seen == [[RECOVER, EXCHANGE, SUBLIMATE], [RECOVER, EXCHANGE, SUBLIMATE]]


# --- PRR-FL server ----------------------------------------------------------------------------------
def test_prrfl_sends_each_client_its_own_pfa_result_keeps_bn_local_and_averages_biases(skin_task):
    store, split = skin_task
    cfg = skin_config(store, split, "prrfl", rounds=4, local_epochs=1)
    torch.manual_seed(0)  # a conv with a bias, BN, a linear layer (VGG-16-BN's kinds of layers, small)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 3),
    )
    _, _, server, clients = build_federation(prrfl, cfg, model=model)
    bn = batchnorm_keys(clients[0].model)
    g = torch.Generator().manual_seed(0)
    states = [
        {
            k: v + 0.01 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in model.state_dict().items()
        }
        for _ in clients
    ]
    replies = [{"state": {k: v for k, v in s.items() if k not in bn}, "num_samples": 8} for s in states]
    server.aggregate(1, replies)
    packages = [server.package(i, 1)["state"] for i in range(3)]
    assert not (set(packages[0]) & bn)
    conv, bias = "0.weight", "0.bias"
    assert not torch.allclose(packages[0][conv], packages[1][conv])  # per-client results
    assert torch.equal(packages[0][bias], packages[1][bias])
    assert torch.allclose(packages[0][bias], sum(s[bias] for s in states) / 3)
    before = {k: v.clone() for k, v in clients[0].model.state_dict().items()}
    clients[0].round_index = 1
    clients[0].receive(server.package(0, 1))
    assert all(torch.equal(before[k], v) for k, v in clients[0].model.state_dict().items())  # p untouched
    assert torch.equal(clients[0].deputy.state_dict()[conv], packages[0][conv])
    assert torch.equal(clients[0].deputy.state_dict()["1.running_mean"], before["1.running_mean"])
    assert torch.equal(clients[0].deputy.state_dict()["1.weight"], before["1.weight"])


@pytest.mark.parametrize("upload", ["personalized", "deputy"])
def test_prrfl_uploads_p_by_default_and_the_deputy_when_asked(skin_task, upload):
    """``upload: deputy`` (official) sends d, and every deputy then receives PFA of the
    deputies; ``personalized`` (paper) sends p. p is never overwritten after round 0 either way."""
    from fedmedbench.ops.fourier import fourier_aggregate

    store, split = skin_task
    cfg = skin_config(
        store,
        split,
        "prrfl",
        clients=("A", "B"),
        local_epochs=2,
        batch_size=8,
        method_params={"upload": upload, "fourier_mode": "official"},
    )
    _, _, server, clients = build_federation(prrfl, cfg)
    assert prrfl.DEFAULTS["upload"] == "personalized"
    # Round 1 starts from p = d and keeps them equal up to rounding (the KL gradient vanishes between
    # equal models); they part when the deputy receives its PFA result, so compare round 2's upload.
    run_rounds(server, clients, 1)
    replies = []
    for c in clients:
        c.round_index = 2
        c.train(2)
        replies.append(c.reply())
    sent = [c.deputy if upload == "deputy" else c.model for c in clients]
    other = [c.model if upload == "deputy" else c.deputy for c in clients]
    bn = batchnorm_keys(clients[0].model)
    key = "fc2.weight"
    for reply, model, not_sent in zip(replies, sent, other):
        assert set(reply["state"]) == set(model.state_dict()) - bn
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in reply["state"].items())
        assert not torch.allclose(reply["state"][key], not_sent.state_dict()[key])
    personal, uploaded = [state_of(c.model) for c in clients], [m.state_dict()[key].clone() for m in sent]
    server.aggregate(2, replies)
    for c in clients:
        c.receive(server.package(c.index, 2))
    expected = fourier_aggregate(uploaded, 0.7 + 0.25 / 2, mode="official")  # round 2 of 2
    for c, want, before in zip(clients, expected, personal):
        assert torch.allclose(c.deputy.state_dict()[key], want, atol=1e-6)
        assert all(torch.equal(v, before[k]) for k, v in c.model.state_dict().items())


def test_prrfl_without_pfa_is_the_elementwise_average_and_without_det_loads_p(skin_task):
    store, split = skin_task
    cfg = skin_config(store, split, "prrfl", local_epochs=1, batch_size=8, method_params={"pfa": False, "det": False})
    _, _, server, clients = build_federation(prrfl, cfg)
    replies = run_rounds(server, clients, 1)
    keys = sorted(replies[0]["state"])
    average = weighted_average([r["state"] for r in replies], [1 / 3] * 3, keys)
    for c in clients:
        state = c.model.state_dict()
        assert all(torch.allclose(state[k], average[k]) for k in keys if k not in batchnorm_keys(c.model))
    assert clients[0].stages == [] and server.round_log(1) == {}


# --- SiloBN, IDA, FML ---------------------------------------------------------------------------------
def test_silobn_keeps_running_statistics_local_and_averages_the_affine_parameters(skin_task):
    store, split = skin_task
    _, _, server, clients = build_federation(silobn, skin_config(store, split, "silobn", batch_size=8))
    for c in clients:  # diverge gamma as well as the statistics
        c.round_index = 1
        c.train(1)
        with torch.no_grad():
            c.model.features[0][0].bn.weight.add_(c.index)
    stats = buffer_keys(clients[0].model) & batchnorm_keys(clients[0].model)
    before = [state_of(c.model) for c in clients]
    replies = [c.reply() for c in clients]
    assert not (set(replies[0]["state"]) & stats)
    server.aggregate(1, replies)
    for c in clients:
        c.receive(server.package(c.index, 1))
    gamma = "features.0.0.bn.weight"
    expected = sum(b[gamma] for b in before) / 3
    for c, b in zip(clients, before):
        state = c.model.state_dict()
        assert torch.allclose(state[gamma], expected)
        assert all(torch.equal(state[k], b[k]) for k in stats)
    assert not torch.equal(
        clients[0].model.state_dict()["features.0.0.bn.running_mean"],
        clients[1].model.state_dict()["features.0.0.bn.running_mean"],
    )


def test_ida_with_two_clients_is_the_uniform_average(skin_task):
    store, split = skin_task
    cfg = skin_config(store, split, "ida", clients=("A", "B"), local_epochs=1, batch_size=8)
    _, _, server, clients = build_federation(ida, cfg)
    replies = run_rounds(server, clients, 1)
    keys = sorted(replies[0]["state"])
    uniform = weighted_average([r["state"] for r in replies], [0.5, 0.5], keys)
    assert server.alphas == pytest.approx([0.5, 0.5])
    assert all(torch.allclose(server.global_state[k].float(), uniform[k].float()) for k in keys)


def test_ida_weights_by_hand():
    states = [{"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([5.0, 0.0])}]
    alphas = ida.inverse_distance_weights(states, ["w"])
    inverse = 1 / np.array([2.0, 1.0, 3.0])  # distances to the mean (2, 0)
    assert alphas == pytest.approx(list(inverse / inverse.sum()))
    assert ida.inverse_distance_weights([states[0], states[0]], ["w"]) == [0.5, 0.5]


def test_fml_alpha_beta_one_private_follows_solo_and_meme_follows_fedavg(skin_task):
    store, split = skin_task
    cfg = skin_config(
        store,
        split,
        "fml",
        clients=("A", "B"),
        local_epochs=1,
        augment="none",
        method_params={"alpha": 1.0, "beta": 1.0},
    )
    runs = {}
    for name, method in (("fml", fml), ("fedavg", fedavg), ("solo", solo)):
        _, _, server, clients = build_federation(
            method, {**cfg, "method": name, "method_params": cfg["method_params"] if name == "fml" else {}}
        )
        run_rounds(server, clients, 2)
        runs[name] = clients
    for f, a, s in zip(runs["fml"], runs["fedavg"], runs["solo"]):
        meme, avg = f.model.state_dict(), a.model.state_dict()
        private, alone = f.private.state_dict(), s.model.state_dict()
        assert all(torch.equal(meme[k], avg[k]) for k in meme)
        assert all(torch.equal(private[k], alone[k]) for k in private)
    assert not torch.equal(
        runs["fml"][0].private.state_dict()["fc2.weight"], runs["fml"][0].model.state_dict()["fc2.weight"]
    )


# --- models, metrics, augmentation ------------------------------------------------------------------------
def test_vggs_give_three_logits_at_128_and_32_px():
    torch.manual_seed(0)
    big = build_model({"name": "vgg16_bn", "num_classes": 3}).eval()
    assert big(torch.rand(2, 3, 128, 128)).shape == (2, 3)
    assert big.classifier[0].in_features == 512 * 16
    slim = build_model({"name": "vgg_slim", "num_classes": 3}).eval()
    assert slim(torch.rand(2, 3, 32, 32)).shape == (2, 3)
    convs = [m for m in slim.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 32, 64, 64, 128, 128, 128, 128, 128, 128, 256, 256, 256]
    assert all(c.bias is None for c in convs) and slim.fc2.bias is None and slim.fc1[0].out_features == 64
    assert set(prrfl.fourier_keys(slim)) == {
        f"{n}.weight" for n, m in slim.named_modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
    }


def test_classification_meter_matches_scikit_learn():
    from sklearn.metrics import f1_score, roc_auc_score

    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(40, 3, generator=g), torch.arange(40) % 3
    meter = ClassificationMeter(3)
    meter.update(logits[:25], target[:25], None, 1.0)
    meter.update(logits[25:], target[25:], None, 2.0)
    scores = meter.compute()
    probs = torch.softmax(logits, 1).numpy()
    assert scores["accuracy"] == pytest.approx(float((logits.argmax(1) == target).float().mean()))
    assert scores["loss"] == pytest.approx((25 * 1.0 + 15 * 2.0) / 40)
    assert scores["f1_macro"] == pytest.approx(f1_score(target.numpy(), probs.argmax(1), average="macro"))
    assert scores["auc_macro"] == pytest.approx(roc_auc_score(target.numpy(), probs, multi_class="ovr"))
    for seed in range(5):  # ties, missing predicted classes, a binary task
        rng = np.random.default_rng(seed)
        t, scores_ = rng.integers(0, 3, 30), np.round(rng.random((30, 3)), 1)
        scores_ /= scores_.sum(1, keepdims=True) + 1e-9
        pred = np.minimum(scores_.argmax(1), 1)
        assert macro_f1(t, pred) == pytest.approx(f1_score(t, pred, average="macro", zero_division=0))
        if len(np.unique(t)) == 3:
            assert macro_auc_ovr(t, scores_) == pytest.approx(roc_auc_score(t, scores_, multi_class="ovr"))
        assert macro_auc_ovr(t % 2, scores_[:, :2]) == pytest.approx(roc_auc_score(t % 2, scores_[:, 1]))
    # a class missing from the truth is left out instead of raising
    assert macro_auc_ovr(
        np.array([0, 0, 1, 1]), np.array([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.4, 0.5, 0.1]])
    ) == pytest.approx(1.0)


def test_flip_rotate_keeps_shape_and_labels_and_is_seeded():
    from fedmedbench.fl.data import augment_flip_rotate

    x = torch.randint(0, 255, (6, 3, 16, 16), dtype=torch.uint8)
    y = torch.arange(6)
    a, ya = augment_flip_rotate(x, y, torch.Generator().manual_seed(3))
    b, _ = augment_flip_rotate(x, y, torch.Generator().manual_seed(3))
    assert a.shape == x.shape and a.dtype == torch.float32 and torch.equal(ya, y) and torch.equal(a, b)
    assert a.min() >= 0 and a.max() <= 255


# --- engine: OOD cohort, selection window, end to end + resume --------------------------------------------
def test_ood_cohort_is_scored_per_model_as_their_mean_and_as_an_ensemble(tmp_path, skin_task):
    store, split = skin_task
    cfg = skin_config(
        store,
        split,
        "fedbn",
        rounds=2,
        local_epochs=1,
        batch_size=8,
        ood_clients=["OOD"],
        selection_window=0.5,
        selection_scope="pooled",
    )
    final = run_training(cfg, tmp_path / "run", progress=False)
    ood = final["ood"]["OOD"]
    assert set(ood) - {"flags"} == {"mean", "ensemble", "per_model"} and set(ood["per_model"]) == {"A", "B", "C"}
    # a collapsed score of the cohort is flagged there and in final.json's flags (tests/test_flags_everywhere.py)
    assert ("OOD" in final["flags"]) == ("flags" in ood)
    for metric in ("accuracy", "f1_macro", "auc_macro"):
        assert ood["mean"][metric] == pytest.approx(np.mean([s[metric] for s in ood["per_model"].values()]))
        assert 0.0 <= ood["ensemble"][metric] <= 1.0
    assert final["selection"]["best_round"] == 2  # window 0.5 of 2 rounds: only round 2 is eligible
    assert set(final["test"]["A"]) >= {"accuracy", "f1_macro", "auc_macro", "loss"}


def test_prrfl_runs_end_to_end_with_the_local_epoch_curve(tmp_path, skin_task):
    store, split = skin_task
    cfg = skin_config(store, split, "prrfl", batch_size=8, local_epoch_curve=True, ood_clients=["OOD"])
    final = run_training(cfg, tmp_path / "run", progress=False)
    history = pd.read_csv(tmp_path / "run" / "history.csv")
    local = history[(history["split"] == "test_local") & (history["metric"] == "accuracy")]
    assert sorted(local["epoch"].unique()) == [0, 1, 2] and len(local) == 2 * 3 * 3
    assert set(history[history["split"] == "server"]["metric"]) == {
        "det_recover_epochs",
        "det_exchange_epochs",
        "det_sublimate_epochs",
    }
    assert final["selection"]["per_client"] is True and "OOD" in final["ood"]


@pytest.mark.parametrize(
    "run, params",
    [
        ("prrfl", {"fourier_mode": "official", "phi_split": "train", "upload": "deputy"}),
        ("prrfl", {"reset_stage_each_round": False}),
        ("prrfl", {"det": False}),
        ("silobn", {}),
        ("ida", {}),
        ("fml", {}),
    ],
)
def test_resume_gives_the_same_run(tmp_path, skin_task, monkeypatch, run, params):
    store, split = skin_task
    cfg = skin_config(
        store,
        split,
        run,
        clients=("A", "B"),
        local_epochs=2 if params.get("det", run == "prrfl") else 1,
        batch_size=8,
        method_params=params,
        ood_clients=["OOD"],
    )
    straight = run_training(cfg, tmp_path / "straight", progress=False)
    interrupt_after_round(cfg, tmp_path / "resumed", monkeypatch)
    resumed = run_training(cfg, tmp_path / "resumed", progress=False)
    assert straight == resumed
    assert (tmp_path / "straight" / "history.csv").read_text() == (tmp_path / "resumed" / "history.csv").read_text()


# --- report: Table 3 summary and the retrogress curve -------------------------------------------------------
def test_ood_summary_and_retrogress_curve():
    from fedmedbench.report.prrfl import local_epoch_curve, ood_columns, ood_comparison_summary, ood_summary

    def final(run, seed, f1, auc):
        scores = {"f1_macro": f1, "auc_macro": auc}
        return {
            "run": run,
            "method": run,
            "seed": seed,
            "ood": {"OOD": {"mean": scores, "ensemble": {"f1_macro": 0.5, "auc_macro": 0.6}}},
        }

    summary = ood_summary([final("fedavg", 0, 0.3, 0.6), final("fedavg", 1, 0.5, 0.8)], "OOD")
    cells = summary.set_index("client_label")
    assert list(cells.index) == ood_columns() == ["F1", "AUC", "F1 (ensemble)", "AUC (ensemble)"]
    assert cells.loc["F1", "mean"] == pytest.approx(40.0) and cells.loc["F1", "std"] == pytest.approx(
        np.std([30, 50], ddof=1)
    )
    assert list(ood_comparison_summary(summary, "AUC")["client_label"]) == ["OOD"]
    history = pd.DataFrame(
        [
            {"round": r, "client": "C", "split": "test_local", "metric": "accuracy", "value": v, "epoch": e}
            for r, e, v in [(1, 0, 0.3), (1, 1, 0.5), (1, 2, 0.7), (2, 0, 0.4), (2, 1, 0.8), (2, 2, 0.9)]
        ]
    )
    curve = local_epoch_curve(history, "C", "accuracy")
    assert list(curve.index) == [0, 1, 2, 2, 3, 4] and list(curve) == [
        0.3,
        0.5,
        0.7,
        0.4,
        0.8,
        0.9,
    ]  # the drop at x = 2
