"""The ``prrfl-official`` row against an independent transcription of the official code.

The transcription below is written from the official repository's behaviour as
``shared/specs/official_code.md`` §2.3-2.5 describes it (CityU-AIM-Group/PRR-FL @ 0a215247:
``main.py``, ``local_train.py: DET``, ``server.py: communication / avg_freq``), with torch, numpy and
scikit-learn only; it calls none of our method, ops or engine code. Only the inputs are shared: the
initial model (``build_model`` after ``torch.manual_seed(seed)``, as the engine builds it), the data
and the training batches (``train_batches`` with each client's seeded generator, the stream the
engine's clients draw).

The official flow, per round ``a_iter`` (0-based) of ``iters``:
- each client: both optimizers re-created (SGD, no momentum, wd), lr ``lr * 0.5^(a_iter // 5)``;
  ``DET_stage`` reset to 0; per local epoch, macro F1 (%) of p and d in eval mode on the client's
  training data picks the stage (0 or f_d < λ1 f_p: Recover; else after Recover: Exchange; else
  f_d < λ2 f_p: Exchange; else Sublimate); per batch both models see the batch, p: CE
  (+ KL(d‖p) in Exchange/Sublimate), d: CE (+ KL(p‖d) in Recover/Exchange), KL = kl_div(
  log_softmax(student), softmax(teacher.detach()), batchmean), both step;
- server: ``communication(server_model, models_deputy, ...)``: PFA (``avg_freq``) reads the **deputies**
  and writes each deputy its own result: conv weight -> (C_in*k, k*N_out), fft2, fftshifted amplitude,
  the half-open box [c-b, c+b) with c = floor(dim/2), b = floor(dim*L/2) takes the amplitude mean
  (hard-coded /4), own phase, real part of ifft2; L = 0.7 + a_iter/iters * (0.95 - 0.7); BN skipped;
  the personalized models are never read or written.

One documented difference is kept on both sides: phi is scored on the training split without
augmentation (the official scores its augmented training loader).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import f1_score
from torch import nn

from fedmedbench.fl import checkpoint
from fedmedbench.fl.data import load_clients, train_batches
from fedmedbench.fl.history_log import HistoryLog
from fedmedbench.fl.seeding import client_generator
from fedmedbench.methods import prrfl
from fedmedbench.models import build_model
from tests.conftest import interrupt_after_round
from tests.test_prrfl import skin_config, write_skin_task

CLIENTS = ("A", "B", "C", "D")  # 4: the official avg_freq divides by a hard-coded 4
OFFICIAL = {"fourier_mode": "official", "phi_split": "train", "reset_stage_each_round": True, "upload": "deputy"}
LR, WD, LR_STEP, L_RATE, LAMBDA1, LAMBDA2 = 0.05, 1e-6, 5, 0.7, 0.7, 0.9


# --- the transcription -------------------------------------------------------------------------------
def macro_f1_percent(model, x, y):
    model.eval()
    with torch.no_grad():
        pred = model(x).argmax(1)
    return 100 * f1_score(y.numpy(), pred.numpy(), average="macro", zero_division=0)


def kl(teacher_logits, student_logits):
    return F.kl_div(
        F.log_softmax(student_logits, dim=1), F.softmax(teacher_logits.detach(), dim=1), reduction="batchmean"
    )


def official_det_round(p, d, epochs, x_train, y_train, a_iter):
    lr = LR * 0.5 ** (a_iter // LR_STEP)
    opt_p = torch.optim.SGD(p.parameters(), lr=lr, weight_decay=WD)  # re-created every round
    opt_d = torch.optim.SGD(d.parameters(), lr=lr, weight_decay=WD)
    stage, stages = 0, []  # main.py resets DET_stages every round
    for batches in epochs:
        f_p, f_d = macro_f1_percent(p, x_train, y_train), macro_f1_percent(d, x_train, y_train)
        if stage == 0 or f_d < LAMBDA1 * f_p:
            stage = 1
        elif stage == 1:
            stage = 2
        elif f_d < LAMBDA2 * f_p:
            stage = 2
        else:
            stage = 3
        stages.append(stage)
        p.train()
        d.train()
        for x, y in batches:
            out_p, out_d = p(x), d(x)
            loss_p, loss_d = F.cross_entropy(out_p, y), F.cross_entropy(out_d, y)
            if stage in (2, 3):
                loss_p = loss_p + kl(out_d, out_p)
            if stage in (1, 2):
                loss_d = loss_d + kl(out_p, out_d)
            opt_p.zero_grad()
            loss_p.backward()
            opt_p.step()
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
    return stages


def avg_freq(weights, L, is_conv):
    mats = []
    for w in weights:
        w = w.detach().numpy().astype(np.float64)
        if is_conv:
            n, c, k1, k2 = w.shape
            w = np.transpose(w, (1, 2, 3, 0)).reshape(c * k1, k2 * n)
        mats.append(w)
    ffts = [np.fft.fft2(m) for m in mats]
    amps = [np.fft.fftshift(np.abs(f)) for f in ffts]
    mean = sum(amps) / 4
    h, w = mats[0].shape
    ch, cw, bh, bw = h // 2, w // 2, int(np.floor(h * L / 2)), int(np.floor(w * L / 2))
    outs = []
    for a, f, orig in zip(amps, ffts, weights):
        a = a.copy()
        a[ch - bh : ch + bh, cw - bw : cw + bw] = mean[ch - bh : ch + bh, cw - bw : cw + bw]
        rec = np.real(np.fft.ifft2(np.fft.ifftshift(a) * np.exp(1j * np.angle(f))))
        if is_conv:
            n, c, k1, k2 = orig.shape
            rec = np.transpose(rec.reshape(c, k1, k2, n), (3, 0, 1, 2))
        outs.append(torch.from_numpy(np.ascontiguousarray(rec)).to(orig.dtype))
    return outs


@torch.no_grad()
def official_communication(deputies, a_iter, iters):
    L = L_RATE + a_iter / iters * (0.95 - L_RATE)
    for name, module in deputies[0].named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):  # vgg_nb: no biases; BN (incl. fc1's BN1d) skipped
            assert module.bias is None
            mods = [dict(d.named_modules())[name] for d in deputies]
            for m, new in zip(mods, avg_freq([m.weight for m in mods], L, isinstance(module, nn.Conv2d))):
                m.weight.copy_(new)


# --- the comparison --------------------------------------------------------------------------------------
def test_official_variant_equals_the_transcription_of_the_official_code(tmp_path, monkeypatch):
    """Two rounds, compared after each: round 1 starts from p = d (they part only by rounding) and
    no stage, so round 2 is the one that shows which model is aggregated and that the stage restarts
    in Recover."""
    store, split = write_skin_task(tmp_path / "skin", clients=CLIENTS)
    cfg = skin_config(
        store, split, "prrfl", clients=CLIENTS, rounds=3, local_epochs=3, batch_size=4, method_params=OFFICIAL,
        optimizer={"name": "sgd", "lr": LR, "weight_decay": WD, "lr_decay_every_rounds": LR_STEP},
        selection_window=0.2, selection_scope="pooled",
    )  # fmt: skip
    assert cfg["reset_optimizer_each_round"] and cfg["aggregation"]["weighting"] == "uniform"
    interrupt_after_round(cfg, tmp_path / "ours", monkeypatch, round_index=2)  # rounds 1-2 of 3
    checkpoint_file = tmp_path / "ours" / "checkpoint.pt"
    ours = {1: checkpoint.load(checkpoint.previous(checkpoint_file)), 2: checkpoint.load(checkpoint_file)}
    history = HistoryLog(checkpoint_file.parent / "checkpoint-history.jsonl")  # the rows outside the checkpoint
    for saved in ours.values():
        saved["history"] = history.read(saved["history_log"])
    assert [ours[r]["round"] for r in (1, 2)] == [1, 2]

    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"])
    ps, ds = [copy.deepcopy(model) for _ in CLIENTS], [copy.deepcopy(model) for _ in CLIENTS]
    data = load_clients(store, split, list(CLIENTS), False)
    generators = [client_generator(cfg["seed"], i) for i in range(len(CLIENTS))]
    train_xy = []
    for d in data:
        images = torch.from_numpy(np.asarray(d.train.images[d.train.rows])).permute(0, 3, 1, 2)
        train_xy.append(
            (
                images.float() * cfg["intensity_scale"],
                torch.from_numpy(np.asarray(d.train.labels[d.train.rows]).astype(np.int64)),
            )
        )
    stage_names = {1: "recover", 2: "exchange", 3: "sublimate"}
    round1_stages: list = []  # round 1's stages, carried into round 2
    for a_iter in (0, 1):
        round_index = a_iter + 1
        stages = []
        for k in range(len(CLIENTS)):
            epochs = [
                list(
                    train_batches(
                        data[k].train, cfg["batch_size"], generators[k], cfg["augment"], cfg["intensity_scale"]
                    )
                )
                for _ in range(cfg["local_epochs"])
            ]
            stages.append(official_det_round(ps[k], ds[k], epochs, *train_xy[k], a_iter))
        official_communication(ds, a_iter, cfg["rounds"])

        saved = ours[round_index]
        for k, name in enumerate(CLIENTS):
            assert stages[k][0] == 1  # every round starts in Recover
            for which, reference in (("model", ps[k]), ("deputy", ds[k])):
                mine = saved["clients"][k][which]
                for key, value in reference.state_dict().items():
                    assert torch.allclose(mine[key].double(), value.double(), atol=1e-5, rtol=0), (
                        round_index,
                        name,
                        which,
                        key,
                    )
            logged = {
                row["metric"]: row["value"]
                for row in saved["history"]
                if row["round"] == round_index and row["client"] == name and row["split"] == "server"
            }
            assert logged == {f"det_{n}_epochs": stages[k].count(s) for s, n in stage_names.items()}, (
                round_index,
                name,
            )
        if round_index == 2:
            # The round compared is not a trivial one: p and d differ, and the carried-over stage
            # (round 1's last) was not Recover for some client, so a reset is what made it Recover.
            assert any(not torch.allclose(p.fc2.weight, d.fc2.weight, atol=1e-4) for p, d in zip(ps, ds))
            assert any(s[-1] != 1 for s in round1_stages)
        round1_stages = stages


def test_official_variant_settings_are_the_ones_compared():
    """The params above are the ``prrfl-official`` variant's method parameters (config.yaml); an
    unknown or mistyped one would be refused by the DAG-time check."""
    assert set(OFFICIAL) <= set(prrfl.DEFAULTS)
    assert prrfl.PARAM_SCHEMA["upload"] == {"enum": ["personalized", "deputy"]}
    assert prrfl.DEFAULTS["radius_start"] == L_RATE and prrfl.DEFAULTS["radius_end"] == 0.95
    assert (prrfl.DEFAULTS["recover_threshold"], prrfl.DEFAULTS["sublimate_threshold"]) == (LAMBDA1, LAMBDA2)
    assert prrfl.DEFAULTS["phi_metric"] == "f1_macro"
