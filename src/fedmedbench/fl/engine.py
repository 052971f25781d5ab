"""A training run in this process: the device, the pre-flight checks, then the round loop
(train -> aggregate -> distribute -> evaluate -> checkpoint) for all methods.

The engine knows nothing about any particular method: it finds ``fedmedbench.methods.<name>`` by
name (``fedmedbench.registry``) and calls its hooks, through ``fl/hooks.py``, so a failing hook is
one line naming the method, hook, round and client. Model selection uses the validation split only
(mean over clients for a global model, per client for personalized methods); the test split is
evaluated every round for the curves and reported at the selected round.

The rounds themselves are ``fl/rounds.run_rounds`` over the clients of this process; what the
engine shares with the server side of a federation lies below both: scoring (``fl/evaluation.py``),
the selection (``fl/selection.py``) and the run folder's checkpoints and outputs
(``fl/runfolder.py``).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from pathlib import Path

import numpy as np
import torch

from fedmedbench import faults
from fedmedbench.errors import ConfigError
from fedmedbench.files import new_folder
from fedmedbench.fl.data import BatchReader, check_image_size, data_digest, load_clients, load_test_only
from fedmedbench.fl.evaluation import final_test, ood_test
from fedmedbench.fl.history_log import HistoryLog
from fedmedbench.fl.hooks import load_method  # the method's Server and Client, their failures named
from fedmedbench.fl.placement import pick_device
from fedmedbench.fl.rounds import InProcessTransport, Site, run_rounds
from fedmedbench.fl.runfolder import history_file, remove_stale_files, restore, save_state, write_outputs
from fedmedbench.fl.runlock import run_folder_lock
from fedmedbench.fl.seeding import client_generator, seed_everything
from fedmedbench.fl.selection import Selection
from fedmedbench.metrics import METERS
from fedmedbench.models import build_model
from fedmedbench.progress import Progress
from fedmedbench.registry import merge_params
from fedmedbench.runconfig import RunConfig

log = logging.getLogger("fedmedbench.engine")


def run_training(
    cfg: RunConfig | dict,
    out_dir: Path,
    device: str = "auto",
    threads: int | None = None,
    progress: bool = True,
    checkpoint_every: int = 1,
    data_workers: int = 0,
    checkpoint_every_seconds: float = 0,
) -> dict:
    """Train one run into ``out_dir``. A folder this call created is removed again if it fails
    before writing anything (no empty output folders). ``device``, ``threads``, ``progress``,
    ``checkpoint_every`` and ``data_workers`` (threads that read batches ahead; 0: the training
    thread reads them) say how to run, not what: they are not part of the run config, its
    fingerprint or final.json (changing them re-runs nothing and keeps a checkpoint usable)."""
    if checkpoint_every < 1:
        raise ConfigError(f"checkpoint_every: expected an integer >= 1, got {checkpoint_every}")
    if not checkpoint_every_seconds >= 0:
        raise ConfigError(
            f"checkpoint_every_seconds: expected a number of seconds >= 0, got {checkpoint_every_seconds}"
        )
    if not isinstance(data_workers, int) or isinstance(data_workers, bool) or data_workers < 0:
        raise ConfigError(f"data_workers: expected an integer >= 0, got {data_workers!r}")
    # One writer per run folder (fl/runlock.py): a second train on it stops here, having written nothing.
    with new_folder(out_dir) as out_dir, run_folder_lock(out_dir):
        reader = BatchReader(data_workers) if data_workers else None
        try:
            return _run_training(
                cfg,
                out_dir,
                device,
                threads,
                progress,
                checkpoint_every,
                reader=reader,
                checkpoint_every_seconds=checkpoint_every_seconds,
            )
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


def _run_training(
    cfg: RunConfig | dict,
    out_dir: Path,
    device: str,
    threads: int | None,
    progress: bool,
    checkpoint_every: int,
    reader: BatchReader | None = None,
    checkpoint_every_seconds: float = 0,
) -> dict:
    cfg = RunConfig.from_dict(cfg)
    method = load_method(cfg.method, cfg.method_module)
    # The method's declared defaults fill any hyperparameter the config leaves out; unknown ones fail.
    cfg = cfg.replace(
        method_params=merge_params(
            cfg.method, cfg.method_params, f"run config of {cfg.run}: method_params", cfg.method_module
        )
    )
    checkpoint_path = out_dir / "checkpoint.pt"
    if threads:
        torch.set_num_threads(threads)
    device, _claim = pick_device(device)  # the claim holds the GPU slot until this process ends
    seed_everything(cfg.seed, device)
    faults.arm()

    data = load_clients(Path(cfg.data.store), Path(cfg.data.split), list(cfg.clients), cfg.truncate_to_smallest, reader)
    check_image_size(data, cfg.model, Path(cfg.data.store))
    cohorts = (
        load_test_only(Path(cfg.data.store), Path(cfg.data.split), list(cfg.ood_clients), reader)
        if cfg.ood_clients
        else {}
    )
    names = [c.name for c in data]
    model = build_model(cfg.model)  # one initialisation, shared by every client
    server = method.Server(cfg, model, len(data))
    clients = [
        method.Client(cfg, i, d, copy.deepcopy(model), client_generator(cfg.seed, i), device)
        for i, d in enumerate(data)
    ]
    metric = cfg.selection_metric
    per_client = {"auto": method.PERSONALIZED, "per_client": True, "pooled": False}[cfg.selection_scope]
    selection = Selection(names, metric, per_client=per_client)
    check_selection_defined(clients, cfg)
    check_batch_norm_batches(model, clients, cfg)
    fingerprints = (
        cfg.fingerprint(),
        data_digest(Path(cfg.data.store), Path(cfg.data.split), [*cfg.clients, *cfg.ood_clients]),
    )

    history_log = HistoryLog(history_file(out_dir))
    last_round, history = restore(checkpoint_path, *fingerprints, server, clients, selection, history_log)
    saved_version = selection.version  # the selection file the last checkpoint refers to
    remove_stale_files(out_dir, saved_version)

    rounds = cfg.rounds
    bar = Progress(
        rounds,
        f"{cfg.task}/{cfg.run}/seed{cfg.seed}",
        log,
        unit="round",
        initial=last_round,
        interval=0.0,
        enabled=progress,
    )
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
            saved_version = save_state(
                out_dir,
                checkpoint_path,
                round_index,
                fingerprints,
                server,
                clients,
                selection,
                history,
                saved_version,
                history_log,
            )
            last_saved = time.monotonic()
            faults.reached("round_end")

    # The one round loop of the project (fl/rounds.py), here over the clients of this process.
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
    return write_outputs(
        cfg, out_dir, names, selection, test, history, checkpoint_path, ood, flags=flags, class_counts=counts
    )
