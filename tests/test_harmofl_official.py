"""The ``harmofl-official`` row (``method_params: {official_code: true}``) against an independent
transcription of the official code, one round of the real engine.

The transcription below is written from the official repository's behaviour (med-air/HarmoFL @ 63182fe8,
``shared/specs/official_code.md`` §1.2-1.4: ``utils/layers.py: AmpNorm``, ``utils/amp_utils.pyx: process /
normalize / mutate``, ``utils/weight_perturbation.py: WPOptim``, ``federated/fed_train.py:
train_perturbation / communication``) in plain torch; it calls none of ``methods.harmofl``,
``ops.fourier`` or ``ops.perturb``. Only the inputs are shared: the initial model (``build_model`` after
``torch.manual_seed(seed)``, as the engine builds it), the data, the loss and the training batches
(``train_batches`` with each client's seeded generator, the stream the engine's clients draw).

The official flow of round 1, per client (a fresh optimizer, as the official one is created once):
- every forward runs ``AmpNorm`` first. While ``fix_amp`` is false, ``process``: per image the float64
  ``|fft2|`` (no fftshift) stored as float32, the batch mean; ``running_amp = amp_avg`` while
  ``sum(running_amp) == 0``, else ``running_amp * (1 - m) + amp_avg * m`` with the momentum 0.1 passed to a
  Cython ``int`` (so m = 0: frozen after the first batch). Then per image ``normalize(x, running_amp, L=0)``:
  float64 fft2, fftshift the amplitudes, replace the single centre bin (b = floor(min(H, W) * 0) = 0),
  i.e. the DC amplitude, own phase, real part of ifft2, back to float32;
- ``train_perturbation``: loss at theta, backward; ``generate_delta``: one L2 norm over every gradient,
  delta = alpha * g / (||g|| + 1e-12), p += delta, grads zeroed; a second forward (AmpNorm again) and
  backward at theta + delta; p -= delta; the base optimizer steps with the gradient at theta + delta;
- server ``communication``: uniform 1/N average of every state-dict key, ``running_amp`` included
  (the whole (C, H, W) buffer; only its DC bin is ever read), then ``fix_amp = True`` everywhere.

BN: the official networks use ``BatchNorm2d(affine=False, track_running_stats=False)`` (``model.bn:
stateless``): no BN parameters or buffers. That is the strict comparison, and what the ``harmofl-official``
variant runs on every task (config.yaml). With ``bn: standard`` the official ``WPOptim`` (plain SAM, no
freezing) would also update the running statistics in the forward at theta + delta, while
``ops.perturb`` updates them at theta only; the second test pins that difference (and shows everything
else still agrees).

The official network itself: the last tests build the variant's run config from config.yaml, run one
round and its test evaluation through the engine, and compare with a transcription of ``nets/models.py``
(``UNet``, ``DenseNet``: every BN without affine parameters and running statistics) trained by the
transcribed flow and tested as ``fed_train.py: test`` does, in its loader's batches (``--batch``, in
order, the last one smaller): batch statistics at test time make the scores depend on those batches.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedmedbench.config import load_config, resolve_run
from fedmedbench.data.store import read_split_csv, write_split_csv
from fedmedbench.fl import checkpoint
from fedmedbench.fl.data import eval_batches, load_clients, train_batches
from fedmedbench.fl.engine import run_training
from fedmedbench.fl.seeding import client_generator
from fedmedbench.losses import build_loss
from fedmedbench.models import build_model
from fedmedbench.runconfig import RunConfig
from tests.conftest import tiny_run_config, write_tiny_task

ALPHA = 0.05
MOMENTUM = int(0.1)  # AmpNorm's momentum 0.1 through Cython's `int momentum`: truncated to 0
BATCH = 4  # 2 batches per client after truncation (the amplitude must stay the first batch's). Not 2:
# at 16 px the UNet's bottleneck is 1x1, where batch statistics over 2 values are ill-conditioned and
# rounding differences grew to 4e-2 in one round (measured); over 4 values both sides agree to 1e-7.
# The official prostate base optimizer: Adam(lr, weight_decay=1e-4) with torch's default betas (0.9, 0.999),
# created once per client; lr 1e-3 instead of 1e-4 so that one round moves the weights visibly.
OPTIMIZER = {"name": "adam", "lr": 1e-3, "betas": [0.9, 0.999], "weight_decay": 1e-4}
# Ours and the transcription are two float32 computations of the same flow: another kernel set (CPU,
# ATEN_CPU_CAPABILITY, oneDNN) sums in another order. Adam moves each weight by about lr per step,
# whatever the gradient's size, and a weight's step follows its gradient's relative error, which
# through the network's depth (batch statistics over 4 values, gradients near 0) reaches a few
# percent: 2.07e-5 was measured on an AMD EPYC (AVX2), under 1e-5 where the test was written. So the
# bound is a tenth of one Adam step; a flow that differs (no perturbation, another amplitude, other
# batches) moves weights by whole steps (the rounds move them by > 1e-3, asserted beside).
ATOL = 0.1 * OPTIMIZER["lr"]


# --- the transcription -------------------------------------------------------------------------------
def official_process(x: torch.Tensor, running_amp: torch.Tensor, fix_amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``amp_utils.process``: (normalized batch, running_amp), float32 like the Cython buffers."""
    if not fix_amp:
        amp_avg = torch.fft.fft2(x.double(), dim=(-2, -1)).abs().float().mean(dim=0)  # per image, then mean
        if float(running_amp.sum()) == 0:
            running_amp = amp_avg
        else:
            running_amp = running_amp * (1 - MOMENTUM) + amp_avg * MOMENTUM
    height, width = x.shape[-2:]
    b = int(min(height, width) * 0)  # L = 0
    c_h, c_w = height // 2, width // 2
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        spectrum = torch.fft.fft2(x[i].double(), dim=(-2, -1))
        amp, phase = spectrum.abs(), torch.angle(spectrum)
        a_src = torch.fft.fftshift(amp, dim=(-2, -1))
        a_trg = torch.fft.fftshift(running_amp[:3], dim=(-2, -1))
        a_src[:, c_h - b : c_h + b + 1, c_w - b : c_w + b + 1] = a_trg[
            :, c_h - b : c_h + b + 1, c_w - b : c_w + b + 1
        ].double()
        mixed = torch.fft.ifftshift(a_src, dim=(-2, -1)) * torch.exp(1j * phase)
        out[i] = torch.fft.ifft2(mixed, dim=(-2, -1)).real.float()
    return out, running_amp


def set_norm_tracking(model: torch.nn.Module, track: bool) -> None:
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d) and module.running_mean is not None:
            module.track_running_stats = track


def official_client_round(model, batches, loss_fn, perturbed_forward_updates_bn: bool = True):
    """``train_perturbation`` over one local epoch with ``WPOptim(Adam)``; returns (state, running_amp)."""
    model.train()
    params = list(model.parameters())
    optimizer = torch.optim.Adam(
        params, lr=OPTIMIZER["lr"], betas=tuple(OPTIMIZER["betas"]), weight_decay=OPTIMIZER["weight_decay"]
    )
    running_amp = torch.zeros(batches[0][0].shape[1:], dtype=torch.float32)  # register_buffer(zeros(input_shape))
    for x, y in batches:
        optimizer.zero_grad()
        x_norm, running_amp = official_process(x, running_amp, fix_amp=False)
        loss_fn(model(x_norm), y).backward()
        with torch.no_grad():  # generate_delta(zero_grad=True)
            with_grad = [p for p in params if p.grad is not None]
            grad_norm = torch.norm(torch.stack([(1.0 * p.grad).norm(p=2) for p in with_grad]), p=2)
            scale = ALPHA / (grad_norm + 1e-12)
            deltas = []
            for p in with_grad:
                delta = 1.0 * p.grad * scale.to(p)
                p.add_(delta)
                deltas.append(delta)
        optimizer.zero_grad()
        x_norm, running_amp = official_process(x, running_amp, fix_amp=False)  # AmpNorm runs in both forwards
        set_norm_tracking(model, perturbed_forward_updates_bn)
        loss_fn(model(x_norm), y).backward()
        set_norm_tracking(model, True)
        with torch.no_grad():  # step(zero_grad=True)
            for p, delta in zip(with_grad, deltas):
                p.sub_(delta)
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict(), running_amp


def official_communication(states: list[dict], amps: list[torch.Tensor]) -> tuple[dict, torch.Tensor]:
    """Uniform 1/N average of every floating key and of ``running_amp`` (summed into a float32 zero
    buffer, client by client). The official loop cannot average an integer ``num_batches_tracked``
    (float into a long buffer), which never arises with its stateless BN: such keys are left out."""
    weight = 1.0 / len(states)
    averaged = {}
    for key, value in states[0].items():
        if not value.is_floating_point():
            continue
        total = torch.zeros_like(value)
        for state in states:
            total += weight * state[key]
        averaged[key] = total
    amp = torch.zeros_like(amps[0])
    for a in amps:
        amp += weight * a
    return averaged, amp


def official_round(cfg: RunConfig, perturbed_forward_updates_bn: bool = True):
    torch.manual_seed(cfg.seed)  # as the engine: seed_everything(seed), then build_model
    init = build_model(cfg.model)
    loss_fn = build_loss(cfg.loss)
    data = load_clients(Path(cfg.data.store), Path(cfg.data.split), list(cfg.clients), cfg.truncate_to_smallest)
    states, amps, first_batches = [], [], []
    for index, client in enumerate(data):
        generator = client_generator(cfg.seed, index)
        batches = list(train_batches(client.train, cfg.batch_size, generator, cfg.augment, cfg.intensity_scale))
        assert len(batches) == 2
        first_batches.append(batches[0][0])
        state, amp = official_client_round(copy.deepcopy(init), batches, loss_fn, perturbed_forward_updates_bn)
        states.append({k: v.clone() for k, v in state.items()})
        amps.append(amp)
    weights, amp = official_communication(states, amps)
    return init.state_dict(), weights, amp, amps, first_batches


# --- the engine's row ----------------------------------------------------------------------------------
def engine_round(tmp_path, bn: str):
    store, split = write_tiny_task(tmp_path / "data", n=(12, 14, 13))  # train 8/10/9 -> truncated to 8
    cfg = tiny_run_config(
        store, split, "harmofl", rounds=1, augment="none", batch_size=BATCH, intensity_scale=1.0, truncate_to_smallest=True,
        model={"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2, "bn": bn},
        optimizer=OPTIMIZER, method_params={"official_code": True},
    )  # fmt: skip
    run_training(cfg, tmp_path / "run", device="cpu", progress=False)
    best = checkpoint.load_plain(tmp_path / "run" / "model_best.pt")["models"][
        "base"
    ]  # the evaluated model after round 1
    ours = {k.removeprefix("net."): v for k, v in best.items() if k.startswith("net.")}
    return RunConfig.from_dict(cfg), ours, best["amplitude"]


def max_diff(a: dict, b: dict, keys) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in keys)


def check_amplitude(amplitude, official_amp, client_amps, first_batches, cfg):
    # Ours keeps only the DC bin, (C, 1, 1); the official buffer is the whole (C, H, W) first-batch
    # mean amplitude, of which normalize(L=0) reads only the DC bin.
    assert amplitude.shape == (3, 1, 1)
    for amp, x in zip(client_amps, first_batches):  # frozen after the first of 2 batches
        torch.testing.assert_close(amp, torch.fft.fft2(x.double()).abs().float().mean(0), rtol=0, atol=0)
    diff = float((amplitude.double() - official_amp[:, :1, :1].double()).abs().max())
    assert diff <= 1e-6 * float(official_amp[:, 0, 0].abs().max()), diff
    return diff


def test_official_row_matches_the_official_code_one_round(tmp_path):
    """Strict: the official networks' stateless BN; global weights and the averaged DC amplitude."""
    cfg, ours, amplitude = engine_round(tmp_path, "stateless")
    init, official, official_amp, client_amps, first_batches = official_round(cfg)
    assert set(ours) == set(official) == set(init)
    moved = max_diff(ours, init, ours)
    assert moved > 1e-3  # the round changed the weights (so the comparison can fail)
    diff = max_diff(ours, official, ours)
    assert diff < ATOL, (diff, moved)
    check_amplitude(amplitude, official_amp, client_amps, first_batches, cfg)
    print(f"stateless BN: weights moved {moved:.3g}, max |ours - official| {diff:.3g}")


def test_official_row_with_standard_bn_differs_only_in_running_statistics(tmp_path):
    """Our row's ``bn: standard``: trainable weights and amplitude agree with the official flow; the BN
    running statistics do not, because the official ``WPOptim`` (if it had running statistics) would
    update them in the forward at theta + delta too, while ``ops.perturb`` freezes them there."""
    cfg, ours, amplitude = engine_round(tmp_path, "standard")
    init, official, official_amp, client_amps, first_batches = official_round(cfg, perturbed_forward_updates_bn=True)
    model = build_model(cfg.model)
    params = {k for k, _ in model.named_parameters()}
    stats = {k for k in official if k.endswith(("running_mean", "running_var"))}
    assert stats and max_diff(ours, init, params) > 1e-3
    diff = max_diff(ours, official, params)
    assert diff < ATOL, diff
    check_amplitude(amplitude, official_amp, client_amps, first_batches, cfg)
    literal = max(
        float(((ours[k].double() - official[k].double()).abs() / official[k].double().abs().clamp_min(1.0)).max())
        for k in stats
    )
    assert literal > 1e-3, literal  # the documented difference: running statistics
    _, theta_only, _, _, _ = official_round(cfg, perturbed_forward_updates_bn=False)
    frozen = max(
        float(((ours[k].double() - theta_only[k].double()).abs() / theta_only[k].double().abs().clamp_min(1.0)).max())
        for k in stats
    )
    assert frozen < 1e-6, frozen  # relative: running variances of 0..255 inputs reach the thousands
    assert torch.equal(ours["encoders.0.1.num_batches_tracked"], torch.tensor(2))  # one count per batch, at theta
    print(
        f"standard BN: params {diff:.3g}; running stats vs official literal {literal:.3g}, vs theta-only {frozen:.3g}"
    )


# --- the official network: a transcription of nets/models.py ----------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def official_bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, affine=False, track_running_stats=False)


def official_unet_block(c_in: int, c_out: int, name: str) -> nn.Sequential:
    """``UNet._block``: (3x3 conv without bias, BN, ReLU) twice, with the official module names."""
    return nn.Sequential(OrderedDict([
        (f"{name}_conv1", nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)), (f"{name}_bn1", official_bn(c_out)), (f"{name}_relu1", nn.ReLU()),
        (f"{name}_conv2", nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)), (f"{name}_bn2", official_bn(c_out)), (f"{name}_relu2", nn.ReLU()),
    ]))  # fmt: skip


class OfficialUNet(nn.Module):
    """``nets/models.py: UNet`` without its first op, ``AmpNorm`` (applied outside by ``official_process``)."""

    def __init__(self, in_channels: int, out_channels: int, f: int):
        super().__init__()
        for i, (c_in, c_out) in enumerate([(in_channels, f), (f, 2 * f), (2 * f, 4 * f), (4 * f, 8 * f)], start=1):
            setattr(self, f"encoder{i}", official_unet_block(c_in, c_out, f"enc{i}"))
            setattr(self, f"pool{i}", nn.MaxPool2d(2, 2))
        self.bottleneck = official_unet_block(8 * f, 16 * f, "bottleneck")
        for i, width in zip((4, 3, 2, 1), (8 * f, 4 * f, 2 * f, f)):
            setattr(self, f"upconv{i}", nn.ConvTranspose2d(2 * width, width, 2, stride=2))
            setattr(self, f"decoder{i}", official_unet_block(2 * width, width, f"dec{i}"))
        self.conv = nn.Conv2d(f, out_channels, 1)

    def forward(self, x):
        encs = []
        for i in range(1, 5):
            x = getattr(self, f"encoder{i}")(x if i == 1 else getattr(self, f"pool{i - 1}")(x))
            encs.append(x)
        x = self.bottleneck(self.pool4(x))
        for i in (4, 3, 2, 1):
            x = getattr(self, f"decoder{i}")(torch.cat((getattr(self, f"upconv{i}")(x), encs[i - 1]), dim=1))
        return self.conv(x)


def official_unet_key(key: str) -> str:
    """Our UNet's state-dict key -> the official one (``encoders.0.3.weight`` -> ``encoder1.enc1_conv2.weight``)."""
    parts = key.split(".")
    conv = {"0": "conv1", "3": "conv2"}
    if parts[0] == "encoders":
        i = int(parts[1]) + 1
        return f"encoder{i}.enc{i}_{conv[parts[2]]}.{parts[3]}"
    if parts[0] == "bottleneck":
        return f"bottleneck.bottleneck_{conv[parts[1]]}.{parts[2]}"
    if parts[0] in ("upconvs", "decoders"):
        i = 4 - int(parts[1])  # ours run from the bottleneck up; the official names count down
        return f"upconv{i}.{parts[2]}" if parts[0] == "upconvs" else f"decoder{i}.dec{i}_{conv[parts[2]]}.{parts[3]}"
    assert parts[0] == "head", key
    return f"conv.{parts[1]}"


def official_dice_per_sample(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``DiceLoss.dice_coef`` before its batch mean: per sample and class 2|P&G| / (|P| + |G| + 1e-5) of
    the argmax, averaged over the classes (background included)."""
    pred = logits.softmax(1).argmax(1)
    dice = []
    for c in range(logits.shape[1]):
        p, g = (pred == c).flatten(1).float(), (target == c).flatten(1).float()
        dice.append(2 * (p * g).sum(1) / (p.sum(1) + g.sum(1) + 1e-5))
    return torch.stack(dice).mean(0)


def official_test_logits(net: nn.Module, split, batch: int, amp: torch.Tensor, intensity_scale: float):
    """``fed_train.py: test``: the loader's batches in order (the last one smaller), AmpNorm with the
    frozen global amplitude, the network in eval mode (batch statistics: no running statistics exist)."""
    net.eval()
    logits, targets = [], []
    with torch.no_grad():
        for x, y, _ in eval_batches(split, batch, intensity_scale):
            logits.append(net(official_process(x, amp, fix_amp=True)[0]))
            targets.append(y)
    return torch.cat(logits), torch.cat(targets)


def variant_run_config(task: str) -> dict:
    return resolve_run(load_config(ROOT / "config" / "config.yaml"), task, "harmofl-official", 0)


@pytest.mark.parametrize("task", ["prostate", "nuclei", "camelyon17"])
def test_official_variant_runs_the_official_network_on_every_task(task):
    """Every task of the official row: BN without affine parameters and running statistics, evaluated in
    batches of the training batch size (the official loaders' ``--batch``), Adam's torch defaults."""
    cfg = RunConfig.from_dict(variant_run_config(task))
    assert cfg.model.bn == "stateless" and cfg.eval_batch == cfg.batch_size
    assert cfg.optimizer.betas == (0.9, 0.999) and cfg.method_params["official_code"] is True
    model = build_model(
        {
            **cfg.to_dict()["model"],
            "init_features": 2,
            "growth_rate": 4,
            "block_config": [1, 1, 1, 1],
            "num_init_features": 8,
        }
    )
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(m.weight is None and m.running_mean is None for m in norms)
    assert not [k for k in model.state_dict() if "running" in k or "num_batches" in k]
    paper = RunConfig.from_dict(resolve_run(load_config(ROOT / "config" / "config.yaml"), task, "harmofl", 0))
    assert paper.model.bn == "standard"  # the paper rows keep their network


def test_official_network_round_and_test_match_the_transcription(tmp_path):
    """One real round of ``harmofl-official`` as config.yaml resolves it (its model, evaluation batch,
    optimizer and method settings; tiny sizes) against the transcribed official network, flow and test."""
    variant = variant_run_config("prostate")
    store, split = write_tiny_task(tmp_path / "data", n=(16, 16, 16))
    rows = read_split_csv(split)
    position = rows.groupby("client").cumcount()
    rows["split"] = [
        "train" if k < 8 else "val" if k < 10 else "test" for k in position
    ]  # 8 / 2 / 6: test in batches 4 + 2
    write_split_csv(rows, split)
    cfg = tiny_run_config(
        store, split, "harmofl", rounds=1, augment="none", batch_size=BATCH, intensity_scale=1.0, truncate_to_smallest=True,
        model={**variant["model"], "init_features": 2}, eval_batch_size=variant["eval_batch_size"],
        optimizer={**variant["optimizer"], "lr": OPTIMIZER["lr"]}, method_params=variant["method_params"],
    )  # fmt: skip
    run_training(cfg, tmp_path / "run", device="cpu", progress=False)
    best = checkpoint.load_plain(tmp_path / "run" / "model_best.pt")["models"]["base"]
    ours = {official_unet_key(k.removeprefix("net.")): v for k, v in best.items() if k.startswith("net.")}
    final = json.loads((tmp_path / "run" / "final.json").read_text())
    cfg = RunConfig.from_dict(cfg)
    assert cfg.optimizer.betas == tuple(OPTIMIZER["betas"]) and cfg.eval_batch == BATCH

    torch.manual_seed(cfg.seed)  # the engine's initial model, moved into the transcription
    init = {official_unet_key(k): v for k, v in build_model(cfg.model).state_dict().items()}
    net = OfficialUNet(3, 2, 2)
    net.load_state_dict(init)  # strict: the same tensors, no BN state on either side
    data = load_clients(Path(cfg.data.store), Path(cfg.data.split), list(cfg.clients), True)
    states, amps = [], []
    for index, client in enumerate(data):
        batches = list(train_batches(client.train, BATCH, client_generator(cfg.seed, index), "none", 1.0))
        state, amp = official_client_round(copy.deepcopy(net), batches, build_loss(cfg.loss))
        states.append({k: v.clone() for k, v in state.items()})
        amps.append(amp)
    weights, amp = official_communication(states, amps)
    assert set(ours) == set(weights)
    moved = max_diff(weights, init, weights)
    diff = max_diff(ours, weights, weights)
    assert moved > 1e-3 and diff < ATOL, (diff, moved)

    # The official test on our aggregated network: Dice thresholds its predictions, so a weight
    # difference within ATOL (kernel sets differ in rounding) flips boundary pixels and moved a client's
    # Dice by 5e-4 on one CPU. With the same weights on both sides only the evaluation itself is compared.
    net.load_state_dict(ours)
    for client in data:
        logits, target = official_test_logits(net, client.test, BATCH, amp, 1.0)
        per_sample = official_dice_per_sample(logits, target)
        assert len(per_sample) == 6
        # Ours: the mean over samples; the official code averages its per-batch means (4 and 2 samples).
        ours_dice = final["test"][client.name]["dice_paper"]
        assert abs(ours_dice - float(per_sample.mean())) < 1e-4, (client.name, ours_dice, float(per_sample.mean()))
        one_batch, _ = official_test_logits(net, client.test, len(client.test), amp, 1.0)
        assert float((one_batch - logits).abs().max()) > 1e-3  # batch statistics: the test batches matter
        print(
            f"{client.name}: dice ours {ours_dice:.6f}, official per-sample {float(per_sample.mean()):.6f}, per-batch {(per_sample[:4].mean() + per_sample[4:].mean()) / 2:.6f}"
        )
    print(f"official network: weights moved {moved:.3g}, max |ours - official| {diff:.3g}")


class OfficialDenseLayer(nn.Sequential):
    def __init__(self, c_in: int, growth: int, bn_size: int):
        super().__init__(OrderedDict([
            ("bn1", official_bn(c_in)), ("relu1", nn.ReLU()), ("conv1", nn.Conv2d(c_in, bn_size * growth, 1, bias=False)),
            ("bn2", official_bn(bn_size * growth)), ("relu2", nn.ReLU()), ("conv2", nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)),
        ]))  # fmt: skip

    def forward(self, x):
        return torch.cat([x, super().forward(x)], 1)


class OfficialDenseNet(nn.Module):
    """``nets/models.py: DenseNet`` (DenseNet-BC, a ZeroPad2d(2) after the first block) without ``AmpNorm``."""

    def __init__(self, growth: int, blocks: tuple[int, ...], init_features: int, bn_size: int = 4, classes: int = 2):
        super().__init__()
        layers = OrderedDict(
            [
                ("conv0", nn.Conv2d(3, init_features, 7, stride=2, padding=3, bias=False)),
                ("bn0", official_bn(init_features)),
                ("relu0", nn.ReLU()),
                ("pool0", nn.MaxPool2d(3, 2, padding=1)),
            ]
        )
        c = init_features
        for i, n in enumerate(blocks):
            block = nn.Sequential(
                OrderedDict(
                    (f"denselayer{j + 1}", OfficialDenseLayer(c + j * growth, growth, bn_size)) for j in range(n)
                )
            )
            layers[f"denseblock{i + 1}"] = block
            c += n * growth
            if i == 0:
                layers["zero_padding"] = nn.ZeroPad2d(2)
            if i != len(blocks) - 1:
                layers[f"transition{i + 1}"] = nn.Sequential(
                    OrderedDict(
                        [
                            ("bn", official_bn(c)),
                            ("relu", nn.ReLU()),
                            ("conv", nn.Conv2d(c, c // 2, 1, bias=False)),
                            ("pool", nn.AvgPool2d(2, 2)),
                        ]
                    )
                )
                c //= 2
        layers["bn5"] = official_bn(c)
        self.features = nn.Sequential(layers)
        self.classifier = nn.Linear(c, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(F.relu(self.features(x)), (1, 1)), 1))


def test_official_densenet_matches_the_transcription():
    """Camelyon17's network under the variant's ``bn``: the same parameters as the transcribed official
    DenseNet (strict load), the same outputs in train and eval mode, the same SGD step."""
    variant = variant_run_config("camelyon17")
    model_cfg = {**variant["model"], "growth_rate": 4, "block_config": [2, 2, 2, 2], "num_init_features": 8}
    torch.manual_seed(0)
    ours = build_model(model_cfg)
    official = OfficialDenseNet(4, (2, 2, 2, 2), 8)
    official.load_state_dict(ours.state_dict())  # strict: same keys (BN has none), same shapes
    x = torch.rand(4, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        for mode in (True, False):
            ours.train(mode), official.train(mode)
            torch.testing.assert_close(ours(x), official(x), rtol=0, atol=1e-6)
        assert float((ours.eval()(x[:2]) - ours(x)[:2]).abs().max()) > 1e-4  # batch statistics at test time
    for net in (ours, official):
        net.train()
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        F.cross_entropy(net(x), y).backward()
        opt.step()
    diff = max_diff(ours.state_dict(), official.state_dict(), ours.state_dict())
    assert diff < 1e-6, diff
