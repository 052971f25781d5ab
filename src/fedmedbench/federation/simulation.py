"""``runtime: flower-simulation``: one training job through Flower's simulation runtime (Ray) instead
of the engine, with the generic ServerApp and ClientApp of the deployment runtime
(``federation.serverapp`` / ``federation.clientapp``) and the run folder's usual files.

Flower 1.42's Python entry point ``flwr.simulation.run_simulation(server_app, client_app,
num_supernodes, backend_config)`` runs the ServerApp in a thread of this process and each message of
a simulated SuperNode in a Ray actor. A simulated SuperNode's node config holds only ``partition-id``
and ``num-partitions`` (flwr/server/superlink/fleet/vce/vce_api.py), while the generic ClientApp reads
``client``/``store``/``split``/``state-dir`` from it; so the ClientApp here is the generic one behind a
thin dispatcher that completes the node config: partition ``i`` is the run's ``clients[i]``, and its
data is the run config's store and split (the site still opens only its own rows). The ServerApp
here is the generic ``main`` with its run config (``run-config``, ``out``) given in code, as
``run_simulation`` passes none.

What a job gives ``train --threads`` is each simulated site's torch thread count (the deployment
ClientApp's ``threads`` node setting; default 1) and the server thread's: with the same count on
both routes the numbers equal the engine's bit for bit on CPU (the same code, the same seeds, each
site's state restored from its own file before every message, whichever Ray actor runs it).
A killed job resumes as the engine's and the deployed ServerApp's do, with the same numbers: the
server checkpoints at the engine's cadence (``train --checkpoint-every`` / ``--checkpoint-every-seconds``)
and the simulated sites keep their state (and the snapshots of the checkpointed rounds) in a stable
folder of the run folder, ``<out>/.flower-sites/`` (the run config as the ServerApp reads it, and
``run-<key>/<client>.pt``: the generic ClientApp's state folder, keyed by the run folder). It is
removed with the checkpoint: when the run finishes, or fails before its first checkpoint; a
checkpoint without the sites' state of it (a run folder of a killed job before this folder existed,
or a moved run folder) is not resumed: the job starts afresh and says so in one line.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import torch

from fedmedbench.errors import ConfigError, FedmedbenchError
from fedmedbench.files import atomic_write_text, new_folder
from fedmedbench.fl.placement import pick_device
from fedmedbench.fl.runfolder import checkpoint_files
from fedmedbench.fl.runlock import run_folder_lock
from fedmedbench.runconfig import RunConfig

# Flower (flwr, Ray) is the optional [flower] extra: it, and the apps built on it (federation.clientapp,
# federation.serverapp), are imported inside the functions that run a simulation, so that without it
# `train` stops with one ConfigError saying what to install (ruff's PLC0415 is off for this module).


def site_settings(cfg, state_dir: Path, threads: int, device: str) -> dict[int, dict]:
    """partition-id -> the node config a deployed SuperNode of that site would be given: the run's
    clients first, then its test-only cohorts (``ood_clients``: a SuperNode each, as deployed)."""
    return {
        # Absolute paths: Ray's actors need not share this process's working directory (final.json keeps the config's own).
        index: {
            "client": name,
            "store": str(Path(cfg.data.store).resolve()),
            "split": str(Path(cfg.data.split).resolve()),
            "state-dir": str(state_dir),
            "threads": threads,
            "device": device,
        }
        for index, name in enumerate([*cfg.clients, *cfg.ood_clients])
    }


def client_app(sites: dict[int, dict], out: str | None = None):
    """The generic ClientApp behind a dispatcher that tells each simulated SuperNode which site it is
    and which run folder it serves (``out``: the key of its state folder, stable across a restarted
    job; Flower's run id, drawn anew by every simulation, is not). Built per run (a closure over
    ``sites``); Ray pickles it to its actors by value."""
    from flwr.app import Context
    from flwr.clientapp import ClientApp

    from fedmedbench.federation import clientapp

    app = ClientApp()

    def as_site(message, context):
        partition = int(context.node_config["partition-id"])
        # A copy: Flower refuses a Context whose run config a ClientApp changed (DeprecatedRunInfoStore).
        run_config = {**(context.run_config or {}), **({"out": out} if out is not None else {})}
        site = Context(
            run_id=context.run_id,
            node_id=context.node_id,
            node_config={**context.node_config, **sites[partition]},
            state=context.state,
            run_config=run_config,
        )
        return clientapp.app(message, site)

    # Every message the generic ClientApp answers ("train.default", "query.hello", ...), read from its
    # registrations so that a message type added there is routed here too.
    for full_name in clientapp.app._registered_funcs:
        category, action = full_name.split(".")
        getattr(app, category)(action)(as_site)
    return app


def server_app(settings: dict):
    """The generic ServerApp's ``main`` with ``settings`` as its run config (``run-config``, ``out``, ...)."""
    from flwr.app import Context
    from flwr.serverapp import ServerApp

    from fedmedbench.federation import serverapp

    app = ServerApp()

    @app.main()
    def main(grid, context):
        serverapp.main(
            grid,
            Context(
                run_id=context.run_id,
                node_id=context.node_id,
                node_config=context.node_config,
                state=context.state,
                run_config=settings,
            ),
        )

    return app


def backend_config(clients: int, device: str) -> dict:
    """Ray: one CPU per simulated ClientApp and at most one actor per core (each actor imports torch
    and holds its memory; more actors than cores only queue), a small object store (only messages
    pass through it), no dashboard; a GPU run gives each actor an equal share of one GPU."""
    actors = max(1, min(clients, os.cpu_count() or 1))
    resources = {"num_cpus": 1, "num_gpus": 1.0 / actors if device.startswith("cuda") else 0.0}
    init = {
        "num_cpus": actors,
        "include_dashboard": False,
        "object_store_memory": 200 * 1024**2,
        "logging_level": "warning",
        "log_to_driver": True,
    }
    if device.startswith("cuda"):
        init["num_gpus"] = 1
    return {"client_resources": resources, "init_args": init}


SITES_FOLDER = ".flower-sites"
SITES_START_WAIT_S = 900.0  # seconds for every simulated site to answer its first message


def sites_state_folder(out_dir: Path) -> Path:
    """Where the generic ClientApp keeps the simulated sites' state for the run folder ``out_dir``
    (``<state-dir>/run-<key>``, its key computed as the ClientApp computes it)."""
    from flwr.app import Context, RecordDict

    from fedmedbench.federation.clientapp import run_key

    key = run_key(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={"out": str(out_dir)}))
    return out_dir / SITES_FOLDER / f"run-{key}"


def may_resume(out_dir: Path, log) -> bool:
    """Whether the server may resume the run folder's checkpoint: only where the sites' state of it
    is there too. A run folder of a killed job from before the sites' state lived in it (its scratch
    ``.flower-simulation-*`` folder, gone with the job's state, is removed here) or one moved since
    (another state key) starts afresh, saying so."""
    for scratch in out_dir.glob(".flower-simulation-*"):  # the run-folder lock is ours: no job uses it
        shutil.rmtree(scratch, ignore_errors=True)
    checkpoint = [p for p in checkpoint_files(out_dir / "checkpoint.pt")[:2] if p.exists()]
    if checkpoint and not sites_state_folder(out_dir).is_dir():
        log.warning(
            "%s: the simulated sites' state of this checkpoint is not in %s (a job from before the sites kept it there, or a moved run folder); training starts afresh",
            checkpoint[0],
            out_dir / SITES_FOLDER,
        )
        for path in checkpoint:  # never resumable: a later restart must not find it beside the new sites' state
            path.unlink()
        return False
    return True


def run_simulated(
    cfg,
    out_dir: Path,
    device: str = "cpu",
    threads: int | None = None,
    checkpoint_every: int = 1,
    checkpoint_every_seconds: float = 0,
    **_how,
) -> dict:
    """Train the run ``cfg`` (a run config dict or RunConfig) into ``out_dir`` under Flower's
    simulation runtime; returns final.json's content. ``device``, ``threads`` and the checkpoint
    cadence (``checkpoint_every`` rounds, ``checkpoint_every_seconds``) as for ``train``; a killed job
    rerun on the same folder resumes after its checkpoint. The engine's other ways to run
    (``progress``: the ServerApp always logs its round lines; data workers) are accepted, so
    ``train`` calls both routes alike, and do not apply."""
    try:
        from flwr.simulation import run_simulation
    except ImportError as err:  # flwr without its simulation extra, or no flwr at all
        raise ConfigError(
            f"runtime: flower-simulation needs Flower's simulation runtime (pip install -e '.[flower]', which brings flwr[simulation] with Ray): {err}"
        ) from None
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "runtime: flower-simulation needs Ray (pip install -e '.[flower]', which brings flwr[simulation])"
        ) from None
    from fedmedbench.federation.serverapp import read_run_config

    # The engine's checks, before Ray starts (the ServerApp's serve repeats them inside Flower's log).
    if not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool) or checkpoint_every < 1:
        raise ConfigError(f"checkpoint_every: expected an integer >= 1, got {checkpoint_every!r}")
    if not checkpoint_every_seconds >= 0:
        raise ConfigError(
            f"checkpoint_every_seconds: expected a number of seconds >= 0, got {checkpoint_every_seconds}"
        )
    cfg = RunConfig.from_dict(cfg) if isinstance(cfg, dict) else cfg
    threads = threads or 1
    picked, _claim = pick_device(device)  # the claim holds a GPU slot until this process ends
    device = str(picked)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no network from a training job
    torch.set_num_threads(threads)  # the server thread's aggregation, as the engine's
    log = logging.getLogger("fedmedbench.federation")
    with new_folder(Path(out_dir).resolve()) as out_dir, run_folder_lock(out_dir):
        work = out_dir / SITES_FOLDER
        try:
            resume = may_resume(out_dir, log)
            work.mkdir(exist_ok=True)
            # The run config as the deployment's ServerApp reads it (a file, method params merged there).
            atomic_write_text(work / "run.json", json.dumps(cfg.to_dict(), sort_keys=True))
            read_run_config(str(work / "run.json"))  # an unknown method or parameter fails here, before Ray starts
            # The first reply (hello) waits for Ray to start its actors, each importing torch: on a
            # 2-core machine busy with other work that took over 2 minutes, hence the generous wait.
            settings = {
                "run-config": str(work / "run.json"),
                "out": str(out_dir),
                "nodes-timeout": SITES_START_WAIT_S,
                "reply-timeout": 0.0,
                "resume": resume,
                "checkpoint-every": checkpoint_every,
                "checkpoint-every-seconds": float(checkpoint_every_seconds),
                "lock-owner": os.getpid(),
            }  # fmt: skip  (the ServerApp writes under this process's run lock)
            run_simulation(
                server_app=server_app(settings),
                client_app=client_app(site_settings(cfg, work, threads, device), str(out_dir)),
                num_supernodes=len(cfg.clients) + len(cfg.ood_clients),
                backend_config=backend_config(len(cfg.clients) + len(cfg.ood_clients), device),
            )
            final = out_dir / "final.json"
            if not final.is_file():  # Flower logged the ServerApp's error; say which run
                raise FedmedbenchError(
                    f"run {cfg.task}/{cfg.run}/seed{cfg.seed}: Flower's simulation runtime ended without final.json (its log above names the error)"
                )
            return json.loads(final.read_text())
        finally:
            # The sites' state lives as long as a checkpoint that needs it: removed once the outputs
            # replaced the checkpoint, or when the job failed before its first one (nothing to resume).
            if not any(p.exists() for p in checkpoint_files(out_dir / "checkpoint.pt")[:2]):
                shutil.rmtree(work, ignore_errors=True)
