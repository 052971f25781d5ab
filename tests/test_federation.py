"""Flower's deployment runtime computes what the engine computes (fedmedbench.federation).

The codec tests check that a method's payloads cross Flower's records bit for bit and that a bad
reply is refused in one line naming the site. The end-to-end matrix starts ONE real
``flower-superlink`` and three ``flower-supernode`` processes on 127.0.0.1 (free ports; every process
ended however the tests end), runs every built-in method, PRR-FL's official variant and the
``new-method`` scaffold's plug-in for 2 rounds with ``flwr run`` (all submitted at once), and
compares each run folder with the engine's byte for byte. On the same federation, a fourth SuperNode
joins as PRR-FL's test-only cohort (``OOD``, test rows only) once every matrix run has its sites,
and PRR-FL's two flows run with it (``COHORT_RUNS``): their final.json's ood part too equals the
engine's. Skipped where the ``flower`` extra is not installed."""

import filecmp
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

flwr = pytest.importorskip("flwr")

from fedmedbench.federation.local import APP_DIR  # noqa: E402
from fedmedbench.federation.messages import check_reply, pack, unpack  # noqa: E402
from fedmedbench.fl.engine import run_training  # noqa: E402
from fedmedbench.fl.transport import SiteError  # noqa: E402
from fedmedbench.registry import builtin_methods  # noqa: E402
from tests.conftest import tiny_run_config, write_tiny_task  # noqa: E402


def test_payloads_cross_flower_records_bit_for_bit():
    state = {"w": torch.randn(3, 4), "bn.num_batches_tracked": torch.tensor(7), "idx": torch.arange(5, dtype=torch.int32), "h": torch.randn(2).half()}
    value = {"state": state, "num_samples": 12, "steps": 3, "loss": 0.1 + 0.2, "scores": {"dice": 1 / 3, "loss": math.pi},
             "nested": {"deputy": {"w": torch.ones(2)}, "stage": "det"}, "nothing": None, "flag": True, "bf": torch.randn(2).bfloat16()}  # fmt: skip
    back = unpack(pack(value, round=2), "test")
    assert list(back) == list(value)
    for key, tensor in state.items():
        assert back["state"][key].dtype == tensor.dtype and back["state"][key].shape == tensor.shape and torch.equal(back["state"][key], tensor), key
    assert back["num_samples"] == 12 and type(back["num_samples"]) is int and back["loss"] == 0.1 + 0.2
    assert back["scores"] == {"dice": 1 / 3, "loss": math.pi}
    assert torch.equal(back["nested"]["deputy"]["w"], torch.ones(2)) and back["nested"]["stage"] == "det"
    assert back["nothing"] is None and back["flag"] is True and torch.equal(back["bf"], value["bf"])
    assert unpack(pack(None), "test") is None
    # The state travels as an ArrayRecord, the scores as a MetricRecord (not pickled bytes).
    records = pack(value)
    assert isinstance(records["a:state"], flwr.app.ArrayRecord) and isinstance(records["s:scores"], flwr.app.MetricRecord)


def test_a_pickled_object_is_refused_naming_the_site():
    records = pack({"x": 1})
    records["b"]["evil"] = __import__("pickle").dumps(SiteError("code"))
    records["kind"]["order"] = ["x", "evil"]
    records["kind"]["types"] = ["int", "SiteError"]
    with pytest.raises(SiteError, match="site B: a payload that is not plain tensors"):
        unpack(records, "site B")


@pytest.mark.parametrize(
    "reply, message",
    [
        ({"state": {"w": torch.tensor([1.0, float("nan")])}, "num_samples": 3}, "site A: tensor 'w' is not finite"),
        ({"state": {"w": torch.zeros(3)}, "num_samples": 3}, r"site A: tensor 'w' is \(3,\)"),
        ({"state": {"v": torch.zeros(2)}, "num_samples": 3}, "site A: the reply holds tensor 'v'"),
        ({"state": {"w": torch.zeros(2)}, "num_samples": 0}, "site A: num_samples 0"),
        ([1, 2], "site A: the reply is not a model update"),
    ],
)
def test_a_malformed_reply_is_refused_naming_the_site(reply, message):
    check_reply("site A", {"state": {"w": torch.zeros(2)}, "num_samples": 3}, {"w": torch.zeros(2)})  # a good one passes
    with pytest.raises(SiteError, match=message):
        check_reply("site A", reply, {"w": torch.zeros(2)})


# --- the matrix: every method on one real federation --------------------------------------------
PLUGIN_SRC = Path(__file__).resolve().parents[1] / "examples" / "fedxyz" / "src"  # the new-method scaffold's output
OUTPUTS = ("final.json", "history.csv", "model_best.pt", "predictions.npz")
# run name -> (method, overrides of the tiny run config): every built-in method with its defaults
# (HarmoFL: the paper's flow), PRR-FL's official variant (config.yaml's prrfl `official`) beside its
# default, and the scaffold's plug-in, imported from its source folder as a site would import it.
MATRIX = {name: (name, {}) for name in builtin_methods()}
MATRIX["prrfl-official"] = ("prrfl", {"method_params": {"fourier_mode": "official", "phi_split": "train", "upload": "deputy"}, "selection_window": 0.2, "selection_scope": "pooled"})
MATRIX["fedxyz"] = ("fedxyz", {"method_module": "fedxyz.method"})
# PRR-FL's two flows with a test-only cohort (the skin task's Table 3 set-up): run on the same
# federation by a fourth SuperNode, site OOD, whose split rows are all test rows.
COHORT_RUNS = {"prrfl-ood": ("prrfl", {"ood_clients": ["OOD"]}), "prrfl-official-ood": ("prrfl", {**MATRIX["prrfl-official"][1], "ood_clients": ["OOD"]})}


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
        raise AssertionError(f"flwr {' '.join(args)} exited {result.returncode}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}") from None


@pytest.fixture(scope="module")
def federated_matrix(tmp_path_factory):
    """Every MATRIX run on ONE federation (a SuperLink and three SuperNodes, started once): all runs
    submitted at once (the SuperLink runs them side by side, each SuperNode serves their messages one
    at a time), the engine's reference runs computed here meanwhile. Yields (root, {run: status})."""
    from fedmedbench.federation.local import CONNECTION, local_federation

    root = tmp_path_factory.mktemp("matrix")
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

            def submit(runs: dict) -> None:
                submitted = {}
                for name, (method, overrides) in runs.items():
                    cfg = tiny_run_config(store, split, method, rounds=2, **overrides)
                    cfg["run"] = name
                    configs[name] = cfg
                    (root / f"{name}.json").write_text(json.dumps(cfg))
                    settings = f'run-config="{root / f"{name}.json"}" out="{root / "flower" / name}"'
                    command = [str(Path(sys.executable).with_name("flwr")), "run", str(APP_DIR), CONNECTION, "--run-config", settings, "--format", "json"]
                    submitted[name] = subprocess.Popen(command, env=federation.env, cwd=federation.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for name, process in submitted.items():
                    output = process.communicate(timeout=300)[0]
                    assert process.returncode == 0, f"flwr run of {name}: {output[-3000:]}"
                    run_ids[json.loads(output)["run-id"]] = name

            submit(MATRIX)
            # The engine's runs, while the federation works. One CPU thread on both sides (the
            # sites' default): another count changes float summation order.
            for name in MATRIX:
                run_training(configs[name], root / "engine" / name, threads=1, progress=False)
            # The cohort's SuperNode joins once every matrix run has found its three sites (each
            # ServerApp says hello to the nodes connected when it starts: a fourth node of a site
            # that is not one of its clients would be refused), then PRR-FL's runs with the cohort.
            log_a, deadline = federation.supernode("A").log, time.monotonic() + 1800
            while hellos_answered(log_a) < len(MATRIX):
                assert time.monotonic() < deadline, f"site A answered {hellos_answered(log_a)} of {len(MATRIX)} hellos within 1800 s; logs in {federation.workdir}"
                time.sleep(1)
            federation.start_supernode("OOD", {"store": str(store), "split": str(split)})
            submit(COHORT_RUNS)
            for name in COHORT_RUNS:
                run_training(configs[name], root / "engine" / name, threads=1, progress=False)
            # A run is done when its ServerApp wrote federation.json (its last file) and Flower says
            # so; `flwr ls` (a CLI process, a second of CPU) only every 30 s, or once every run has
            # its file. The limit only catches a hang: on a 2-core machine shared with other test
            # runs (load 25-58) the 20 runs took about 25 minutes.
            deadline, status, asked = time.monotonic() + 3600, {}, 0.0
            while len(status) < len(run_ids):
                assert time.monotonic() < deadline, f"runs not finished within 3600 s: {sorted(set(run_ids.values()) - set(status))}; logs in {federation.workdir}"
                time.sleep(2)
                written = all((root / "flower" / name / "federation.json").is_file() for name in run_ids.values())
                if written or time.monotonic() - asked > 30:
                    asked = time.monotonic()
                    for run in _flwr_json(federation, "ls", "--limit", str(len(run_ids) + 10))["runs"]:  # flwr ls lists 20 by default
                        if run["run-id"] in run_ids and run["status"].startswith("finished"):
                            status[run_ids[run["run-id"]]] = (run["status"], run["run-id"])
            logs = {}
            for name, (state, run_id) in status.items():
                if state != "finished:completed":
                    result = federation.flwr("log", str(run_id), CONNECTION, "--show", timeout=60)
                    logs[name] = (result.stdout + result.stderr)[-4000:]
            yield root, status, logs


@pytest.mark.slow
@pytest.mark.federation
@pytest.mark.parametrize("name", list(MATRIX))
def test_every_method_on_a_real_federation_equals_the_engine_byte_for_byte(federated_matrix, name):
    root, status, logs = federated_matrix
    assert status[name][0] == "finished:completed", f"{name}: {status[name]}\n{logs.get(name, '')}"
    engine, flower = root / "engine" / name, root / "flower" / name
    for output in OUTPUTS:
        assert filecmp.cmp(engine / output, flower / output, shallow=False), f"{name}: {output} differs from the engine's"
    assert json.loads((flower / "final.json").read_text())["method"] == MATRIX[name][0]
    traffic = json.loads((flower / "federation.json").read_text())
    assert traffic["sites"] == 3 and traffic["bytes_sent"] > 0 and traffic["bytes_received"] > 0


@pytest.mark.slow
@pytest.mark.federation
@pytest.mark.parametrize("name", list(COHORT_RUNS))
def test_a_test_only_cohort_on_a_real_federation_equals_the_engine_byte_for_byte(federated_matrix, name):
    """PRR-FL (paper and official flows) with site OOD's SuperNode as the test-only cohort: the run
    folder, final.json's ood part (per model, mean, ensemble) included, equals the engine's."""
    root, status, logs = federated_matrix
    assert status[name][0] == "finished:completed", f"{name}: {status[name]}\n{logs.get(name, '')}"
    engine, flower = root / "engine" / name, root / "flower" / name
    for output in OUTPUTS:
        assert filecmp.cmp(engine / output, flower / output, shallow=False), f"{name}: {output} differs from the engine's"
    ood = json.loads((flower / "final.json").read_text())["ood"]["OOD"]
    assert list(ood["per_model"]) == ["A", "B", "C"]
    for metric, value in ood["mean"].items():
        assert value == pytest.approx(sum(scores[metric] for scores in ood["per_model"].values()) / 3), metric
    traffic = json.loads((flower / "federation.json").read_text())
    assert sorted(traffic["data_digests"]) == ["A", "B", "C", "OOD"] and traffic["sites"] == 3


def test_a_state_travels_as_one_array_within_two_percent_of_its_bytes():
    """A state is one byte Array plus a compressed index: a 118-tensor UNet's reply costs < 2 % over
    its tensor bytes as Flower sends it (one Array per tensor cost 22 %); a corrupt one is refused."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from fedmedbench.models import build_model

    state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in build_model({"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2}).state_dict().items()}
    records = pack({"state": state, "num_samples": 8}, loss=0.5)
    raw = sum(v.numel() * v.element_size() for v in state.values())
    sent = sum(len(obj.deflate()) for obj in get_all_nested_objects(records).values())
    assert len(state) == 118 and list(records["a:state"]) == ["bytes"] and raw < sent < 1.02 * raw
    back = unpack(records, "site A")["state"]
    assert list(back) == list(state) and all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in state.items())
    records["a:state"]["bytes"] = flwr.app.Array(records["a:state"]["bytes"].numpy()[:-4].copy())
    with pytest.raises(SiteError, match="site A: the state's bytes end before tensor"):
        unpack(records, "site A")


def test_nested_models_travel_as_one_array_not_pickled_tensor_by_tensor():
    """Fed-LWR's peers (a dict of states), CFFL's candidates (a list of states), an OrderedDict and a
    bf16 tensor deep in a payload: their tensors ride in one byte Array beside a small skeleton,
    bit for bit (torch.save framed each tensor with ~1 kB: Fed-LWR's queries cost 13 % more than
    their bytes); a skeleton naming a tensor it does not carry is refused naming the site."""
    from collections import OrderedDict

    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from fedmedbench.models import build_model

    model = build_model({"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2}).state_dict()
    peers = {name: {k: v + i for k, v in model.items()} for i, name in enumerate("ABC")}
    value = {"peers": peers, "candidates": [OrderedDict(peers["A"]), peers["B"]], "mixed": ("x", torch.randn(3).bfloat16(), 2)}
    records = pack(value)
    back = unpack(records, "site B")
    assert type(back["candidates"][0]) is OrderedDict and back["mixed"][0] == "x" and back["mixed"][2] == 2 and torch.equal(back["mixed"][1], value["mixed"][1])
    for name in "ABC":
        assert all(torch.equal(back["peers"][name][k], v) and back["peers"][name][k].dtype == v.dtype for k, v in peers[name].items())
    raw = 5 * sum(v.numel() * v.element_size() for v in model.values()) + 6
    sent = sum(len(obj.deflate()) for obj in get_all_nested_objects(records).values())
    assert raw < sent < 1.05 * raw
    records["b"]["mixed"] = pack({"m": ("__fedmedbench_tensor__", 99)})["b"]["m"]
    with pytest.raises(SiteError, match="site B: a payload names tensor 99"):
        unpack(records, "site B")
