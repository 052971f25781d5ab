"""``runtime: flower-simulation``: a training job through Flower's simulation runtime (Ray) computes
what the engine computes (fedmedbench.federation.simulation).

The fast tests check the option itself: an engine run's config, fingerprint and final.json are what
they were before the option existed, a bad value is refused naming the key, and the simulation's
ClientApp answers every message the generic one does. The slow ones start Ray: a direct run equals
the engine's run folder byte for byte (FedAvg, CPU), and a tiny Snakemake workflow puts an engine row
and a Flower row of FedAvg side by side in one table, with the same digits. Skipped where Flower's
simulation extra (flwr[simulation]: Ray) is not installed."""

import csv
import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("flwr")
pytest.importorskip("ray")

from fedmedbench import config as cfgmod  # noqa: E402
from fedmedbench.errors import ConfigError  # noqa: E402
from fedmedbench.runconfig import RunConfig  # noqa: E402
from tests.conftest import tiny_run_config  # noqa: E402
from tests.tiny import CONFIGFILES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# tiny_run_config's fingerprint at commit fcb2df7, before the runtime option existed: an engine run
# must keep it (a changed fingerprint would discard checkpoints; a changed run config re-runs the demo).
FINGERPRINT_BEFORE = "9be5a3762f889d0d"


def test_the_default_runtime_leaves_an_engine_run_as_it_was():
    cfg = tiny_run_config("store", "split.csv")
    engine = RunConfig.from_dict(cfg)
    assert engine.runtime == "engine" and "runtime" not in engine.to_dict()
    assert engine.fingerprint() == FINGERPRINT_BEFORE
    assert RunConfig.from_dict({**cfg, "runtime": "engine"}).fingerprint() == FINGERPRINT_BEFORE
    flower = RunConfig.from_dict({**cfg, "runtime": "flower-simulation"})
    assert flower.to_dict()["runtime"] == "flower-simulation" and flower.fingerprint() != FINGERPRINT_BEFORE
    assert RunConfig.from_dict(flower.to_dict()) == flower  # the round trip keeps it


def tiny_config(overlay: dict) -> dict:
    config = {}
    for path in CONFIGFILES:
        config = cfgmod.deep_merge(config, yaml.safe_load(path.read_text()))
    return cfgmod.deep_merge(config, overlay)


FLOWER_VARIANT = {"methods": {"fedavg": {"variants": {"flower": {"runtime": "flower-simulation"}}}}}


def test_a_variant_chooses_the_runtime_and_a_bad_value_is_refused_naming_the_key():
    config = tiny_config(FLOWER_VARIANT)
    cfgmod.validate(config, "config")
    engine = cfgmod.resolve_run(config, "prostate", "fedavg", 0)
    flower = cfgmod.resolve_run(config, "prostate", "fedavg-flower", 0)
    assert "runtime" not in engine and flower["runtime"] == "flower-simulation"
    # Everything but the run's name and the runtime is the same run.
    differ = {k for k in engine.keys() | flower.keys() if engine.get(k) != flower.get(k)}
    assert differ == {"run", "variant", "runtime"}
    bad = tiny_config({"methods": {"fedavg": {"variants": {"flower": {"runtime": "flower"}}}}})
    with pytest.raises(ConfigError, match=r"variants\.flower.*runtime"):
        cfgmod.validate(bad, "config")
    with pytest.raises(ConfigError, match=r"tasks\.prostate\.runtime"):
        cfgmod.validate(tiny_config({"tasks": {"prostate": {"runtime": "ray"}}}), "config")


def test_the_simulation_client_app_answers_every_message_the_generic_one_does():
    from fedmedbench.federation import clientapp, simulation

    app = simulation.client_app({0: {"client": "A"}})
    assert sorted(app._registered_funcs) == sorted(clientapp.app._registered_funcs)
    steps = {"train.default", "evaluate.default", "query.hello", "query.setup", "query.answer", "query.keep", "query.final"}
    assert steps <= set(app._registered_funcs)  # the round protocol's steps, at least


def test_a_bad_run_is_refused_before_ray_starts_and_leaves_no_folder(tmp_path, tiny_task):
    from fedmedbench.federation.simulation import run_simulated

    store, split = tiny_task
    with pytest.raises(ConfigError, match="fedavgg"):
        run_simulated(tiny_run_config(store, split, "fedavgg"), tmp_path / "runs" / "flower", threads=1)
    assert not (tmp_path / "runs").exists()


def test_without_ray_the_route_says_what_to_install(tmp_path, tiny_task, monkeypatch):
    from fedmedbench.federation.simulation import run_simulated

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as where it is not installed
    store, split = tiny_task
    with pytest.raises(ConfigError, match=r"runtime: flower-simulation needs Ray \(pip install -e '\.\[flower\]'"):
        run_simulated(tiny_run_config(store, split), tmp_path / "flower")
    assert not (tmp_path / "flower").exists()


@pytest.mark.slow
def test_a_simulated_run_equals_the_engine_byte_for_byte(tmp_path, tiny_task):
    from fedmedbench.federation.simulation import run_simulated
    from fedmedbench.fl.engine import run_training

    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=2)
    run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    final = run_simulated(cfg, tmp_path / "flower", threads=1, progress=False)
    for name in ("final.json", "history.csv", "model_best.pt", "predictions.npz"):
        assert filecmp.cmp(tmp_path / "engine" / name, tmp_path / "flower" / name, shallow=False), name
    assert final == json.loads((tmp_path / "engine" / "final.json").read_text())
    # The sites' state between messages lived in a scratch folder, removed at the end.
    assert sorted(p.name for p in (tmp_path / "flower").iterdir()) == ["federation.json", "final.json", "history.csv", "model_best.pt", "predictions.npz"]
    assert json.loads((tmp_path / "flower" / "federation.json").read_text())["sites"] == 3


TABLE = "flower_vs_engine"
OVERLAY = {
    **FLOWER_VARIANT,
    "selected_experiments": [TABLE],
    "experiments": {
        TABLE: {
            "title": "FedAvg on the engine and on Flower's simulation runtime",
            "task": "prostate",
            "runs": ["fedavg", "fedavg-flower"],
            "labels": {"fedavg": "FedAvg (engine)", "fedavg-flower": "FedAvg (Flower simulation)"},
            "seeds": [0],
            "metric": "dice_paper",
        }
    },
}


@pytest.mark.slow
def test_a_snakemake_table_holds_an_engine_row_and_a_flower_row_with_equal_digits(tmp_path):
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "config.yaml", tmp_path / "config" / "config.yaml")  # the Snakefile's default configfile
    (tmp_path / "flower.yaml").write_text(yaml.safe_dump(OVERLAY))
    out = tmp_path / "results" / "e2e"
    targets = [f"results/e2e/tables/{TABLE}.{ext}" for ext in ("md", "csv")]  # relative to --directory, as the rules' outputs
    configs = [*map(str, CONFIGFILES), str(tmp_path / "flower.yaml")]
    command = [str(BIN / "snakemake"), "-s", str(ROOT / "workflow" / "Snakefile"), "--directory", str(tmp_path), "--cores", "2", *targets, "--configfile", *configs]
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path)}
    # Under the job server, as `make demo` runs: the Flower job starts Ray from a forked warm process.
    run = subprocess.run([str(BIN / "python"), "-m", "fedmedbench", "with-jobserver", *command], capture_output=True, text=True, env=env, cwd=tmp_path)
    logs = "".join(p.read_text()[-3000:] for p in (out / "logs" / "train").rglob("*.log")) if (out / "logs").is_dir() else ""
    assert run.returncode == 0, run.stderr[-3000:] + logs

    # The table's CSV: one row per (row label, client); mean, std and seed count equal to every digit.
    rows: dict = {}
    for row in csv.DictReader((out / "tables" / f"{TABLE}.csv").read_text().splitlines()):
        rows.setdefault(row["row"], {})[row["client"]] = (row["mean"], row["std"], row["n_seeds"])
    engine, flower = rows["FedAvg (engine)"], rows["FedAvg (Flower simulation)"]
    assert list(engine) == ["A", "B", "C", "D", "E", "F", "Avg"] and engine == flower
    assert 0 < float(engine["Avg"][0]) < 100
    # The printed table: the two rows' cells are the same text.
    md = (out / "tables" / f"{TABLE}.md").read_text()
    cells = {line.split("|")[1].strip(): line.split("|")[2:] for line in md.splitlines() if line.startswith("| FedAvg")}
    assert len(cells) == 2 and cells["FedAvg (engine)"] == cells["FedAvg (Flower simulation)"]
    assert "identical on every site" in md

    runs = out / "train" / "prostate"
    for name in ("history.csv", "model_best.pt", "predictions.npz"):
        assert filecmp.cmp(runs / "fedavg" / "seed0" / name, runs / "fedavg-flower" / "seed0" / name, shallow=False), name
    engine_final = json.loads((runs / "fedavg" / "seed0" / "final.json").read_text())
    flower_final = json.loads((runs / "fedavg-flower" / "seed0" / "final.json").read_text())
    assert "runtime" not in engine_final["config"] and flower_final["config"]["runtime"] == "flower-simulation"
    assert engine_final["test"] == flower_final["test"] and engine_final["selection"] == flower_final["selection"]
