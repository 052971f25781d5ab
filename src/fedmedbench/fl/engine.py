"""The round loop: train -> aggregate -> distribute -> evaluate -> checkpoint, for all methods.

The engine knows nothing about any particular method: it loads ``fedmedbench.methods.<name>`` and
calls its hooks. Model selection uses the validation split only (mean over clients for a global
model, per client for personalized methods); the test split is evaluated every round for the curves
and reported at the selected round.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from fedmedbench.data.store import atomic_write_text
from fedmedbench.fl import state as ckpt_io
from fedmedbench.fl.data import eval_batches, load_clients
from fedmedbench.fl.seeding import client_generator, global_rng_state, seed_everything, set_global_rng_state
from fedmedbench.losses import build_loss
from fedmedbench.methods import load_method
from fedmedbench.metrics import METERS, METRIC_DESCRIPTIONS
from fedmedbench.models import build_model

log = logging.getLogger("fedmedbench.engine")

# Test hook: SIGKILL ourselves right after the checkpoint of this round, to test resume for real.
KILL_AFTER_ROUND_ENV = "FEDMEDBENCH_KILL_AFTER_ROUND"


def config_hash(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@torch.no_grad()
def evaluate(model: torch.nn.Module, split, cfg: dict, device: torch.device) -> dict[str, float]:
    model.eval()
    meter = METERS[cfg["kind"]](cfg["model"].get("num_classes", 2))
    loss_fn = build_loss(cfg["loss"])
    for x, y, groups in eval_batches(split, cfg.get("eval_batch_size", cfg["batch_size"]), cfg.get("intensity_scale", 1.0)):
        x, y = x.to(device), y.to(device)
        logits = model(x)
        meter.update(logits, y, groups, float(loss_fn(logits, y)))
    return meter.compute()


@torch.no_grad()
def predict_samples(model: torch.nn.Module, split, cfg: dict, device: torch.device) -> dict[str, torch.Tensor]:
    """Predictions on the first ``qualitative_samples`` test items, kept for the qualitative figures."""
    count = min(cfg.get("qualitative_samples", 4), len(split))
    if count == 0:
        return {}
    model.eval()
    x, y, _ = next(eval_batches(split, count, cfg.get("intensity_scale", 1.0)))
    pred = model(x.to(device)).argmax(1).cpu()
    image = torch.from_numpy(np.asarray(split.images[split.rows[:count]]))
    return {"image": image, "label": y.to(torch.uint8), "pred": pred.to(torch.uint8)}


class Selection:
    """Tracks the best round on validation: one global choice, or one per client (personalized)."""

    def __init__(self, clients: list[str], metric: str, per_client: bool):
        self.clients, self.metric, self.per_client = clients, metric, per_client
        self.best: dict[str, dict] = {}  # key: client name or "all" -> {"round", "score", "val", "test", "model"}

    def update(self, round_index: int, val: dict, test: dict, models: dict[str, dict], predictions: dict[str, dict]) -> None:
        keys = self.clients if self.per_client else ["all"]
        for key in keys:
            names = [key] if self.per_client else self.clients
            score = sum(val[n][self.metric] for n in names) / len(names)
            if key not in self.best or score > self.best[key]["score"]:
                self.best[key] = {
                    "round": round_index,
                    "score": score,
                    "val": {n: val[n] for n in names},
                    "test": {n: test[n] for n in names},
                    "models": {n: copy.deepcopy(models[n]) for n in names},
                    "predictions": {n: predictions[n] for n in names},
                }

    def merged(self, part: str) -> dict:
        out = {}
        for entry in self.best.values():
            out.update(entry[part])
        return out

    def state_dict(self) -> dict:
        return {"best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.best = state["best"]


def compact_models(models: dict[str, dict]) -> dict:
    """Store the first client's state once and, per other client, only the tensors that differ
    (for a global model that is nothing; with FedBN only the BN tensors)."""
    names = list(models)
    base = models[names[0]]
    diffs = {n: {k: v for k, v in models[n].items() if not torch.equal(v, base[k])} for n in names[1:]}
    return {"base_client": names[0], "base": base, "diffs": diffs}


def run_training(cfg: dict, out_dir: Path, device: str = "auto", threads: int | None = None, progress: bool = True) -> dict:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint_path = out_dir / "checkpoint.pt"
    if threads:
        torch.set_num_threads(threads)
    device = pick_device(device)
    seed = cfg["seed"]
    seed_everything(seed)

    method = load_method(cfg["method"])
    # The method's declared defaults fill any hyperparameter the config leaves out.
    cfg = {**cfg, "method_params": {**method.DEFAULTS, **cfg.get("method_params", {})}}
    data = load_clients(Path(cfg["data"]["store"]), Path(cfg["data"]["split"]), cfg["clients"], cfg.get("truncate_to_smallest", False))
    names = [c.name for c in data]
    model = build_model(cfg["model"])  # one initialisation, shared by every client
    server = method.Server(cfg, model, len(data))
    clients = [method.Client(cfg, i, d, copy.deepcopy(model), client_generator(seed, i), device) for i, d in enumerate(data)]
    metric = cfg["selection_metric"]
    selection = Selection(names, metric, per_client=method.PERSONALIZED)
    history: list[dict] = []
    start_round = 1
    fingerprint = config_hash(cfg)

    if checkpoint_path.exists():
        saved = ckpt_io.load(checkpoint_path, device)
        if saved["config_hash"] == fingerprint:
            server.load_state_dict(saved["server"])
            for client, state in zip(clients, saved["clients"]):
                client.load_state_dict(state)
            selection.load_state_dict(saved["selection"])
            history = saved["history"]
            set_global_rng_state(saved["rng"])
            start_round = saved["round"] + 1
            log.info("resumed from %s after round %d", checkpoint_path, saved["round"])
        else:
            log.warning("ignoring %s: it was written for a different configuration", checkpoint_path)
    if start_round == 1:
        for client in clients:
            client.receive(server.package(client.index, 0))

    rounds = cfg["rounds"]
    kill_after = int(os.environ.get(KILL_AFTER_ROUND_ENV, "0"))
    bar = tqdm(range(start_round, rounds + 1), initial=start_round - 1, total=rounds, desc=f"{cfg['task']}/{cfg['run']}/seed{seed}", disable=not progress, mininterval=5)
    for round_index in bar:
        started = time.time()
        replies, train_losses = [], []
        for client in clients:
            train_losses.append(client.train(cfg["local_epochs"]))
            replies.append(client.reply())
        server.aggregate(round_index, replies)
        for client in clients:
            client.receive(server.package(client.index, round_index))

        val, test, models, predictions = {}, {}, {}, {}
        for client in clients:
            eval_model = client.eval_model()
            val[client.name] = evaluate(eval_model, client.data.val, cfg, device)
            test[client.name] = evaluate(eval_model, client.data.test, cfg, device)
            models[client.name] = {k: v.detach().cpu().clone() for k, v in eval_model.state_dict().items()}
            predictions[client.name] = predict_samples(eval_model, client.data.test, cfg, device)
            history.append({"round": round_index, "client": client.name, "split": "train", "metric": "loss", "value": train_losses[client.index]})
            for split_name, scores in (("val", val), ("test", test)):
                for metric_name, value in scores[client.name].items():
                    history.append({"round": round_index, "client": client.name, "split": split_name, "metric": metric_name, "value": value})
        selection.update(round_index, val, test, models, predictions)
        mean_val = sum(v[metric] for v in val.values()) / len(val)
        mean_test = sum(t[metric] for t in test.values()) / len(test)
        bar.set_postfix({f"val_{metric}": f"{mean_val:.4f}", f"test_{metric}": f"{mean_test:.4f}"})
        if not math.isfinite(mean_val):
            raise FloatingPointError(f"round {round_index}: validation {metric} is {mean_val}; training diverged")
        log.info("round %d/%d  mean val %s %.4f  mean test %.4f  (%.1fs)", round_index, rounds, metric, mean_val, mean_test, time.time() - started)

        if round_index % cfg.get("checkpoint_every", 1) == 0 or round_index == rounds:
            ckpt_io.save_atomic(
                {
                    "config_hash": fingerprint,
                    "round": round_index,
                    "server": server.state_dict(),
                    "clients": [c.state_dict() for c in clients],
                    "selection": selection.state_dict(),
                    "history": history,
                    "rng": global_rng_state(),
                },
                checkpoint_path,
            )
            if kill_after and round_index == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
    bar.close()
    return write_outputs(cfg, out_dir, names, selection, history, checkpoint_path)


def save_npz_atomic(arrays: dict[str, np.ndarray], path: Path) -> None:
    """``client|image``, ``client|label``, ``client|pred`` arrays, readable without torch."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez_compressed(handle, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_outputs(cfg: dict, out_dir: Path, names: list[str], selection: Selection, history: list[dict], checkpoint_path: Path) -> dict:
    best_models = {}
    for entry in selection.best.values():
        best_models.update(entry["models"])
    ckpt_io.save_atomic({"clients": names, "models": compact_models({n: best_models[n] for n in names})}, out_dir / "model_best.pt")
    predictions = {f"{n}|{k}": v.numpy() for entry in selection.best.values() for n, preds in entry["predictions"].items() for k, v in preds.items()}
    save_npz_atomic(predictions, out_dir / "predictions.npz")
    atomic_write_text(out_dir / "history.csv", pd.DataFrame(history).to_csv(index=False))
    rounds_selected = {key: entry["round"] for key, entry in selection.best.items()}
    final = {
        "task": cfg["task"],
        "method": cfg["method"],
        "run": cfg["run"],
        "seed": cfg["seed"],
        "clients": names,
        "client_labels": cfg.get("client_labels", names),
        "synthetic": cfg["data"].get("synthetic", False),
        "primary_metric": cfg["selection_metric"],
        "selection": {
            "split": "val",
            "metric": cfg["selection_metric"],
            "per_client": selection.per_client,
            "best_round": rounds_selected.get("all", rounds_selected),
            "rounds": cfg["rounds"],
        },
        "test": selection.merged("test"),
        "val": selection.merged("val"),
        "metric_descriptions": {m: METRIC_DESCRIPTIONS[m] for m in next(iter(selection.merged("test").values()))},
        "config": cfg,
    }
    atomic_write_text(out_dir / "final.json", json.dumps(final, indent=2, sort_keys=True) + "\n")
    checkpoint_path.unlink(missing_ok=True)  # finished: the outputs above replace it
    return final
