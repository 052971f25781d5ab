"""The run folder's files: the checkpoint (``checkpoint.pt`` and its ``.prev``), the selected models
(``selection-v<version>.pt``) and the history log beside it, written each checkpointed round and
read back on resume; then the finished run's outputs (``history.csv``, ``final.json``,
``model_best.pt``, ``predictions.npz``, and ``run_config.json``: the resolved run config, for a
federated rerun with ``flwr run``), which replace them.

Below both the engine (``fl/engine.py``) and the server side of the round protocol
(``fl/rounds.serve``): a run folder is the same whichever of them trained it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fedmedbench.errors import DataError
from fedmedbench.files import atomic_file, atomic_write_text
from fedmedbench.finals import write_final
from fedmedbench.fl import checkpoint
from fedmedbench.fl.history_log import HistoryLog
from fedmedbench.fl.seeding import global_rng_state, set_global_rng_state
from fedmedbench.fl.selection import Selection
from fedmedbench.metrics import METRIC_DESCRIPTIONS, cohort_flag_texts
from fedmedbench.runconfig import RunConfig

# The engine's logger: resuming, or ignoring a checkpoint, is a line of the training's log, as before.
log = logging.getLogger("fedmedbench.engine")


def selection_file(out_dir: Path, version: int) -> Path:
    return out_dir / f"selection-v{version}.pt"


def history_file(out_dir: Path) -> Path:
    """The checkpointed history rows (``HistoryLog``), beside ``checkpoint.pt``."""
    return out_dir / "checkpoint-history.jsonl"


def checkpoint_files(checkpoint_path: Path) -> tuple[Path, Path, Path]:
    """What resuming reads besides the selection files; removed once the outputs are written."""
    return checkpoint_path, checkpoint.previous(checkpoint_path), history_file(checkpoint_path.parent)


def restore(
    checkpoint_path: Path,
    fingerprint: str,
    data_fingerprint: str,
    server,
    clients,
    selection: Selection,
    history_log: HistoryLog | None = None,
) -> tuple[int, list[dict]]:
    """Resume state from the checkpoint (or, if it is damaged, the previous one): (last round, history).
    (0, []) when there is nothing usable, and training starts from scratch. A checkpoint of another
    configuration, or of data rebuilt since it was written (``data_digest``), is not used. The
    history rows are those of the checkpoint's position in the history log; ``history_log``, when
    given, continues from there."""
    reader = history_log or HistoryLog(history_file(checkpoint_path.parent))
    for candidate in (checkpoint_path, checkpoint.previous(checkpoint_path)):
        if not candidate.exists():
            continue
        try:
            saved = checkpoint.load(candidate)
            if saved["config_hash"] != fingerprint:
                log.warning("ignoring %s: it was written for a different configuration", candidate)
                return 0, []
            if saved.get("data_digest") != data_fingerprint:
                log.warning(
                    "ignoring %s: the data it was trained on changed since (split file or store rebuilt); training starts afresh",
                    candidate,
                )
                return 0, []
            version = saved["selection"]["version"]
            heavy = checkpoint.load(selection_file(candidate.parent, version)) if version else {}
            history = reader.read(saved["history_log"])
        except (checkpoint.CorruptCheckpoint, FileNotFoundError) as err:
            log.warning("%s; falling back to the previous checkpoint or a fresh start", err)
            continue
        server.load_state_dict(saved["server"])
        for client, state in zip(clients, saved["clients"]):
            client.load_state_dict(state)
        selection.load_state_dict(saved["selection"], heavy)
        set_global_rng_state(saved["rng"])
        if history_log is not None:
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


def save_state(
    out_dir: Path,
    checkpoint_path: Path,
    round_index: int,
    fingerprints: tuple[str, str],
    server,
    clients,
    selection: Selection,
    history: list[dict],
    previous_version: int,
    history_log: HistoryLog,
) -> int:
    """The checkpoint of this round. The selected models live in ``selection-v<version>.pt``, written
    only when the selection changed; kept are the files of this checkpoint and of its ``.prev``
    (``previous_version``). The history rows since the last checkpoint are appended to
    ``history_log`` (fsynced), and the checkpoint records the log's position: its cost does not grow
    with the rounds. Returns this checkpoint's version (the next call's ``previous_version``)."""
    current = selection_file(out_dir, selection.version)
    if selection.version and not current.exists():
        with writing(current, round_index):
            checkpoint.save(selection.heavy_state(), current)
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
            checkpoint.save(state, checkpoint_path)
    except DataError:
        if selection.version != previous_version:
            current.unlink(missing_ok=True)  # no checkpoint refers to it
        raise
    keep = {current, selection_file(out_dir, previous_version)}
    for path in out_dir.glob("selection-v*.pt"):
        if path not in keep:
            path.unlink(missing_ok=True)
    return selection.version


def compact_models(models: dict[str, dict]) -> dict:
    """Store the first client's state once and, per other client, only the tensors that differ
    (for a global model that is nothing; with FedBN only the BN tensors)."""
    names = list(models)
    base = models[names[0]]
    diffs = {n: {k: v for k, v in models[n].items() if not torch.equal(v, base[k])} for n in names[1:]}
    return {"base_client": names[0], "base": base, "diffs": diffs}


def save_npz_atomic(arrays: dict[str, np.ndarray], path: Path) -> None:
    """``client|image``, ``client|label``, ``client|pred`` arrays, readable without torch."""
    with atomic_file(path) as handle:
        np.savez_compressed(handle, **arrays)


def write_run_config(cfg: RunConfig, out_dir: Path) -> Path:
    """``run_config.json``: the run's resolved config (final.json's ``config``), as a file that
    ``flwr run ... --run-config 'run-config="<it>" ...'`` takes (docs/federation.md)."""
    path = out_dir / "run_config.json"
    with writing(path, None):
        atomic_write_text(path, json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def write_outputs(
    cfg: RunConfig,
    out_dir: Path,
    names: list[str],
    selection: Selection,
    test: dict[str, dict],
    history: list[dict],
    checkpoint_path: Path,
    ood: dict | None = None,
    flags: dict | None = None,
    class_counts: dict | None = None,
) -> dict:
    write_run_config(cfg, out_dir)  # before final.json, which marks the folder complete
    best_models = {}
    for entry in selection.best.values():
        best_models.update(entry["models"])
    # A federated site may keep its model to itself (node config share-model=false): listed as withheld.
    shared = {n: best_models[n] for n in names if best_models[n] is not None}
    withheld = {"withheld": [n for n in names if n not in shared]} if len(shared) < len(names) else {}
    with writing(out_dir / "model_best.pt", None):
        checkpoint.save_plain(
            {"clients": names, "models": compact_models(shared) if shared else None, **withheld},
            out_dir / "model_best.pt",
        )
    predictions = {
        f"{n}|{k}": v.numpy()
        for entry in selection.best.values()
        for n, preds in entry["predictions"].items()
        for k, v in preds.items()
    }
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
        # {client: {"collapsed" | "no_foreground": why}}: test scores that measure no model (empty: none),
        # then each test-only cohort's, naming which of its scores (the ensemble, a client's model)
        "flags": {
            **{n: flags[n] for n in names if n in (flags or {})},
            **{c: cohort_flag_texts(o["flags"]) for c, o in (ood or {}).items() if o.get("flags")},
        },
        # {client: {"samples", "predicted", "truth"}}: pixels (segmentation) or samples per class on test
        "test_class_counts": {n: class_counts[n] for n in names if n in (class_counts or {})},
        "config": cfg.to_dict(),
    }
    if ood is not None:
        final["ood"] = ood  # {cohort: {"mean", "ensemble", "per_model": {client: scores}}}
    with writing(out_dir / "final.json", None):
        final = write_final(out_dir / "final.json", final)  # with its digest, which the report jobs check
    # Finished: the outputs above replace the checkpoints.
    for path in checkpoint_files(checkpoint_path):
        path.unlink(missing_ok=True)
    remove_stale_files(out_dir, selection_version=0)
    return final
