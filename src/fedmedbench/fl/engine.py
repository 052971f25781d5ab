"""The round loop: train -> aggregate -> distribute -> evaluate -> checkpoint, for all methods.

The engine knows nothing about any particular method: it loads ``fedmedbench.methods.<name>`` and
calls its hooks. Model selection uses the validation split only (mean over clients for a global
model, per client for personalized methods); the test split is evaluated every round for the curves
and reported at the selected round.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedmedbench import faults
from fedmedbench.errors import ConfigError, DataError, DivergenceError
from fedmedbench.files import atomic_file, atomic_write_text, new_folder
from fedmedbench.fl import placement
from fedmedbench.fl import state as ckpt_io
from fedmedbench.fl.runlock import run_folder_lock
from fedmedbench.fl.client import autocast, batch_to_device
from fedmedbench.fl.data import BatchReader, check_image_size, data_digest, eval_batches, load_clients, load_test_only
from fedmedbench.fl.seeding import client_generator, global_rng_state, seed_everything, set_global_rng_state
from fedmedbench.fl.transport import InProcessTransport, Site, run_rounds
from fedmedbench.losses import build_loss
from fedmedbench.metrics import METERS, METRIC_DESCRIPTIONS
from fedmedbench.models import build_model
from fedmedbench.progress import Progress
from fedmedbench.registry import load_method, merge_params
from fedmedbench.runconfig import RunConfig

log = logging.getLogger("fedmedbench.engine")


def pick_device(name: str = "auto") -> tuple[torch.device, placement.Claim | None]:
    """``auto``: a GPU slot claimed for the life of the job (see fl/placement.py), else the CPU.
    An explicit device (``cuda:1``, ``cpu``) is used as given, without a claim."""
    if name == "auto" and torch.cuda.is_available():
        claim = placement.claim(placement.visible_gpu_ids(), placement.jobs_per_gpu(), placement.lock_dir())
        log.info("placed on cuda:%d (%s, slot %d)", claim.device_index, claim.device_id, claim.slot)
        return torch.device(f"cuda:{claim.device_index}"), claim
    return torch.device("cpu" if name == "auto" else name), None


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
    labels, preds = [], []
    for x, y, _ in eval_batches(split, cfg.eval_batch, cfg.intensity_scale):
        labels.append(y)
        preds.append(model(x.to(device)).argmax(1).cpu())
        if sum(len(b) for b in labels) >= count:
            break
    y, pred = torch.cat(labels)[:count], torch.cat(preds)[:count]
    image = torch.from_numpy(np.asarray(split.images[split.rows[:count]]))
    return {"image": image, "label": y.to(torch.uint8), "pred": pred.to(torch.uint8)}


class Selection:
    """Tracks the best round on validation: one global choice, or one per client (personalized).

    Per choice it keeps the round, the validation scores, the evaluated models and the qualitative
    predictions at that round. Test scores are not tracked here: the selected models are evaluated on
    test once, at the end (``final_test``). ``version`` changes whenever a choice changes, so the
    models are written to disk only then.
    """

    def __init__(self, clients: list[str], metric: str, per_client: bool):
        self.clients, self.metric, self.per_client = clients, metric, per_client
        self.best: dict[str, dict] = {}  # client name or "all" -> {"round", "score", "val", "models", "predictions"}
        self.version = 0

    def improved(self, val: dict[str, dict], round_index: int) -> dict[str, list[str]]:
        """The choices this round's validation scores improve: {key: the clients it covers}. An
        undefined (NaN) score is an error, never a comparison that silently fails every round
        (``check_selection_defined`` rules out the splits that cannot define the metric)."""
        undefined = [n for n in self.clients if math.isnan(val[n][self.metric])]
        if undefined:
            raise DataError(f"round {round_index}: validation {self.metric} is undefined (NaN) for client(s) {', '.join(undefined)}; model selection cannot compare rounds")
        keys = {name: [name] for name in self.clients} if self.per_client else {"all": self.clients}
        better = {}
        for key, names in keys.items():
            score = sum(val[n][self.metric] for n in names) / len(names)
            if key not in self.best or score > self.best[key]["score"]:
                better[key] = names
        return better

    def record(self, key: str, round_index: int, val: dict, models: dict[str, dict], predictions: dict[str, dict]) -> None:
        names = list(models)
        score = sum(val[n][self.metric] for n in names) / len(names)
        self.best[key] = {"round": round_index, "score": score, "val": {n: val[n] for n in names}, "models": models, "predictions": predictions}
        self.version += 1

    def merged(self, part: str) -> dict:
        out = {}
        for entry in self.best.values():
            out.update(entry[part])
        return out

    def state_dict(self) -> dict:
        """The light part (rounds, scores), stored in every checkpoint."""
        light = {key: {k: v for k, v in entry.items() if k not in ("models", "predictions")} for key, entry in self.best.items()}
        return {"best": light, "version": self.version}

    def heavy_state(self) -> dict:
        """Models and predictions, written only when ``version`` changes."""
        return {key: {"models": e["models"], "predictions": e["predictions"]} for key, e in self.best.items()}

    def load_state_dict(self, state: dict, heavy: dict) -> None:
        self.best = {key: {**entry, **heavy[key]} for key, entry in state["best"].items()}
        self.version = state["version"]


def compact_models(models: dict[str, dict]) -> dict:
    """Store the first client's state once and, per other client, only the tensors that differ
    (for a global model that is nothing; with FedBN only the BN tensors)."""
    names = list(models)
    base = models[names[0]]
    diffs = {n: {k: v for k, v in models[n].items() if not torch.equal(v, base[k])} for n in names[1:]}
    return {"base_client": names[0], "base": base, "diffs": diffs}


def local_epoch_probe(cfg: RunConfig, device: torch.device, history: list[dict]):
    """A callback for ``Client.epoch_probe``: the evaluated model's test scores after local epoch
    ``epoch`` of the current round (0: as received), as history rows of split ``test_local``."""

    def probe(client, epoch: int) -> None:
        model = client.eval_model()
        was_training = model.training
        scores = evaluate(model, client.data.test, cfg, device)
        model.train(was_training)
        history.extend({"round": client.round_index, "client": client.name, "split": "test_local", "metric": k, "value": v, "epoch": epoch} for k, v in scores.items())

    return probe


def check_finite(round_index: int, client: str, what: str, loss: float | None, state: dict[str, torch.Tensor]) -> None:
    """The divergence policy: a non-finite loss or tensor (weights, BN statistics, optimizer-free
    state) ends the run with an error naming the round, client and quantity. One host sync per call."""
    if loss is not None and not math.isfinite(loss):
        raise DivergenceError(f"round {round_index}, client {client}: mean training loss is {loss}; the run diverged (try a lower learning rate)")
    floats = [v for v in state.values() if v.is_floating_point()]
    if floats and not bool(torch.stack([torch.isfinite(v).all() for v in floats]).all()):
        bad = next(k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all()))
        raise DivergenceError(f"round {round_index}, client {client}: {what} tensor {bad!r} is not finite; the run diverged (try a lower learning rate)")


def selection_file(out_dir: Path, version: int) -> Path:
    return out_dir / f"selection-v{version}.pt"


def history_file(out_dir: Path) -> Path:
    """The checkpointed history rows (``ckpt_io.HistoryLog``), beside ``checkpoint.pt``."""
    return out_dir / "checkpoint-history.jsonl"


def checkpoint_files(checkpoint_path: Path) -> tuple[Path, Path, Path]:
    """What resuming reads besides the selection files; removed once the outputs are written."""
    return checkpoint_path, ckpt_io.previous(checkpoint_path), history_file(checkpoint_path.parent)


def restore(checkpoint_path: Path, fingerprint: str, data_fingerprint: str, server, clients, selection: Selection, history_log: ckpt_io.HistoryLog | None = None) -> tuple[int, list[dict]]:
    """Resume state from the checkpoint (or, if it is damaged, the previous one): (last round, history).
    (0, []) when there is nothing usable, and training starts from scratch. A checkpoint of another
    configuration, or of data rebuilt since it was written (``data_digest``), is not used. The
    history rows are those of the checkpoint's position in the history log (a checkpoint of the
    earlier format holds them itself; they move into the log); ``history_log``, when given,
    continues from there."""
    reader = history_log or ckpt_io.HistoryLog(history_file(checkpoint_path.parent))
    for candidate in (checkpoint_path, ckpt_io.previous(checkpoint_path)):
        if not candidate.exists():
            continue
        try:
            saved = ckpt_io.load_checkpoint(candidate)
            if saved["config_hash"] != fingerprint:
                log.warning("ignoring %s: it was written for a different configuration", candidate)
                return 0, []
            if saved.get("data_digest") != data_fingerprint:
                log.warning("ignoring %s: the data it was trained on changed since (split file or store rebuilt); training starts afresh", candidate)
                return 0, []
            version = saved["selection"]["version"]
            heavy = ckpt_io.load_checkpoint(selection_file(candidate.parent, version)) if version else {}
            history = saved["history"] if "history" in saved else reader.read(saved["history_log"])
        except (ckpt_io.CorruptCheckpoint, FileNotFoundError) as err:
            log.warning("%s; falling back to the previous checkpoint or a fresh start", err)
            continue
        server.load_state_dict(saved["server"])
        for client, state in zip(clients, saved["clients"]):
            client.load_state_dict(state)
        selection.load_state_dict(saved["selection"], heavy)
        set_global_rng_state(saved["rng"])
        if history_log is not None:
            if "history" in saved:  # an FMBCKPT1 checkpoint: its rows start the log
                history_log.reset()
                history_log.append(history)
            else:
                history_log.continue_from(saved["history_log"])
        log.info("resumed from %s after round %d", candidate, saved["round"])
        return saved["round"], history
    return 0, []


@contextlib.contextmanager
def writing(path: Path, round_index: int | None):
    """A failed write (full disk, quota, permissions) as one line naming the file and round."""
    try:
        yield
    except OSError as err:
        when = f"round {round_index}: " if round_index is not None else ""
        raise DataError(f"{when}could not write {path}: {err.strerror or err}") from err


def remove_stale_files(out_dir: Path, selection_version: int) -> None:
    """What a killed job (SIGKILL: OOM, a time limit) may have left: temporaries of atomic writes
    (``.checkpoint.pt.*.tmp``, ``.selection-v*.pt.*.tmp``...) and selection files no checkpoint
    refers to (newer than the restored one's; all of them on a fresh start)."""
    for path in out_dir.glob(".*.tmp"):
        path.unlink(missing_ok=True)
    for path in out_dir.glob("selection-v*.pt"):
        version = path.name[len("selection-v") : -len(".pt")]
        if not version.isdigit() or int(version) > selection_version:
            path.unlink(missing_ok=True)


def save_state(out_dir: Path, checkpoint_path: Path, round_index: int, fingerprints: tuple[str, str], server, clients, selection: Selection, history: list[dict], previous_version: int, history_log: ckpt_io.HistoryLog) -> int:
    """The checkpoint of this round. The selected models live in ``selection-v<version>.pt``, written
    only when the selection changed; kept are the files of this checkpoint and of its ``.prev``
    (``previous_version``). The history rows since the last checkpoint are appended to
    ``history_log`` (fsynced), and the checkpoint records the log's position: its cost does not grow
    with the rounds. Returns this checkpoint's version (the next call's ``previous_version``)."""
    current = selection_file(out_dir, selection.version)
    if selection.version and not current.exists():
        with writing(current, round_index):
            ckpt_io.save_checkpoint(selection.heavy_state(), current)
    state = {
        "config_hash": fingerprints[0],
        "data_digest": fingerprints[1],
        "round": round_index,
        "server": server.state_dict(),
        "clients": [c.state_dict() for c in clients],
        "selection": selection.state_dict(),
        "rng": global_rng_state(),
    }
    try:
        with writing(history_log.path, round_index):
            history_log.append(history[history_log.rows :])
        state["history_log"] = history_log.position()
        with writing(checkpoint_path, round_index):
            ckpt_io.save_checkpoint(state, checkpoint_path)
    except DataError:
        if selection.version != previous_version:
            current.unlink(missing_ok=True)  # no checkpoint refers to it
        raise
    keep = {current, selection_file(out_dir, previous_version)}
    for path in out_dir.glob("selection-v*.pt"):
        if path not in keep:
            path.unlink(missing_ok=True)
    return selection.version


@torch.no_grad()
def final_test(selection: Selection, clients, cfg: RunConfig, device: torch.device) -> tuple[dict[str, dict], dict[str, dict], dict[str, dict]]:
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
                    log.warning("client %s: %s: the selected model (round %s) %s; its test scores are flagged in final.json, the tables and the report", name, what.replace("_", " "), entry["round"], text)
    return test, flags, counts


@torch.no_grad()
def evaluate_ensemble(models: list[torch.nn.Module], split, cfg: RunConfig, device: torch.device) -> dict[str, float]:
    """Scores of the ensemble that averages the models' softmax probabilities (its "logits" are the
    log of the mean probabilities, so argmax and softmax are the ensemble's)."""
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
    return meter.compute()


@torch.no_grad()
def ood_test(selection: Selection, clients, cohorts: dict, cfg: RunConfig, device: torch.device) -> dict[str, dict]:
    """Test-only cohorts (an unseen institution) scored with every client's selected model:
    ``per_model`` (each client's model), ``mean`` (the mean of those scores: how a personalized
    method does at a new site, on average over the models it could hand over) and ``ensemble`` (the
    models' averaged probabilities). For a global method every client holds the same model, so the
    three agree (up to the composite BN of FedBN/SiloBN, which differ per client)."""
    selected = selection.merged("models")
    models = []
    for client in clients:
        model = client.eval_model()
        model.load_state_dict(selected[client.name])
        models.append(model)
    out = {}
    for cohort, split in cohorts.items():
        per_model = {c.name: evaluate(m, split, cfg, device) for c, m in zip(clients, models)}
        mean = {k: float(np.mean([s[k] for s in per_model.values()])) for k in next(iter(per_model.values()))}
        out[cohort] = {"mean": mean, "ensemble": evaluate_ensemble(models, split, cfg, device), "per_model": per_model}
    return out


def selection_open(cfg: RunConfig, round_index: int) -> bool:
    """Whether round ``round_index`` may be selected: one of the last ``selection_window`` x rounds
    (PRR-FL's code: ``a_iter >= 0.8 iters``, i.e. the last 10 of 50 rounds)."""
    window = max(1, round(cfg.selection_window * cfg.rounds))
    return round_index > cfg.rounds - window


def curve_every(cfg: RunConfig) -> int:
    """Test curves every this many rounds: the configured value, else ~50 points per run."""
    return cfg.curve_every or max(1, cfg.rounds // 50)


def run_training(cfg: RunConfig | dict, out_dir: Path, device: str = "auto", threads: int | None = None, progress: bool = True, checkpoint_every: int = 1, data_workers: int = 0, checkpoint_every_seconds: float = 0) -> dict:
    """Train one run into ``out_dir``. A folder this call created is removed again if it fails
    before writing anything (no empty output folders). ``device``, ``threads``, ``progress``,
    ``checkpoint_every`` and ``data_workers`` (threads that read batches ahead; 0: the training
    thread reads them) say how to run, not what: they are not part of the run config, its
    fingerprint or final.json (changing them re-runs nothing and keeps a checkpoint usable)."""
    if checkpoint_every < 1:
        raise ConfigError(f"checkpoint_every: expected an integer >= 1, got {checkpoint_every}")
    if not checkpoint_every_seconds >= 0:
        raise ConfigError(f"checkpoint_every_seconds: expected a number of seconds >= 0, got {checkpoint_every_seconds}")
    if not isinstance(data_workers, int) or isinstance(data_workers, bool) or data_workers < 0:
        raise ConfigError(f"data_workers: expected an integer >= 0, got {data_workers!r}")
    # One writer per run folder (fl/runlock.py): a second train on it stops here, having written nothing.
    with new_folder(out_dir) as out_dir, run_folder_lock(out_dir):
        reader = BatchReader(data_workers) if data_workers else None
        try:
            return _run_training(cfg, out_dir, device, threads, progress, checkpoint_every, reader=reader, checkpoint_every_seconds=checkpoint_every_seconds)
        finally:
            if reader is not None:
                reader.close()


def check_selection_defined(clients, cfg: RunConfig) -> None:
    """Before training: every client's validation split must define the selection metric (e.g.
    ``auc_macro`` needs two classes, ``dice_fg`` some foreground). Scored on the truth itself, so
    whatever a model predicts later, its score is a number."""
    for client in clients:
        split = client.data.val
        meter = METERS[cfg.kind](cfg.model.num_classes)
        for start in range(0, len(split), cfg.eval_batch):
            rows = split.rows[start : start + cfg.eval_batch]
            target = torch.from_numpy(np.asarray(split.labels[rows]).astype(np.int64))
            perfect = torch.nn.functional.one_hot(target, cfg.model.num_classes).movedim(-1, 1).float()
            meter.update(perfect, target, split.groups[start : start + cfg.eval_batch], 0.0)
        if math.isnan(meter.compute().get(cfg.selection_metric, 0.0)):
            classes = sorted(np.unique(np.asarray(split.labels[split.rows])).tolist())
            raise ConfigError(
                f"client {client.name}: its validation split ({len(split)} samples, classes {classes}) cannot define "
                f"selection_metric {cfg.selection_metric!r}; choose another selection_metric or a split with every class in validation"
            )


def check_batch_norm_batches(model: torch.nn.Module, clients, cfg: RunConfig) -> None:
    """BatchNorm1d cannot normalise a batch of one sample: refuse a train split whose last batch
    would hold one, naming the client (instead of a shape error in the middle of round 1)."""
    if not any(isinstance(m, torch.nn.BatchNorm1d) for m in model.modules()):
        return
    for client in clients:
        if len(client.data.train) % cfg.batch_size == 1 and not cfg.drop_last:
            raise ConfigError(
                f"client {client.name}: its train split has {len(client.data.train)} samples, so with batch_size {cfg.batch_size} "
                f"the last batch of every epoch holds 1 sample, which the model's BatchNorm1d cannot train on; change batch_size"
            )


def _run_training(cfg: RunConfig | dict, out_dir: Path, device: str, threads: int | None, progress: bool, checkpoint_every: int, reader: BatchReader | None = None, checkpoint_every_seconds: float = 0) -> dict:
    cfg = RunConfig.from_dict(cfg)
    method = load_method(cfg.method, cfg.method_module)
    # The method's declared defaults fill any hyperparameter the config leaves out; unknown ones fail.
    cfg = cfg.replace(method_params=merge_params(cfg.method, cfg.method_params, f"run config of {cfg.run}: method_params", cfg.method_module))
    checkpoint_path = out_dir / "checkpoint.pt"
    if threads:
        torch.set_num_threads(threads)
    device, _claim = pick_device(device)  # the claim holds the GPU slot until this process ends
    seed_everything(cfg.seed, device)
    faults.arm()

    data = load_clients(Path(cfg.data.store), Path(cfg.data.split), list(cfg.clients), cfg.truncate_to_smallest, reader)
    check_image_size(data, cfg.model, Path(cfg.data.store))
    cohorts = load_test_only(Path(cfg.data.store), Path(cfg.data.split), list(cfg.ood_clients), reader) if cfg.ood_clients else {}
    names = [c.name for c in data]
    model = build_model(cfg.model)  # one initialisation, shared by every client
    server = method.Server(cfg, model, len(data))
    clients = [method.Client(cfg, i, d, copy.deepcopy(model), client_generator(cfg.seed, i), device) for i, d in enumerate(data)]
    metric = cfg.selection_metric
    per_client = {"auto": method.PERSONALIZED, "per_client": True, "pooled": False}[cfg.selection_scope]
    selection = Selection(names, metric, per_client=per_client)
    check_selection_defined(clients, cfg)
    check_batch_norm_batches(model, clients, cfg)
    fingerprints = (cfg.fingerprint(), data_digest(Path(cfg.data.store), Path(cfg.data.split), [*cfg.clients, *cfg.ood_clients]))

    history_log = ckpt_io.HistoryLog(history_file(out_dir))
    last_round, history = restore(checkpoint_path, *fingerprints, server, clients, selection, history_log)
    saved_version = selection.version  # the selection file the last checkpoint refers to
    remove_stale_files(out_dir, saved_version)

    rounds = cfg.rounds
    bar = Progress(rounds, f"{cfg.task}/{cfg.run}/seed{cfg.seed}", log, unit="round", initial=last_round, interval=0.0, enabled=progress)
    last_saved = time.monotonic()

    def round_end(round_index: int, val: dict, test: dict) -> None:
        nonlocal saved_version, last_saved
        mean_val = sum(v[metric] for v in val.values()) / len(val)
        mean_test = f", mean test {sum(t[metric] for t in test.values()) / len(test):.4f}" if test else ""
        bar.update(1, f"mean val {metric} {mean_val:.4f}{mean_test}")
        # Every checkpoint_every rounds, once checkpoint_every_seconds have passed since the last one
        # (a fast GPU job need not spend its time writing), and after the last round.
        due = round_index % checkpoint_every == 0 and time.monotonic() - last_saved >= checkpoint_every_seconds
        if due or round_index == rounds:
            saved_version = save_state(out_dir, checkpoint_path, round_index, fingerprints, server, clients, selection, history, saved_version, history_log)
            last_saved = time.monotonic()
            faults.reached("round_end")

    # The one round loop of the project (fl/transport.py), here over the clients of this process.
    # The sites hold no kept models of their own: ``keep`` hands the evaluated model to the
    # ``Selection``, the one copy (final_test and ood_test read it there).
    transport = InProcessTransport([Site(cfg, client, device, hold_kept=False) for client in clients])
    if last_round == 0:
        history_log.reset()
        transport.start([server.package(index, 0) for index in range(len(clients))])
    run_rounds(cfg, server, transport, names, selection, history, last_round + 1, round_end)
    bar.close()
    test, flags, counts = final_test(selection, clients, cfg, device)
    ood = ood_test(selection, clients, cohorts, cfg, device) if cohorts else None
    return write_outputs(cfg, out_dir, names, selection, test, history, checkpoint_path, ood, flags=flags, class_counts=counts)


def save_npz_atomic(arrays: dict[str, np.ndarray], path: Path) -> None:
    """``client|image``, ``client|label``, ``client|pred`` arrays, readable without torch."""
    with atomic_file(path) as handle:
        np.savez_compressed(handle, **arrays)


def write_outputs(cfg: RunConfig, out_dir: Path, names: list[str], selection: Selection, test: dict[str, dict], history: list[dict], checkpoint_path: Path, ood: dict | None = None, flags: dict | None = None, class_counts: dict | None = None) -> dict:
    best_models = {}
    for entry in selection.best.values():
        best_models.update(entry["models"])
    # A federated site may keep its model to itself (node config share-model=false): listed as withheld.
    shared = {n: best_models[n] for n in names if best_models[n] is not None}
    withheld = {"withheld": [n for n in names if n not in shared]} if len(shared) < len(names) else {}
    with writing(out_dir / "model_best.pt", None):
        ckpt_io.save_atomic({"clients": names, "models": compact_models(shared) if shared else None, **withheld}, out_dir / "model_best.pt")
    predictions = {f"{n}|{k}": v.numpy() for entry in selection.best.values() for n, preds in entry["predictions"].items() for k, v in preds.items()}
    with writing(out_dir / "predictions.npz", None):
        save_npz_atomic(predictions, out_dir / "predictions.npz")
    with writing(out_dir / "history.csv", None):
        atomic_write_text(out_dir / "history.csv", pd.DataFrame(history).to_csv(index=False))
    rounds_selected = {key: entry["round"] for key, entry in selection.best.items()}
    final = {
        "task": cfg.task,
        "method": cfg.method,
        "run": cfg.run,
        "seed": cfg.seed,
        "clients": names,
        "client_labels": list(cfg.labels),
        "synthetic": cfg.data.synthetic,
        "primary_metric": cfg.selection_metric,
        "selection": {
            "split": "val",
            "metric": cfg.selection_metric,
            "per_client": selection.per_client,
            "best_round": rounds_selected.get("all", rounds_selected),
            "rounds": cfg.rounds,
        },
        "test": test,
        "val": selection.merged("val"),
        "metric_descriptions": {m: METRIC_DESCRIPTIONS[m] for m in next(iter(test.values()))},
        # {client: {"collapsed" | "no_foreground": why}}: test scores that measure no model (empty: none)
        "flags": {n: flags[n] for n in names if n in (flags or {})},
        # {client: {"samples", "predicted", "truth"}}: pixels (segmentation) or samples per class on test
        "test_class_counts": {n: class_counts[n] for n in names if n in (class_counts or {})},
        "config": cfg.to_dict(),
    }
    if ood is not None:
        final["ood"] = ood  # {cohort: {"mean", "ensemble", "per_model": {client: scores}}}
    with writing(out_dir / "final.json", None):
        atomic_write_text(out_dir / "final.json", json.dumps(final, indent=2, sort_keys=True) + "\n")
    # Finished: the outputs above replace the checkpoints.
    for path in checkpoint_files(checkpoint_path):
        path.unlink(missing_ok=True)
    remove_stale_files(out_dir, selection_version=0)
    return final
