# All Python helpers of the workflow: config validation, paths, target lists, params.
import json
import sys
from pathlib import Path

from snakemake.utils import validate

SRC = Path(workflow.basedir) / "src"
sys.path.insert(0, str(SRC))

from fedmedbench import config as fmb  # noqa: E402  (light: no torch)

validate(config, schema="../schemas/config.schema.yaml")

ROOT = str(fmb.results_root(config))
RESOURCES = str(Path(workflow.basedir) / "resources")
# Jobs run `python -m fedmedbench` from this checkout, so neither the venv nor a conda env needs the
# package installed.
# (The prefix is formatted once more per job, hence the doubled braces.)
shell.prefix(f"export PYTHONPATH='{SRC}'${{{{PYTHONPATH:+:$PYTHONPATH}}}}; ")


wildcard_constraints:
    task="|".join(config["tasks"]),
    dataset="|".join(config["data"]),
    run=r"[a-z0-9_]+(-[A-Za-z0-9_.]+)?",
    seed=r"\d+",
    archive=r"[^/]+\.(zip|tar|tar\.gz|tgz)",
    experiment="|".join(config["experiments"]),


# --- data ---------------------------------------------------------------------------------------
# The archive each dataset family is distributed as (its download spec lives in its data module).
ARCHIVES = {"prostate": "Processed_data_nii.zip"}


def synthetic_options(dataset):
    return config["data"][dataset].get("synthetic_options", {})


def download_source(wildcards, input):
    """A manually downloaded archive wins; the demo fetches its synthetic twin via file://."""
    spec = config["data"][wildcards.dataset]
    if spec.get("synthetic"):
        return Path(input.synthetic).resolve().as_uri()
    return spec.get("archive") or spec["source"]


def download_inputs(wildcards):
    if config["data"][wildcards.dataset].get("synthetic"):
        archive = ARCHIVES[wildcards.dataset]
        return {"synthetic": f"{ROOT}/data/{wildcards.dataset}/synthetic/{archive}"}
    return {}


def sha256_option(wildcards):
    sha = config["data"][wildcards.dataset].get("sha256")
    return f"--sha256 {sha}" if sha else ""


def task_of_protocol(dataset, protocol):
    for name, spec in config["tasks"].items():
        if spec["dataset"] == dataset and spec["protocol"] == protocol:
            return spec
    raise ValueError(f"no task uses dataset {dataset!r} with protocol {protocol!r}")


def preprocess_options(wildcards):
    spec = task_of_protocol(wildcards.dataset, wildcards.protocol)
    options = f"--size {spec['image_size']}" if spec.get("image_size") else ""
    if spec.get("expect_real_counts"):
        options += " --expect-real-counts"
    return options


def split_options(wildcards):
    split = task_of_protocol(wildcards.dataset, wildcards.protocol).get("split", {})
    return f"--permutation {split.get('permutation', 'harmofl')} --seed {split.get('seed', 0)}"


# --- training -----------------------------------------------------------------------------------
def train_inputs(wildcards):
    data_dir = fmb.task_data_dir(config, wildcards.task)
    return {"store": str(data_dir / "store"), "split": str(data_dir / "split.csv")}


def run_dir(wildcards, output):
    return str(Path(output.final).parent)


def run_config_json(wildcards):
    """The fully resolved run config: a change of any setting re-runs exactly the affected jobs."""
    cfg = fmb.resolve_run(config, wildcards.task, wildcards.run, int(wildcards.seed))
    return json.dumps(cfg, sort_keys=True)


# --- experiments, tables, report ----------------------------------------------------------------
def run_files(experiment, name):
    return [
        f"{ROOT}/train/{task}/{run}/seed{seed}/{name}"
        for task, run, seed in fmb.experiment_runs(config, experiment)
    ]


def experiment_finals(wildcards):
    return run_files(wildcards.experiment, "final.json")


def experiment_histories(wildcards):
    return run_files(wildcards.experiment, "history.csv")


def experiment_json(wildcards):
    return json.dumps(config["experiments"][wildcards.experiment], sort_keys=True)


def all_finals(wildcards=None):
    return sorted(
        {f for exp in config["experiments"] for f in run_files(exp, "final.json")}
    )


def experiments_json(wildcards=None):
    experiments = {
        name: {**spec, "figure": f"{ROOT}/figures/{name}_convergence.png"}
        for name, spec in config["experiments"].items()
    }
    return json.dumps(experiments, sort_keys=True)


def all_targets():
    targets = [f"{ROOT}/report.md"]
    for exp in config["experiments"]:
        targets += [f"{ROOT}/tables/{exp}.{ext}" for ext in ("csv", "md", "tex")]
        targets += [f"{ROOT}/figures/{exp}_convergence.{ext}" for ext in ("png", "pdf")]
        targets.append(f"{ROOT}/eval/{exp}/metrics.csv")
    return targets
