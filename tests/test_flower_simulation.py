"""``runtime: flower-simulation``: a training job through Flower's simulation runtime (Ray) computes
what the engine computes (fedmedbench.federation.simulation).

The fast tests check the option itself: an engine run's config, fingerprint and final.json are what
they were before the option existed, a bad value is refused naming the key, and the simulation's
ClientApp answers every message the generic one does. The slow ones start Ray: a tiny Snakemake
workflow puts an engine row and a Flower row of FedAvg side by side in one table, with the same
digits, and a job SIGKILLed in round 3 resumes on its rerun and ends with the engine's run folder
byte for byte, a test-only cohort's scores included (two Ray starts). The
run folder's handling around Flower (the sites' state folder, an older-style killed folder, the
checkpoint cadence) is checked fast, with ``run_simulation`` replaced. Skipped where Flower's
simulation extra (flwr[simulation]: Ray) is not installed."""

import csv
import filecmp
import json
import os
import shutil
import signal
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


def test_every_client_and_test_only_cohort_is_a_simulated_node_of_its_own(tmp_path):
    from fedmedbench.federation.simulation import site_settings

    cfg = RunConfig.from_dict(tiny_run_config("store", "split.csv", clients=["A", "B"], ood_clients=["C"]))
    sites = site_settings(cfg, tmp_path, threads=1, device="cpu")
    assert {index: site["client"] for index, site in sites.items()} == {0: "A", 1: "B", 2: "C"}
    assert {site["state-dir"] for site in sites.values()} == {str(tmp_path)}


def test_the_simulation_client_app_answers_every_message_the_generic_one_does():
    from fedmedbench.federation import clientapp, simulation

    app = simulation.client_app({0: {"client": "A"}})
    assert sorted(app._registered_funcs) == sorted(clientapp.app._registered_funcs)
    steps = {
        "train.default",
        "evaluate.default",
        "query.hello",
        "query.setup",
        "query.answer",
        "query.keep",
        "query.final",
    }
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


def run_simulated_in_a_process(cfg, out, kill_at=None):
    """``run_simulated`` in a process of its own (the job ``train`` would be), optionally SIGKILLed at
    ``kill_at`` (faults.py): its stderr holds the run's log lines."""
    from fedmedbench import faults

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop(faults.KILL_AT_ENV, None)
    if kill_at:
        env[faults.KILL_AT_ENV] = kill_at
    script = (
        "import json, sys\n"
        "from fedmedbench.cli import _setup_logging\n"
        "from fedmedbench.federation.simulation import run_simulated\n"
        "_setup_logging()\n"
        "run_simulated(json.loads(sys.argv[1]), sys.argv[2], threads=1, checkpoint_every=1)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, json.dumps(cfg), str(out)], env=env, capture_output=True, text=True, cwd=ROOT
    )


@pytest.mark.slow
@pytest.mark.federation
def test_a_killed_simulation_resumes_and_ends_as_the_engine_byte_for_byte(tmp_path, tiny_task):
    """SIGKILL in round 3 after the sites trained (their state past round 2's checkpoint), then a
    rerun on the same folder: it resumes after round 2, the sites going back to their snapshots of
    it, and ends with the uninterrupted engine run's files byte for byte, the test-only cohort's
    scores included (site C, a simulated node of its own, scored after the last round). Two Ray
    starts (about 20 s each on an idle machine)."""
    from fedmedbench.federation.simulation import SITES_FOLDER
    from fedmedbench.fl.engine import run_training

    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=3, clients=["A", "B"], ood_clients=["C"])
    run_training(cfg, tmp_path / "engine", threads=1, progress=False)
    out = tmp_path / "flower"
    killed = run_simulated_in_a_process(cfg, out, kill_at="round_trained:3")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (out / "checkpoint.pt").is_file() and not (out / "final.json").exists()
    (state,) = (out / SITES_FOLDER).glob("run-*")  # one state folder, keyed by the run folder
    # Each training site: its state file (mid-round 3) and its snapshots of the checkpointed rounds 1
    # and 2 (the cohort, which trains nothing, may keep its own).
    kept = {p.name for p in state.iterdir()}
    assert {f"{c}{s}.pt" for c in "AB" for s in ("", ".round-1", ".round-2")} <= kept and all(
        n.startswith(("A", "B", "C")) for n in kept
    ), kept

    resumed = run_simulated_in_a_process(cfg, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "after round 2" in resumed.stderr and "resumed from" in resumed.stderr
    for name in ("final.json", "history.csv", "model_best.pt", "predictions.npz"):
        assert filecmp.cmp(tmp_path / "engine" / name, out / name, shallow=False), name
    final = json.loads((out / "final.json").read_text())
    assert set(final["ood"]) == {"C"} and final == json.loads((tmp_path / "engine" / "final.json").read_text())
    assert json.loads((out / "federation.json").read_text())["sites"] == 2
    # Finished: the checkpoint and the sites' state are gone with it.
    assert sorted(p.name for p in out.iterdir()) == [
        "federation.json",
        "final.json",
        "history.csv",
        "model_best.pt",
        "predictions.npz",
        "run_config.json",
    ]


def fake_simulation(monkeypatch, write_final=False):
    """Flower's ``run_simulation`` replaced by one that records the ServerApp's settings and the
    sites' node configs (and writes final.json, or nothing as a failed ServerApp): the run folder
    handling around it, without Ray."""
    import flwr.simulation

    from fedmedbench.federation import simulation

    seen = {}
    monkeypatch.setattr(simulation, "server_app", lambda settings: seen.setdefault("settings", settings))
    monkeypatch.setattr(simulation, "client_app", lambda sites, out=None: seen.update(sites=sites, out=out))

    def run_simulation(server_app, client_app, num_supernodes, backend_config):
        seen["files"] = sorted(
            str(p.relative_to(Path(seen["settings"]["out"]))) for p in Path(seen["settings"]["out"]).rglob("*")
        )
        if write_final:
            (Path(seen["settings"]["out"]) / "final.json").write_text("{}")

    monkeypatch.setattr(flwr.simulation, "run_simulation", run_simulation)
    return seen


def test_a_killed_older_style_run_folder_starts_afresh_and_keeps_nothing_of_it(
    tmp_path, tiny_task, monkeypatch, caplog
):
    """Before the sites kept their state in the run folder, a killed job left a checkpoint (written
    after the last round) and its scratch folder: no site can go back to that checkpoint, so the
    rerun starts afresh (resume off), removing both, and says so in one line."""
    from fedmedbench.errors import FedmedbenchError
    from fedmedbench.federation.simulation import SITES_FOLDER, run_simulated

    store, split = tiny_task
    out = tmp_path / "flower"
    (out / ".flower-simulation-k2j4x" / "sites" / "run-1234").mkdir(parents=True)
    (out / ".flower-simulation-k2j4x" / "run.json").write_text("{}")
    (out / "checkpoint.pt").write_bytes(b"FMBCKPT3")
    (out / "checkpoint.pt.prev").write_bytes(b"FMBCKPT3")
    seen = fake_simulation(monkeypatch)
    with pytest.raises(FedmedbenchError, match="ended without final.json"):  # the fake trains nothing
        run_simulated(tiny_run_config(store, split), out, threads=1, checkpoint_every=2, checkpoint_every_seconds=30)
    assert seen["settings"]["resume"] is False
    assert [r.getMessage() for r in caplog.records if "starts afresh" in r.getMessage()] == [
        f"{out / 'checkpoint.pt'}: the simulated sites' state of this checkpoint is not in {out / SITES_FOLDER} (a job from before the sites kept it there, or a moved run folder); training starts afresh"
    ]
    # What Flower's run found: the run config in the sites' folder, no old scratch, no old checkpoint.
    assert seen["files"] == [SITES_FOLDER, f"{SITES_FOLDER}/run.json", ".train.lock"]
    # The engine's cadence reaches the server; the sites keep their state in the run folder, keyed by it.
    assert (seen["settings"]["checkpoint-every"], seen["settings"]["checkpoint-every-seconds"]) == (2, 30.0)
    assert seen["out"] == seen["settings"]["out"] == str(out)
    assert {site["state-dir"] for site in seen["sites"].values()} == {str(out / SITES_FOLDER)}
    # Failed before any checkpoint: nothing to resume, so the sites' folder goes too.
    assert sorted(p.name for p in out.iterdir()) == []


def test_a_checkpoint_beside_the_sites_state_is_resumed_and_kept_until_the_run_ends(tmp_path, tiny_task, monkeypatch):
    from fedmedbench.errors import FedmedbenchError
    from fedmedbench.federation.simulation import SITES_FOLDER, run_simulated, sites_state_folder

    store, split = tiny_task
    out = tmp_path / "flower"
    state = sites_state_folder(out.resolve())
    state.mkdir(parents=True)
    (state / "A.round-2.pt").write_bytes(b"site A at the end of round 2")
    (out / "checkpoint.pt").write_bytes(b"FMBCKPT3")
    seen = fake_simulation(monkeypatch)
    with pytest.raises(FedmedbenchError, match="ended without final.json"):
        run_simulated(tiny_run_config(store, split), out, threads=1)
    assert seen["settings"]["resume"] is True and seen["settings"]["checkpoint-every"] == 1
    # A failed rerun keeps what the next one resumes from.
    assert (out / "checkpoint.pt").is_file() and (
        state / "A.round-2.pt"
    ).read_bytes() == b"site A at the end of round 2"

    (out / "checkpoint.pt").unlink()  # what serve's write_outputs does once final.json is written
    fake_simulation(monkeypatch, write_final=True)
    assert run_simulated(tiny_run_config(store, split), out, threads=1) == {}
    assert not (out / SITES_FOLDER).exists() and sorted(p.name for p in out.iterdir()) == ["final.json"]


def test_a_bad_checkpoint_cadence_is_refused_before_ray_starts(tmp_path, tiny_task):
    from fedmedbench.federation.simulation import run_simulated

    store, split = tiny_task
    with pytest.raises(ConfigError, match=r"checkpoint_every: expected an integer >= 1, got 0"):
        run_simulated(tiny_run_config(store, split), tmp_path / "flower", checkpoint_every=0)
    with pytest.raises(ConfigError, match=r"checkpoint_every_seconds: expected a number of seconds >= 0, got -1"):
        run_simulated(tiny_run_config(store, split), tmp_path / "flower", checkpoint_every_seconds=-1)
    assert not (tmp_path / "flower").exists()


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
@pytest.mark.federation
def test_a_snakemake_table_holds_an_engine_row_and_a_flower_row_with_equal_digits(tmp_path):
    (tmp_path / "config").mkdir()
    shutil.copy(
        ROOT / "config" / "config.yaml", tmp_path / "config" / "config.yaml"
    )  # the Snakefile's default configfile
    (tmp_path / "flower.yaml").write_text(yaml.safe_dump(OVERLAY))
    out = tmp_path / "results" / "e2e"
    targets = [
        f"results/e2e/tables/{TABLE}.{ext}" for ext in ("md", "csv")
    ]  # relative to --directory, as the rules' outputs
    configs = [*map(str, CONFIGFILES), str(tmp_path / "flower.yaml")]
    command = [
        str(BIN / "snakemake"),
        "-s",
        str(ROOT / "workflow" / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--cores",
        "2",
        *targets,
        "--configfile",
        *configs,
    ]
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path)}
    # Under the job server, as `make demo` runs: the Flower job starts Ray from a forked warm process.
    run = subprocess.run(
        [str(BIN / "python"), "-m", "fedmedbench", "with-jobserver", *command],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    logs = (
        "".join(p.read_text()[-3000:] for p in (out / "logs" / "train").rglob("*.log"))
        if (out / "logs").is_dir()
        else ""
    )
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
        assert filecmp.cmp(runs / "fedavg" / "seed0" / name, runs / "fedavg-flower" / "seed0" / name, shallow=False), (
            name
        )
    engine_final = json.loads((runs / "fedavg" / "seed0" / "final.json").read_text())
    flower_final = json.loads((runs / "fedavg-flower" / "seed0" / "final.json").read_text())
    assert "runtime" not in engine_final["config"] and flower_final["config"]["runtime"] == "flower-simulation"
    assert engine_final["test"] == flower_final["test"] and engine_final["selection"] == flower_final["selection"]
