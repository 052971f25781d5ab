"""Rows of a table that are one computation, and why: the sentence the report prints under the table.

FedNova (``methods/fednova.py``) weighs client i's update by tau_eff p_i / ||a_i||_1, where the
normalizer ||a_i||_1 depends only on the client's number of local steps (and the optimizer, the same
for every client). When every client takes the same number of local steps per round (prostate and
Camelyon17 truncate every client to the smallest training set), every normalizer is the same, the
weights are FedAvg's p_i and the server forms FedAvg's weighted average: the two runs are the same
computation, bit for bit (``tests/test_fednova.py``). The table's generic tie note
(``report.flags``) says that the rows cannot be told apart; this says why. It is computed, never
assumed: the sentence appears only where every test score of every client and seed is identical and
the run configs give every client the same number of local steps.

This module must stay light (no torch): report jobs import it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from fedmedbench.data.store import read_split_csv


def identical_test_scores(finals_a: Iterable[Mapping], finals_b: Iterable[Mapping]) -> bool:
    """Both runs have the same seeds, and per seed every client's every test score is equal (==)."""
    by_seed_a = {f.get("seed"): f for f in finals_a}
    by_seed_b = {f.get("seed"): f for f in finals_b}
    if not by_seed_a or set(by_seed_a) != set(by_seed_b):
        return False
    return all(
        by_seed_a[s].get("test") is not None and by_seed_a[s].get("test") == by_seed_b[s].get("test") for s in by_seed_a
    )


def local_steps_per_round(final: Mapping) -> dict[str, int] | None:
    """Per client, the optimizer steps of one round as the run config and its split file say
    (``local_epochs`` x batches of ``batch_size``, the train split truncated to the smallest with
    ``truncate_to_smallest``, the last partial batch dropped with ``drop_last``); None without them."""
    cfg = final.get("config") or {}
    path = (cfg.get("data") or {}).get("split")
    clients = list(final.get("clients") or [])
    if not path or not clients or not cfg.get("batch_size") or not cfg.get("local_epochs"):
        return None
    try:
        split = read_split_csv(path)
    except (OSError, ValueError):
        return None
    train = split[split["split"] == "train"].groupby("client").size()
    sizes = {c: int(train.get(c, 0)) for c in clients}
    if cfg.get("truncate_to_smallest"):
        smallest = min(sizes.values())
        sizes = dict.fromkeys(sizes, smallest)
    batch = int(cfg["batch_size"])
    per_epoch = {
        c: (n // batch if cfg.get("drop_last") and n >= batch else math.ceil(n / batch)) for c, n in sizes.items()
    }
    return {c: int(cfg["local_epochs"]) * k for c, k in per_epoch.items()}


def fednova_fedavg_note(finals: Iterable[Mapping], labels: Mapping[str, str] | None = None) -> list[str]:
    """One sentence per (FedNova run, FedAvg run) of ``finals`` (one table's) that are identical on
    every site and seed while every client takes the same number of local steps; [] otherwise."""
    labels = labels or {}
    finals = list(finals)
    by_run: dict[str, list[Mapping]] = {}
    for final in finals:
        by_run.setdefault(str(final.get("run") or final.get("method")), []).append(final)
    method = {run: members[0].get("method", run) for run, members in by_run.items()}
    notes = []
    for nova in [r for r in by_run if method[r] == "fednova"]:
        for avg in [r for r in by_run if method[r] == "fedavg"]:
            if not identical_test_scores(by_run[nova], by_run[avg]):
                continue
            steps = [local_steps_per_round(f) for f in by_run[nova]]
            counts = {n for s in steps if s for n in s.values()}
            if any(s is None for s in steps) or len(counts) != 1:
                continue  # identical for another reason than the one we can state: the tie note alone
            notes.append(
                f"{labels.get(nova, nova)} and {labels.get(avg, avg)} are identical on every site and seed, as they must be: "
                f"every client takes the same number of local steps per round ({counts.pop()}), so every client's FedNova "
                f"normalizer is the same, its weights τ_eff p_i / ‖a_i‖₁ reduce to FedAvg's p_i, and its update is "
                f"FedAvg's weighted average, bit for bit (methods/fednova.py)."
            )
    return notes
