"""The equivalence matrix: every method on a real Flower federation, run folder equal to the engine's.

A helper of the two files that run it (tests/test_federation.py: the HarmoFL paper's baselines;
tests/test_federation_prrfl_fedlwr.py: PRR-FL's two flows with a test-only cohort, the Fed-LWR
paper's fairness baselines and the plug-in new-method writes). Each file starts ONE real
``flower-superlink`` and three ``flower-supernode`` processes on 127.0.0.1 (free ports; every process
ended however the tests end) and submits its runs at once with ``flwr run``: each SuperNode serves
one message at a time, so two federations in two pytest workers halve the longest wait. The cohort
runs add a fourth SuperNode (site ``OOD``, test rows only) once every other run has its sites."""

import filecmp
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedmedbench.federation.local import APP_DIR
from fedmedbench.fl.engine import run_training
from fedmedbench.registry import builtin_methods
from tests.conftest import tiny_run_config, write_tiny_task

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "examples" / "fedxyz" / "src"  # the output of `new-method`
OUTPUTS = ("final.json", "history.csv", "model_best.pt", "predictions.npz")
# run name -> (method, overrides of the tiny run config): every built-in method with its defaults
# (HarmoFL: the paper's flow), PRR-FL's official variant (config.yaml's prrfl `official`) beside its
# default, and new-method's plug-in, imported from its source folder as a site would import it.
MATRIX = {name: (name, {}) for name in builtin_methods()}
MATRIX["prrfl-official"] = (
    "prrfl",
    {
        "method_params": {"fourier_mode": "official", "phi_split": "train", "upload": "deputy"},
        "selection_window": 0.2,
        "selection_scope": "pooled",
    },
)
MATRIX["fedxyz"] = ("fedxyz", {"method_module": "fedxyz.method"})
# PRR-FL's two flows with a test-only cohort (the skin task's Table 3 set-up): run on the same
# federation by a fourth SuperNode, site OOD, whose split rows are all test rows.
COHORT_RUNS = {
    "prrfl-ood": ("prrfl", {"ood_clients": ["OOD"]}),
    "prrfl-official-ood": ("prrfl", {**MATRIX["prrfl-official"][1], "ood_clients": ["OOD"]}),
}
# The two halves, one per test file (and federation).
FEDLWR_PAPER = ("solo", "ditto", "qfedavg", "cffl", "cgsv", "fedce", "fedlwr")
SECOND_HALF = ("prrfl", "prrfl-official", *FEDLWR_PAPER, "fedxyz")
FIRST_HALF = tuple(name for name in MATRIX if name not in SECOND_HALF)


def write_tiny_task_with_cohort(root: Path):
    """The tiny three-site store plus site OOD (6 samples, all of them test rows)."""
    import pandas as pd

    from fedmedbench.data.store import write_split_csv

    store, split = write_tiny_task(root, clients=("A", "B", "C", "OOD"), n=(12, 10, 8, 6))
    rows = pd.read_csv(split)
    rows.loc[rows["client"] == "OOD", "split"] = "test"
    write_split_csv(rows, split)
    return store, split


def hellos_answered(log: Path) -> int:
    """How many runs' ``hello`` a SuperNode has answered (Flower logs each reply it sends)."""
    return log.read_text().count("Sending: query.hello message")


def _flwr_json(federation, *args: str, timeout: float = 120.0):
    result = federation.flwr(*args, "--format", "json", timeout=timeout)
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"flwr {' '.join(args)} exited {result.returncode}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        ) from None


def federated_runs(root: Path, names: tuple[str, ...], cohort_names: tuple[str, ...] = ()):
    """The ``names`` of MATRIX (then the ``cohort_names`` of COHORT_RUNS) on ONE federation, all
    submitted at once (the SuperLink runs them side by side), the engine's reference runs computed
    here meanwhile. Yields (root, {run: (status, run id)}, {run: log tail of a failed run})."""
    from fedmedbench.federation.local import CONNECTION, local_federation

    runs = {name: MATRIX[name] for name in names}
    cohort_runs = {name: COHORT_RUNS[name] for name in cohort_names}
    store, split = write_tiny_task_with_cohort(root / "data")
    with pytest.MonkeyPatch.context() as patch:
        # The plug-in is importable in this process (the engine's run) and on every site (the
        # SuperNodes' app processes inherit PYTHONPATH), as an installed plug-in would be.
        patch.syspath_prepend(str(PLUGIN_SRC))
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(PLUGIN_SRC), os.environ.get("PYTHONPATH", "")) if p))
        patch.setenv("FLWR_TELEMETRY_ENABLED", "0")  # no telemetry calls from a test
        # Each SuperExec asks its node/link for a task every second by default: 0.1 s here.
        patch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
        sites = {name: {"store": str(store), "split": str(split)} for name in ("A", "B", "C")}
        with local_federation(sites, root / "federation", warm=True) as federation:
            configs, run_ids = {}, {}

            def submit(batch: dict) -> None:
                submitted = {}
                for name, (method, overrides) in batch.items():
                    cfg = tiny_run_config(store, split, method, rounds=2, **overrides)
                    cfg["run"] = name
                    configs[name] = cfg
                    (root / f"{name}.json").write_text(json.dumps(cfg))
                    settings = f'run-config="{root / f"{name}.json"}" out="{root / "flower" / name}"'
                    command = [
                        str(Path(sys.executable).with_name("flwr")),
                        "run",
                        str(APP_DIR),
                        CONNECTION,
                        "--run-config",
                        settings,
                        "--format",
                        "json",
                    ]
                    submitted[name] = subprocess.Popen(
                        command,
                        env=federation.env,
                        cwd=federation.workdir,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    )
                for name, process in submitted.items():
                    output = process.communicate(timeout=300)[0]
                    assert process.returncode == 0, f"flwr run of {name}: {output[-3000:]}"
                    run_ids[json.loads(output)["run-id"]] = name

            submit(runs)
            # The engine's runs, while the federation works. One CPU thread on both sides (the
            # sites' default): another count changes float summation order.
            for name in runs:
                run_training(configs[name], root / "engine" / name, threads=1, progress=False)
            if cohort_runs:
                # The cohort's SuperNode joins once every run has found its three sites (each
                # ServerApp says hello to the nodes connected when it starts: a fourth node of a site
                # that is not one of its clients would be refused), then the runs with the cohort.
                log_a, deadline = federation.supernode("A").log, time.monotonic() + 1800
                while hellos_answered(log_a) < len(runs):
                    assert time.monotonic() < deadline, (
                        f"site A answered {hellos_answered(log_a)} of {len(runs)} hellos within 1800 s; logs in {federation.workdir}"
                    )
                    time.sleep(1)
                federation.start_supernode("OOD", {"store": str(store), "split": str(split)})
                submit(cohort_runs)
                for name in cohort_runs:
                    run_training(configs[name], root / "engine" / name, threads=1, progress=False)
            # A run is done when its ServerApp wrote federation.json (its last file) and Flower says
            # so; `flwr ls` (a CLI process, a second of CPU) only every 30 s, or once every run has
            # its file. The limit only catches a hang.
            deadline, status, asked = time.monotonic() + 3600, {}, 0.0
            while len(status) < len(run_ids):
                assert time.monotonic() < deadline, (
                    f"runs not finished within 3600 s: {sorted(set(run_ids.values()) - set(status))}; logs in {federation.workdir}"
                )
                time.sleep(2)
                written = all((root / "flower" / name / "federation.json").is_file() for name in run_ids.values())
                if written or time.monotonic() - asked > 30:
                    asked = time.monotonic()
                    for run in _flwr_json(federation, "ls", "--limit", str(len(run_ids) + 10))[
                        "runs"
                    ]:  # flwr ls lists 20 by default
                        if run["run-id"] in run_ids and run["status"].startswith("finished"):
                            status[run_ids[run["run-id"]]] = (run["status"], run["run-id"])
            logs = {}
            for name, (state, run_id) in status.items():
                if state != "finished:completed":
                    result = federation.flwr("log", str(run_id), CONNECTION, "--show", timeout=60)
                    logs[name] = (result.stdout + result.stderr)[-4000:]
            yield root, status, logs


def assert_equals_the_engine(federated, name: str, method: str, sites: int = 3) -> Path:
    """Run ``name`` completed on Flower and its run folder equals the engine's byte for byte;
    returns the Flower run folder."""
    root, status, logs = federated
    assert status[name][0] == "finished:completed", f"{name}: {status[name]}\n{logs.get(name, '')}"
    engine, flower = root / "engine" / name, root / "flower" / name
    for output in OUTPUTS:
        assert filecmp.cmp(engine / output, flower / output, shallow=False), (
            f"{name}: {output} differs from the engine's"
        )
    assert json.loads((flower / "final.json").read_text())["method"] == method
    traffic = json.loads((flower / "federation.json").read_text())
    assert traffic["sites"] == sites and traffic["bytes_sent"] > 0 and traffic["bytes_received"] > 0
    return flower
