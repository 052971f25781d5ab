"""The round loop, over a transport: the same loop whether the clients live in this process or
behind Flower's SuperNodes (``fedmedbench.federation``).

A round, seen from the server: every site trains and replies (``train``); the method's server may
ask a second question (``query`` -> ``answer``); it aggregates; every site receives its package and
evaluates the model it would hand over on val (and test on curve rounds) (``evaluate``); when the
validation scores improve a selection, the covered sites keep that model (``keep``). A transport
may defer a keep to its next message to the site (Flower's: ``keep`` sends nothing; the next
round's ``train``, or ``final``, carries it and the site applies it first, so a snapshot of round
r always holds the model kept at r; a restarted server's ``resume`` names the sites its restored
selection kept at its checkpoint's round, as their state file may not hold it yet). After the last
round each site scores its kept model on its test split (``final``); then each test-only cohort (an
unseen institution, ``ood_clients``: never set up, never trained or evaluated) scores every site's
kept model on its own test rows (``ood``), as the engine's ``evaluation.ood_test``.

``Site`` is one client's side of it and holds everything that client keeps between rounds (the
method's ``Client`` with its personal models and optimizer state, the kept model); its
``state_dict`` is what a stateless Flower ClientApp stores in the node's own folder between messages.
``Cohort`` is a test-only cohort's side: it holds only its test rows.
``InProcessTransport`` calls the sites directly (the engine's simulation), each with its own copy
of what crosses (``own_copy``: packages, queries, replies, answers), as Flower's serialized messages
give one; ``run_rounds`` is the loop, and nothing in it knows where the sites are. The loop, the
sites and the transports import no method and no Flower.
"""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Callable, Protocol

import torch

from fedmedbench import faults
from fedmedbench.errors import ConfigError, FedmedbenchError
from fedmedbench.fl import runfolder
from fedmedbench.fl.data import data_digest
from fedmedbench.fl.evaluation import (
    check_finite,
    curve_every,
    evaluate,
    evaluate_meter,
    local_epoch_probe,
    predict_samples,
    score_cohort,
    warn_cohort_flags,
)
from fedmedbench.fl.history_log import HistoryLog
from fedmedbench.fl.hooks import load_method
from fedmedbench.fl.seeding import seed_everything
from fedmedbench.fl.selection import Selection, selection_open
from fedmedbench.models import build_model
from fedmedbench.progress import Progress


class SiteError(FedmedbenchError):
    """A site refused or failed a step (one line naming the site and round)."""


def detached(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A host copy of every tensor, independent of the model: one copy each (``.cpu()`` of a device
    tensor is already a copy, so ``.cpu().clone()`` copied a kept model twice on a GPU)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def own_copy(value):
    """``value`` as a site receives it over a wire: its own tensors (a clone each, detached, on the same
    device, with the same dtype and layout: the same numbers), in containers of the same types (a
    state dict's ``_metadata`` kept), other values deep-copied. What a method then edits in place is
    its own copy, as on Flower's runtime, where every message is serialized."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        out = copy.copy(value)  # the same kind of dict, with its attributes
        for key, item in value.items():
            out[key] = own_copy(item)
        return out
    if type(value) in (list, tuple):
        return type(value)(own_copy(item) for item in value)
    return copy.deepcopy(value)


class Site:
    """One client's side of the round protocol, around the method's ``Client``."""

    def __init__(self, cfg, client, device: torch.device, hold_kept: bool = True):
        self.cfg, self.client, self.device = cfg, client, device
        self.name = client.name
        # The model kept at the last selection that covered this site: {"round", "model", "predictions"}.
        # ``hold_kept=False`` (the engine): the site keeps nothing itself; the caller's ``Selection``
        # holds the one copy (a paper-scale run keeps one model per client, not two).
        self.kept: dict | None = None
        self.hold_kept = hold_kept
        self.cfg_json, self.train_rows = None, None  # how a Flower site rebuilds itself (federation.clientapp)
        self.round_done: int | None = None  # a Flower site's state file: the round whose end it holds (None: mid-round)

    def start(self, package) -> None:
        """Before round 1: the server's initial package (round 0)."""
        self.client.receive(package)

    def train(self, round_index: int) -> tuple[dict, float, list[dict]]:
        """Local training: (reply, mean training loss, history rows of the local-epoch probe)."""
        client, rows = self.client, []
        client.round_index = round_index
        if self.cfg.local_epoch_curve:
            client.epoch_probe = local_epoch_probe(self.cfg, self.device, rows)
            client.epoch_probe(client, 0)  # right after receiving the server's model
        loss = client.train(self.cfg.local_epochs)
        check_finite(round_index, client.name, "local model", loss, client.model.state_dict())
        return client.reply(), loss, rows

    def answer(self, query):
        return self.client.answer(query)

    def evaluate(self, round_index: int, package, with_test: bool) -> tuple[dict, dict | None]:
        """Receive the round's package, then score the model this site would hand over: (val, test)."""
        self.client.receive(package)
        model = self.client.eval_model()
        check_finite(round_index, self.name, "evaluated model", None, model.state_dict())
        val = evaluate(model, self.client.data.val, self.cfg, self.device)
        test = evaluate(model, self.client.data.test, self.cfg, self.device) if with_test else None
        return val, test

    def keep(self, round_index: int) -> tuple[dict, dict]:
        """A selection covering this site improved: keep the evaluated model and its qualitative
        predictions (the inputs of ``Selection.record``). Returns (model state, predictions)."""
        model = self.client.eval_model()
        state = detached(model.state_dict())
        predictions = predict_samples(model, self.client.data.test, self.cfg, self.device)
        if self.hold_kept:  # the same tensors as returned (and recorded by the Selection): no second copy
            self.kept = {"round": round_index, "model": state, "predictions": predictions}
        return state, predictions

    def final(self) -> dict:
        """The kept model's test scores (``evaluation.final_test`` for this site), with the kept
        model and predictions: {"test", "flags", "counts", "model", "predictions", "round"}."""
        if self.kept is None:
            raise SiteError(f"site {self.name}: no model was kept (no selection covered it); nothing to test")
        model = self.client.eval_model()
        model.load_state_dict(self.kept["model"])
        out = {
            "model": self.kept["model"],
            "predictions": self.kept["predictions"],
            "round": self.kept["round"],
            "flags": {},
            "counts": {},
        }
        meter = evaluate_meter(
            model, self.client.data.test, self.cfg, self.device
        )  # scores, predicted classes, degeneracy flags
        out["test"], out["counts"] = meter.compute(), meter.class_counts()
        out["flags"] = meter.flags() or {}
        return out

    # --- what a stateless ClientApp stores between messages -------------------------------------
    def state_dict(self) -> dict:
        return {"client": self.client.state_dict(), "kept": self.kept}

    def load_state_dict(self, state: dict) -> None:
        self.client.load_state_dict(state["client"])
        self.kept = state["kept"]


class Cohort:
    """A test-only cohort's side (``ood_clients``: an unseen institution with test rows only). It never
    trains; after the run it scores every site's selected model on its own test rows, exactly as the
    engine's ``evaluation.ood_test`` (per model, their mean, the ensemble)."""

    def __init__(self, cfg, name: str, split, device: torch.device):
        self.cfg, self.name, self.split, self.device = cfg, name, split, device

    def score(self, models: dict[str, dict]) -> dict:
        """``models``: {site: its selected evaluated model's state}, in the run's client order. Each is
        loaded into the run's network (``cfg.model``, on this cohort's device) in full: the engine
        loads the same state into the client's evaluated model, which for every method a test-only
        cohort is run with in this project is that network (a method whose evaluated model wraps
        it, e.g. HarmoFL's amplitude normalisation, is refused here in one line)."""
        if not models:
            raise SiteError(f"cohort {self.name}: no model to score")
        # One initialisation, copied per site: its weights are replaced in full by the loads below.
        network = build_model(self.cfg.model)
        nets = {}
        for site, state in models.items():
            net = copy.deepcopy(network)
            net = (
                net.to(self.device, memory_format=torch.channels_last)
                if self.cfg.precision == "bf16"
                else net.to(self.device)
            )
            try:
                net.load_state_dict(state)
            except RuntimeError as err:
                first = " ".join(str(err).split())[:300]
                raise SiteError(
                    f"cohort {self.name}: site {site}'s selected model is not the run's network {self.cfg.model.name!r} ({first}); a test-only cohort scores that network only; refused"
                ) from None
            nets[site] = net
        return score_cohort(nets, self.split, self.cfg, self.device)


class Transport(Protocol):
    """How the server's loop reaches the sites; every list is in the run's client order."""

    cohort_names: list[str]  # the test-only cohorts it serves (``ood``), in ``ood_clients`` order

    def start(self, packages: list) -> None: ...

    def train(self, round_index: int) -> list[tuple[dict, float, list[dict]]]: ...

    def answer(self, round_index: int, queries: list) -> list: ...

    def evaluate(self, round_index: int, packages: list, with_test: bool) -> list[tuple[dict, dict | None]]: ...

    def keep(self, round_index: int, names: list[str]) -> dict[str, tuple[dict, dict]]: ...

    def final(self) -> dict[str, dict]: ...

    def ood(self, models: dict[str, dict]) -> dict[str, dict]: ...

    def snapshot(self, round_index: int) -> None: ...

    def resume(self, round_index: int, packages: list, kept: dict[str, int] | None = None) -> None: ...

    def data_fingerprint(self) -> str: ...


class InProcessTransport:
    """Every site in this process, called in client order (the engine's simulation); ``cohorts``: the
    run's test-only cohorts, in ``ood_clients`` order."""

    def __init__(self, sites: list[Site], cohorts: list[Cohort] | None = None):
        self.sites = sites
        self.cohorts = list(cohorts or [])
        self.cohort_names = [cohort.name for cohort in self.cohorts]

    # What crosses between the server and a site is copied (``own_copy``), as Flower's messages copy
    # it: a package a method edits in place is that site's alone (not the server's state nor the next
    # site's), and a reply the server edits is not the site's model. A package is copied just before
    # its site takes it (one copy at a time beside the server's state); the replies' copies live until
    # the aggregation, as the server's received messages do on Flower (a model per client).

    def start(self, packages):
        for site, package in zip(self.sites, packages):
            site.start(own_copy(package))

    def train(self, round_index):
        out = []
        for site in self.sites:
            reply, loss, rows = site.train(round_index)
            out.append((own_copy(reply), loss, rows))
        return out

    def answer(self, round_index, queries):
        return [own_copy(site.answer(own_copy(query))) for site, query in zip(self.sites, queries)]

    def evaluate(self, round_index, packages, with_test):
        return [site.evaluate(round_index, own_copy(package), with_test) for site, package in zip(self.sites, packages)]

    def keep(self, round_index, names):
        by_name = {site.name: site for site in self.sites}
        return {name: by_name[name].keep(round_index) for name in names}

    def final(self):
        return {site.name: site.final() for site in self.sites}

    def ood(self, models):
        return {cohort.name: cohort.score(models) for cohort in self.cohorts}

    def snapshot(self, round_index):
        """Nothing to do: whoever checkpoints an in-process run holds its clients' states (the engine's
        checkpoint stores them)."""

    def resume(self, round_index, packages, kept=None):
        raise SiteError(
            f"round {round_index}: in-process sites keep no snapshots of their own; resume an in-process run with the engine (fedmedbench train)"
        )

    def data_fingerprint(self):
        """The engine's ``data_digest`` of what the sites read (their store rows and split file)."""
        cfg = self.sites[0].cfg
        return data_digest(Path(cfg.data.store), Path(cfg.data.split), [*cfg.clients, *cfg.ood_clients])


def run_rounds(
    cfg,
    server,
    transport: Transport,
    names: list[str],
    selection,
    history: list[dict],
    first_round: int,
    on_round_end: Callable[[int, dict, dict], None] | None = None,
) -> None:
    """Rounds ``first_round`` .. ``cfg.rounds`` of the method's ``server`` with the sites behind
    ``transport``: appends history.csv's rows to ``history`` and records the selections in
    ``selection`` (a ``fl.selection.Selection``). ``on_round_end(round, val, test)``: progress and
    checkpoints, after the round's rows and selection."""
    for round_index in range(first_round, cfg.rounds + 1):
        server.round_index = round_index  # what a failing server hook's line names (fl/hooks.py)
        trained = transport.train(round_index)
        faults.reached("round_trained")  # a test hook: a server killed mid-round (the sites have trained)
        replies = [reply for reply, _, _ in trained]
        for _, _, rows in trained:
            history += rows
        queries = server.query(round_index, replies)
        if queries is not None:
            for reply, answer in zip(replies, transport.answer(round_index, queries)):
                reply["answer"] = answer
        server.aggregate(round_index, replies)
        for index, values in server.round_log(round_index).items():
            history += [
                {"round": round_index, "client": names[index], "split": "server", "metric": k, "value": float(v)}
                for k, v in values.items()
            ]
        packages = [server.package(index, round_index) for index in range(len(names))]
        with_test = round_index % curve_every(cfg) == 0 or round_index == cfg.rounds
        scores = transport.evaluate(round_index, packages, with_test)
        val, test = {}, {}
        for index, (name, (val_scores, test_scores)) in enumerate(zip(names, scores)):
            val[name] = val_scores
            if test_scores is not None:
                test[name] = test_scores
            history.append(
                {"round": round_index, "client": name, "split": "train", "metric": "loss", "value": trained[index][1]}
            )
            for split_name, split_scores in (("val", val), ("test", test)):
                for metric_name, value in split_scores.get(name, {}).items():
                    history.append(
                        {
                            "round": round_index,
                            "client": name,
                            "split": split_name,
                            "metric": metric_name,
                            "value": value,
                        }
                    )
        for key, covered in (selection.improved(val, round_index) if selection_open(cfg, round_index) else {}).items():
            kept = transport.keep(round_index, covered)
            selection.record(key, round_index, val, {n: kept[n][0] for n in covered}, {n: kept[n][1] for n in covered})
        if on_round_end is not None:
            on_round_end(round_index, val, test)


def serve(
    cfg,
    out_dir,
    transport: Transport,
    progress: bool = True,
    checkpoint_every: int = 1,
    checkpoint_every_seconds: float = 0,
    resume: bool = True,
) -> dict:
    """The server's side of a whole run: the method's ``Server`` (built from the config alone: the
    server opens no store), the rounds over ``transport``, then the sites' final test scores, and the
    run folder's outputs (history.csv, final.json, model_best.pt, predictions.npz) exactly as the
    engine writes them. ``cfg``: a ``RunConfig`` whose method params are merged.

    Checkpoints as the engine's (``runfolder.save_state``: server state, selection, history log, the
    global RNG; fl/checkpoint.py) at the engine's cadence (``checkpoint_every`` rounds, once
    ``checkpoint_every_seconds`` have passed, and after the last round), each announced to the sites
    first (``transport.snapshot``: they keep their own state of that round). The checkpoint holds no
    client state: the sites hold it. A restarted server (``resume``) whose run folder holds a valid
    checkpoint of this config and of the sites' data continues from the next round, after telling the
    sites which round to go back to and which of them the restored selection kept at that round
    (``transport.resume``: a deferred keep of that round may not have reached the site); a site that
    cannot is refused in one line."""
    if list(getattr(transport, "cohort_names", [])) != list(cfg.ood_clients):
        raise SiteError(
            f"run {cfg.run}: its test-only cohorts (ood_clients) are {list(cfg.ood_clients)}, the transport serves {list(getattr(transport, 'cohort_names', []))}"
        )
    if checkpoint_every < 1:
        raise ConfigError(f"checkpoint_every: expected an integer >= 1, got {checkpoint_every}")
    if not checkpoint_every_seconds >= 0:
        raise ConfigError(
            f"checkpoint_every_seconds: expected a number of seconds >= 0, got {checkpoint_every_seconds}"
        )
    method = load_method(cfg.method, cfg.method_module)
    names = list(cfg.clients)
    # The engine's initialisation: the same seed, then the model, so the server holds the weights
    # every site built for itself.
    seed_everything(cfg.seed, torch.device("cpu"))
    faults.arm()
    server = method.Server(cfg, build_model(cfg.model), len(names))
    packages = [server.package(index, 0) for index in range(len(names))]  # before a restore changes the server
    per_client = {"auto": method.PERSONALIZED, "per_client": True, "pooled": False}[cfg.selection_scope]
    selection = Selection(names, cfg.selection_metric, per_client=per_client)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger("fedmedbench.federation")
    metric = cfg.selection_metric
    checkpoint_path = out_dir / "checkpoint.pt"
    fingerprints = (cfg.fingerprint(), transport.data_fingerprint())
    history_log = HistoryLog(runfolder.history_file(out_dir))
    last_round, history = (
        runfolder.restore(checkpoint_path, *fingerprints, server, [], selection, history_log) if resume else (0, [])
    )
    saved_version = selection.version
    runfolder.remove_stale_files(out_dir, saved_version)
    if last_round == 0:
        history_log.reset()
        transport.start(packages)
    else:
        log.info(
            "%s/%s/seed%d: resuming from round %d (the checkpoint after round %d in %s)",
            cfg.task,
            cfg.run,
            cfg.seed,
            last_round + 1,
            last_round,
            checkpoint_path,
        )
        # Every site back to its state at the checkpointed round, with the round each one's model was kept at.
        kept = {name: entry["round"] for entry in selection.best.values() for name in entry["val"]}
        transport.resume(last_round, packages, kept)
    del packages
    bar = Progress(
        cfg.rounds,
        f"{cfg.task}/{cfg.run}/seed{cfg.seed}",
        log,
        unit="round",
        initial=last_round,
        interval=0.0,
        enabled=progress,
    )
    last_saved = time.monotonic()

    def round_end(round_index, val, test):
        nonlocal saved_version, last_saved
        mean_test = f", mean test {sum(t[metric] for t in test.values()) / len(test):.4f}" if test else ""
        bar.update(1, f"mean val {metric} {sum(v[metric] for v in val.values()) / len(val):.4f}{mean_test}")
        due = round_index % checkpoint_every == 0 and time.monotonic() - last_saved >= checkpoint_every_seconds
        if due or round_index == cfg.rounds:
            # The sites first: a checkpoint is only ever written for a round they can go back to.
            transport.snapshot(round_index)
            saved_version = runfolder.save_state(
                out_dir,
                checkpoint_path,
                round_index,
                fingerprints,
                server,
                [],
                selection,
                history,
                saved_version,
                history_log,
            )
            last_saved = time.monotonic()
            faults.reached("round_end")

    run_rounds(cfg, server, transport, names, selection, history, last_round + 1, round_end)
    bar.close()
    finals = transport.final()
    for entry in selection.best.values():  # the kept models, where the sites kept them
        for name in entry["val"]:
            entry["models"][name] = finals[name]["model"]
            entry["predictions"][name] = finals[name]["predictions"]
    test = {name: finals[name]["test"] for name in names}
    flags = {n: f["flags"] for n, f in finals.items() if f["flags"]}
    counts = {n: f["counts"] for n, f in finals.items()}
    ood = None
    if cfg.ood_clients:
        # Every site's selected model (``ood_test`` scores them all): a site that withheld its model
        # was refused at hello already (FlowerTransport), so this names only a broken site.
        withheld = [name for name in names if finals[name]["model"] is None]
        if withheld:
            raise SiteError(
                f"ood: site(s) {', '.join(withheld)} sent no model; test-only cohort(s) {', '.join(cfg.ood_clients)} cannot score it"
            )
        ood = transport.ood({name: finals[name]["model"] for name in names})
        warn_cohort_flags(ood)  # the cohorts' collapse check, as the engine's ood_test says it
    return runfolder.write_outputs(
        cfg, out_dir, names, selection, test, history, checkpoint_path, ood, flags=flags, class_counts=counts
    )
