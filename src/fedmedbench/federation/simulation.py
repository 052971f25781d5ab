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
A killed job starts over (``resume`` off: the sites' state was in the job's scratch folder).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from fedmedbench.errors import ConfigError, FedmedbenchError

def site_settings(cfg, state_dir: Path, threads: int, device: str) -> dict[int, dict]:
    """partition-id -> the node config a deployed SuperNode of that site would be given."""
    return {
        # Absolute paths: Ray's actors need not share this process's working directory (final.json keeps the config's own).
        index: {"client": name, "store": str(Path(cfg.data.store).resolve()), "split": str(Path(cfg.data.split).resolve()), "state-dir": str(state_dir), "threads": threads, "device": device}
        for index, name in enumerate(cfg.clients)
    }


def client_app(sites: dict[int, dict]):
    """The generic ClientApp behind a dispatcher that tells each simulated SuperNode which site it is.
    Built per run (a closure over ``sites``); Ray pickles it to its actors by value."""
    from flwr.clientapp import ClientApp

    from fedmedbench.federation import clientapp

    app = ClientApp()

    def as_site(message, context):
        partition = int(context.node_config["partition-id"])
        context.node_config = {**context.node_config, **sites[partition]}
        return clientapp.app(message, context)

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
        serverapp.main(grid, Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config, state=context.state, run_config=settings))

    return app


def backend_config(clients: int, device: str) -> dict:
    """Ray: one CPU per simulated ClientApp and at most one actor per core (each actor imports torch
    and holds its memory; more actors than cores only queue), a small object store (only messages
    pass through it), no dashboard; a GPU run gives each actor an equal share of one GPU."""
    actors = max(1, min(clients, os.cpu_count() or 1))
    resources = {"num_cpus": 1, "num_gpus": 1.0 / actors if device.startswith("cuda") else 0.0}
    init = {"num_cpus": actors, "include_dashboard": False, "object_store_memory": 200 * 1024**2, "logging_level": "warning", "log_to_driver": True}
    if device.startswith("cuda"):
        init["num_gpus"] = 1
    return {"client_resources": resources, "init_args": init}


def run_simulated(cfg, out_dir: Path, device: str = "cpu", threads: int | None = None, **_how) -> dict:
    """Train the run ``cfg`` (a run config dict or RunConfig) into ``out_dir`` under Flower's
    simulation runtime; returns final.json's content. ``device``/``threads`` as for ``train``; the
    engine's other ways to run (``progress``: the ServerApp always logs its round lines; checkpoint
    cadence, data workers) are accepted, so ``train`` calls both routes alike, and do not apply."""
    try:
        from flwr.simulation import run_simulation
    except ImportError as err:  # flwr without its simulation extra, or no flwr at all
        raise ConfigError(f"runtime: flower-simulation needs Flower's simulation runtime (pip install -e '.[flower]', which brings flwr[simulation] with Ray): {err}") from None
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError("runtime: flower-simulation needs Ray (pip install -e '.[flower]', which brings flwr[simulation])") from None
    from fedmedbench.federation.serverapp import read_run_config
    from fedmedbench.files import new_folder
    from fedmedbench.fl.placement import pick_device
    from fedmedbench.fl.runlock import run_folder_lock
    from fedmedbench.runconfig import RunConfig

    cfg = RunConfig.from_dict(cfg) if isinstance(cfg, dict) else cfg
    threads = threads or 1
    picked, _claim = pick_device(device)  # the claim holds a GPU slot until this process ends
    device = str(picked)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no network from a training job
    torch.set_num_threads(threads)  # the server thread's aggregation, as the engine's
    with new_folder(Path(out_dir).resolve()) as out_dir, run_folder_lock(out_dir):
        work = Path(tempfile.mkdtemp(prefix=".flower-simulation-", dir=out_dir))
        try:
            # The run config as the deployment's ServerApp reads it (a file, method params merged there).
            (work / "run.json").write_text(json.dumps(cfg.to_dict(), sort_keys=True))
            read_run_config(str(work / "run.json"))  # an unknown method or parameter fails here, before Ray starts
            # resume: false: the simulated sites' state lives in this job's scratch folder (under a run id
            # Flower draws anew for each simulation), gone with a killed job, so a rerun starts afresh;
            # hence the server checkpoints only after the last round.
            settings = {"run-config": str(work / "run.json"), "out": str(out_dir), "nodes-timeout": 120.0, "reply-timeout": 0.0, "resume": False, "checkpoint-every": cfg.rounds}
            sites = site_settings(cfg, work / "sites", threads, device)
            run_simulation(
                server_app=server_app(settings),
                client_app=client_app(sites),
                num_supernodes=len(cfg.clients),
                backend_config=backend_config(len(cfg.clients), device),
            )
            final = out_dir / "final.json"
            if not final.is_file():  # Flower logged the ServerApp's error; say which run
                raise FedmedbenchError(f"run {cfg.task}/{cfg.run}/seed{cfg.seed}: Flower's simulation runtime ended without final.json (its log above names the error)")
            return json.loads(final.read_text())
        finally:
            shutil.rmtree(work, ignore_errors=True)
