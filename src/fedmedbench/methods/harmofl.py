"""HarmoFL (Jiang, Wang, Dou, AAAI 2022): amplitude normalization (AmpNorm) + weight perturbation.

Switches (``methods.harmofl`` in the config; the paper's ablations, Tables 4-6, are these):
- ``amp_norm`` / ``weight_perturbation``: both false is FedAvg bit for bit; ``amp_norm`` alone is
  "+AmpNorm"; both is HarmoFL.
- ``perturbation_radius`` alpha (0.05), ``amplitude_mode`` ``full`` (paper) | ``dc`` (official code),
  ``amplitude_decay`` v (0.1), ``amplitude_init`` ``first_batch`` (default) | ``zero``.
  The paper sets the previous-batch term "to zero for the first batch"; taken literally (``zero``)
  Eq. 3 gives A_1 = v * mean and, after K batches, a running average biased by the factor
  1 - (1 - v)^K (0.52 for prostate's 7 batches per round), so the shared global amplitude shrinks every
  image. The official code keeps the zero-initialised buffer but treats zero as "not yet set" and
  starts the average at the first batch's mean (``first_batch``), which is our default.
- ``official_code: true`` reproduces the official code's AmpNorm: ``dc`` mode, the running amplitude
  set to the first training batch's mean amplitude and then frozen (its momentum 0.1 is passed to a
  Cython ``int`` parameter and truncated to 0), i.e. it overrides the three amplitude settings above.

AmpNorm, round by round (paper Sec. 3.2, Eqs. 3-4, Alg. 1; official ``AmpNorm`` + ``communication()``):
1. Round 1 (before any exchange): for every training batch the client first updates its running
   average amplitude with the batch (Eq. 3) and then normalizes the batch's images to it (Eq. 4):
   the paper's order, "with the updated average term, each original image of the k-th batch is
   normalized". The running average continues over all batches (and local epochs) of round 1.
2. After round 1 each client sends its running average up (``reply()["amplitude"]``); the server
   averages them with uniform weights 1/N (Alg. 1 line 17 and the code, whatever
   ``aggregation.weighting`` says for the weights) and sends this global amplitude in every later
   package. It is never recomputed ("only communication at the first round and fix the global
   amplitude"), and clients stop tracking their own.
3. From round 2 on, training batches are normalized to the global amplitude.
4. Evaluation (every round, after the exchange) uses the global amplitude: ``eval_model()`` returns
   ``AmpNormNet`` = AmpNorm then the network (the code's AmpNorm sits inside the model, so it runs at
   test time too). Its state-dict keys are ``net.<network key>`` plus ``amplitude``.

Each batch is normalized once; with weight perturbation both passes (at theta and theta + delta) see
the same normalized batch (the official code runs AmpNorm in both forwards, which with its frozen
amplitude gives the same images). Weight perturbation: ``fedmedbench.ops.perturb.perturbed_step``
on the client's persistent base optimizer.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from fedmedbench.fl import client, server
from fedmedbench.ops.fourier import INITS, MODES, amplitude_normalize, batch_mean_amplitude, update_running_amplitude
from fedmedbench.ops.perturb import perturbed_step

log = logging.getLogger("fedmedbench.methods.harmofl")

DEFAULTS = {
    "amp_norm": True,
    "weight_perturbation": True,
    "perturbation_radius": 0.05,
    "amplitude_mode": "full",
    "amplitude_decay": 0.1,
    "amplitude_init": "first_batch",
    "official_code": False,
}
# Ranges and choices of the parameters (their types come from DEFAULTS): checked at DAG time.
PARAM_SCHEMA = {
    "perturbation_radius": {"type": "number", "minimum": 0},
    "amplitude_mode": {"enum": ["full", "dc"]},
    "amplitude_decay": {"type": "number", "minimum": 0, "maximum": 1},
    "amplitude_init": {"enum": ["zero", "first_batch"]},
}
PERSONALIZED = False


def amplitude_settings(params: dict) -> dict:
    """The AmpNorm settings in effect: ``official_code`` overrides mode, decay and init."""
    if params["official_code"]:
        settings = {"mode": "dc", "decay": 0.0, "init": "first_batch"}
    else:
        settings = {
            "mode": params["amplitude_mode"],
            "decay": float(params["amplitude_decay"]),
            "init": params["amplitude_init"],
        }
    if settings["mode"] not in MODES:
        raise ValueError(f"harmofl: amplitude_mode must be one of {MODES}, got {settings['mode']!r}")
    if settings["init"] not in INITS:
        raise ValueError(f"harmofl: amplitude_init must be one of {INITS}, got {settings['init']!r}")
    if not 0.0 <= settings["decay"] <= 1.0:
        raise ValueError(f"harmofl: amplitude_decay must lie in [0, 1], got {settings['decay']}")
    return settings


class AmpNormNet(nn.Module):
    """AmpNorm with a fixed amplitude, then the network: what HarmoFL evaluates."""

    def __init__(self, net: nn.Module, amplitude: torch.Tensor, mode: str):
        super().__init__()
        self.net = net
        self.mode = mode
        self.register_buffer("amplitude", amplitude)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(amplitude_normalize(x, self.amplitude, self.mode))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.embed(amplitude_normalize(x, self.amplitude, self.mode))


class Client(client.Client):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.amp = amplitude_settings(self.params) if self.params["amp_norm"] else None
        self.own_amplitude: torch.Tensor | None = None  # running average (Eq. 3), round 1 only
        self.global_amplitude: torch.Tensor | None = None  # fixed after the first exchange

    def receive(self, package):
        super().receive(package)
        if package is not None and package.get("amplitude") is not None:
            self.global_amplitude = package["amplitude"].detach().to(self.device).clone()

    @torch.no_grad()
    def harmonize(self, x: torch.Tensor) -> torch.Tensor:
        """AmpNorm of a training batch: own running amplitude (updated first) before the exchange,
        the global amplitude after it."""
        mode = self.amp["mode"]
        if self.global_amplitude is not None:
            return amplitude_normalize(x, self.global_amplitude, mode)
        self.own_amplitude = update_running_amplitude(
            self.own_amplitude, batch_mean_amplitude(x, mode), self.amp["decay"], self.amp["init"]
        )
        return amplitude_normalize(x, self.own_amplitude, mode)

    def train_step(self, x, y):
        if self.amp is not None:
            x = self.harmonize(x)
        if self.params["weight_perturbation"]:
            return perturbed_step(
                self.model,
                lambda: self.loss(x, y),
                self.optimizer,
                float(self.params["perturbation_radius"]),
                self.after_backward,
            )
        return super().train_step(x, y)

    def reply(self):
        message = super().reply()
        if self.amp is not None and self.global_amplitude is None:
            if self.own_amplitude is None:
                raise RuntimeError(f"harmofl: client {self.name} has no amplitude to send (no training batch seen)")
            message["amplitude"] = self.own_amplitude
        return message

    def eval_model(self):
        if self.amp is None:
            return self.model
        amplitude = self.global_amplitude if self.global_amplitude is not None else self.own_amplitude
        if amplitude is None:
            raise RuntimeError(f"harmofl: client {self.name} has no amplitude yet to normalize evaluation inputs")
        return AmpNormNet(self.model, amplitude, self.amp["mode"])

    def state_dict(self):
        return {**super().state_dict(), "own_amplitude": self.own_amplitude, "global_amplitude": self.global_amplitude}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.own_amplitude = state["own_amplitude"]
        self.global_amplitude = state["global_amplitude"]


class Server(server.Server):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.global_amplitude: torch.Tensor | None = None
        if self.params["amp_norm"]:
            log.info(
                "harmofl: AmpNorm %s, weight perturbation %s",
                amplitude_settings(self.params),
                self.params["weight_perturbation"],
            )

    def package(self, client_index, round_index):
        message = super().package(client_index, round_index)
        if self.global_amplitude is not None:
            message = {**message, "amplitude": self.global_amplitude}
        return message

    def aggregate(self, round_index, replies):
        super().aggregate(round_index, replies)
        amplitudes = [r["amplitude"] for r in replies if "amplitude" in r]
        if self.global_amplitude is None and amplitudes:
            if len(amplitudes) != len(replies):
                raise RuntimeError(f"harmofl: {len(amplitudes)} of {len(replies)} clients sent an amplitude")
            self.global_amplitude = torch.stack([a.detach() for a in amplitudes]).mean(dim=0)

    def state_dict(self):
        return {**super().state_dict(), "global_amplitude": self.global_amplitude}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.global_amplitude = state["global_amplitude"]


__all__ = ["Client", "Server", "DEFAULTS", "PERSONALIZED", "AmpNormNet", "amplitude_settings"]
