"""Scoring models on a split: every round's val/test scores, the local-epoch probe, the divergence
check, and the selected models' final test scores (and on test-only cohorts).

Below both the engine (``fl/engine.py``) and the round protocol (``fl/rounds.py``): the sites
score their models with these, the engine scores its selection with them after the last round.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch

from fedmedbench import faults
from fedmedbench.errors import DivergenceError
from fedmedbench.fl.client import autocast, batch_to_device
from fedmedbench.fl.data import SplitData, eval_batches
from fedmedbench.fl.selection import Selection
from fedmedbench.losses import build_loss
from fedmedbench.metrics import METERS, cohort_flag_texts
from fedmedbench.runconfig import RunConfig

# The engine's logger: a flagged selected model is a line of the training's log, filtered as before.
log = logging.getLogger("fedmedbench.engine")


@torch.no_grad()
def evaluate(model: torch.nn.Module, split, cfg: RunConfig, device: torch.device) -> dict[str, float]:
    return evaluate_meter(model, split, cfg, device).compute()


@torch.no_grad()
def evaluate_meter(model: torch.nn.Module, split, cfg: RunConfig, device: torch.device):
    """The split's metric accumulator after one pass: its scores (``compute``) and what the model
    predicted (``class_counts``, ``flags``)."""
    model.eval()
    meter = METERS[cfg.kind](cfg.model.num_classes)
    loss_fn = build_loss(cfg.loss)
    for x, y, groups in eval_batches(split, cfg.eval_batch, cfg.intensity_scale, device):
        faults.reached("eval_batch")
        x, y = batch_to_device(x, device, cfg.precision), y.to(device)
        with autocast(device, cfg.precision):
            logits = model(x)
        logits = logits.float()
        meter.update(logits, y, groups, float(loss_fn(logits, y)))
    return meter


@torch.no_grad()
def predict_samples(model: torch.nn.Module, split, cfg: RunConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """Predictions on the first ``qualitative_samples`` test items, kept for the qualitative figures."""
    count = min(cfg.qualitative_samples, len(split))
    if count == 0:
        return {}
    model.eval()
    # The evaluation's own batches: a model with batch statistics at test time (`model.bn: stateless`)
    # predicts each image from its batch, so the figure shows the predictions the scores were made of.
    # Only the batches that hold the first ``count`` items: the batches read ahead one beyond what
    # they yield, so a split cut there saves gathering a batch nobody uses (the same first batches).
    covered = min(len(split), -(-count // cfg.eval_batch) * cfg.eval_batch)
    head = SplitData(split.images, split.labels, split.rows[:covered], split.groups[:covered], split.reader)
    labels, preds = [], []
    for x, y, _ in eval_batches(head, cfg.eval_batch, cfg.intensity_scale):
        labels.append(y)
        preds.append(model(x.to(device)).argmax(1).cpu())
    y, pred = torch.cat(labels)[:count], torch.cat(preds)[:count]
    image = torch.from_numpy(np.asarray(split.images[split.rows[:count]]))
    return {"image": image, "label": y.to(torch.uint8), "pred": pred.to(torch.uint8)}


def local_epoch_probe(cfg: RunConfig, device: torch.device, history: list[dict]):
    """A callback for ``Client.epoch_probe``: the evaluated model's test scores after local epoch
    ``epoch`` of the current round (0: as received), as history rows of split ``test_local``."""

    def probe(client, epoch: int) -> None:
        model = client.eval_model()
        was_training = model.training
        scores = evaluate(model, client.data.test, cfg, device)
        model.train(was_training)
        history.extend(
            {
                "round": client.round_index,
                "client": client.name,
                "split": "test_local",
                "metric": k,
                "value": v,
                "epoch": epoch,
            }
            for k, v in scores.items()
        )

    return probe


def check_finite(round_index: int, client: str, what: str, loss: float | None, state: dict[str, torch.Tensor]) -> None:
    """The divergence policy: a non-finite loss or tensor (weights, BN statistics, optimizer-free
    state) ends the run with an error naming the round, client and quantity. One host sync per call."""
    if loss is not None and not math.isfinite(loss):
        raise DivergenceError(
            f"round {round_index}, client {client}: mean training loss is {loss}; the run diverged (try a lower learning rate)"
        )
    floats = [v for v in state.values() if v.is_floating_point()]
    if floats and not bool(torch.stack([torch.isfinite(v).all() for v in floats]).all()):
        bad = next(k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
        raise DivergenceError(
            f"round {round_index}, client {client}: {what} tensor {bad!r} is not finite; the run diverged (try a lower learning rate)"
        )


@torch.no_grad()
def final_test(
    selection: Selection, clients, cfg: RunConfig, device: torch.device
) -> tuple[dict[str, dict], dict[str, dict], dict[str, dict]]:
    """Test scores of the selected models, computed once: every client's selected evaluated model on
    its own test split (the same numbers as evaluating test at the selected round). Returns
    (scores, flags, class counts) per client: ``flags`` holds the clients whose score measures no
    model (one class predicted on the whole split, no foreground in it; ``metrics.degenerate_flags``),
    each also a WARNING line here, so a degenerate model is never a plain score."""
    by_name = {c.name: c for c in clients}
    test, flags, counts = {}, {}, {}
    for entry in selection.best.values():
        for name, state in entry["models"].items():
            model = by_name[name].eval_model()
            model.load_state_dict(state)
            meter = evaluate_meter(model, by_name[name].data.test, cfg, device)
            test[name], counts[name] = meter.compute(), meter.class_counts()
            if meter.flags():
                flags[name] = meter.flags()
                for what, text in flags[name].items():
                    log.warning(
                        "client %s: %s: the selected model (round %s) %s; its test scores are flagged in final.json, the tables and the report",
                        name,
                        what.replace("_", " "),
                        entry["round"],
                        text,
                    )
    return test, flags, counts


@torch.no_grad()
def evaluate_ensemble(models: list[torch.nn.Module], split, cfg: RunConfig, device: torch.device) -> dict[str, float]:
    """Scores of the ensemble that averages the models' softmax probabilities (its "logits" are the
    log of the mean probabilities, so argmax and softmax are the ensemble's)."""
    return ensemble_meter(models, split, cfg, device).compute()


@torch.no_grad()
def ensemble_meter(models: list[torch.nn.Module], split, cfg: RunConfig, device: torch.device):
    """:func:`evaluate_ensemble`'s metric accumulator: its scores and what the ensemble predicted."""
    for model in models:
        model.eval()
    meter = METERS[cfg.kind](cfg.model.num_classes)
    loss_fn = build_loss(cfg.loss)
    for x, y, groups in eval_batches(split, cfg.eval_batch, cfg.intensity_scale, device):
        x, y = batch_to_device(x, device, cfg.precision), y.to(device)
        probs = []
        for model in models:
            with autocast(device, cfg.precision):
                probs.append(torch.softmax(model(x).float(), dim=1))
        logits = torch.stack(probs).mean(0).clamp_min(1e-12).log()
        meter.update(logits, y, groups, float(loss_fn(logits, y)))
    return meter


@torch.no_grad()
def ood_test(selection: Selection, clients, cohorts: dict, cfg: RunConfig, device: torch.device) -> dict[str, dict]:
    """Test-only cohorts (an unseen institution) scored with every client's selected model:
    ``per_model`` (each client's model), ``mean`` (the mean of those scores: how a personalized
    method does at a new site, on average over the models it could hand over) and ``ensemble`` (the
    models' averaged probabilities). For a global method every client holds the same model, so the
    three agree (up to the composite BN of FedBN/SiloBN, which differ per client)."""
    selected = selection.merged("models")
    models = {}
    for client in clients:
        model = client.eval_model()
        model.load_state_dict(selected[client.name])
        models[client.name] = model
    scores = {cohort: score_cohort(models, split, cfg, device) for cohort, split in cohorts.items()}
    warn_cohort_flags(scores)
    return scores


@torch.no_grad()
def score_cohort(models: dict[str, torch.nn.Module], split, cfg: RunConfig, device: torch.device) -> dict[str, dict]:
    """One test-only cohort scored with ``models`` ({client: its selected model}, in client order):
    {"mean", "ensemble", "per_model"} as ``ood_test`` reports it. A federated cohort's own site calls
    it with the models the server sends it (``fl.rounds.Cohort``). The collapse check of the
    test clients covers the cohort too: ``flags`` (only when one is raised) holds
    ``{"ensemble": {kind: why}, "per_model": {client: {kind: why}}}`` (``metrics.degenerate_flags``)."""
    meters = {name: evaluate_meter(model, split, cfg, device) for name, model in models.items()}
    per_model = {name: meter.compute() for name, meter in meters.items()}
    mean = {k: float(np.mean([s[k] for s in per_model.values()])) for k in next(iter(per_model.values()))}
    ensemble = ensemble_meter(list(models.values()), split, cfg, device)
    out = {"mean": mean, "ensemble": ensemble.compute(), "per_model": per_model}
    flags = {
        "ensemble": ensemble.flags(),
        "per_model": {name: meter.flags() for name, meter in meters.items() if meter.flags()},
    }
    flags = {k: v for k, v in flags.items() if v}
    if flags:
        out["flags"] = flags
    return out


def warn_cohort_flags(ood: dict) -> None:
    """A WARNING line per flagged test-only cohort, as ``final_test`` writes one per flagged client."""
    for cohort, scores in ood.items():
        for what, text in cohort_flag_texts(scores.get("flags") or {}).items():
            log.warning(
                "test-only cohort %s: %s: %s; its scores are flagged in final.json, the tables, the figures and the report",
                cohort,
                what.replace("_", " "),
                text,
            )


def curve_every(cfg: RunConfig) -> int:
    """Test curves every this many rounds: the configured value, else ~50 points per run."""
    return cfg.curve_every or max(1, cfg.rounds // 50)
