"""Pipeline configuration: load + validate config.yaml (and overlays), resolve one run's config.

Used by the Snakefile (workflow/rules/common.smk) and the CLI, so a training job's config is the
same whether Snakemake or a person starts it. No torch import here: the Snakefile loads this module.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SCHEMA = PACKAGE_ROOT / "workflow" / "schemas" / "config.schema.yaml"

# Run-config keys a task section may set (everything else in a task section is data preparation).
TRAINING_KEYS = (
    "kind", "clients", "client_labels", "model", "loss", "optimizer", "rounds", "local_epochs", "batch_size",
    "eval_batch_size", "augment", "intensity_scale", "truncate_to_smallest", "aggregation", "selection_metric",
    "reset_optimizer_each_round", "checkpoint_every", "qualitative_samples",
)  # fmt: skip


def deep_merge(base: dict, overlay: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def validate(config: dict, source: str = "config") -> None:
    import jsonschema

    schema = yaml.safe_load(SCHEMA.read_text())
    try:
        jsonschema.validate(config, schema)
    except jsonschema.ValidationError as err:
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        raise ValueError(f"{source}: invalid config at {where}: {err.message}") from None


def load_config(*paths: Path) -> dict:
    config: dict = {}
    for path in paths:
        with open(path) as handle:
            config = deep_merge(config, yaml.safe_load(handle) or {})
    validate(config, " + ".join(str(p) for p in paths))
    return config


def results_root(config: dict) -> Path:
    return Path(config.get("results_dir", "results")) / config["run_name"]


def task_data_dir(config: dict, task: str) -> Path:
    spec = config["tasks"][task]
    return results_root(config) / "data" / spec["dataset"] / spec["protocol"]


def split_run(run: str) -> tuple[str, str | None]:
    """``fedprox-mu0.1`` -> (``fedprox``, ``mu0.1``); ``fedavg`` -> (``fedavg``, None)."""
    method, _, variant = run.partition("-")
    return method, (variant or None)


def method_params(config: dict, run: str) -> tuple[dict, dict]:
    """(method hyperparameters, run-config overrides) of a run. A variant's keys that name a method
    hyperparameter change it; any other key overrides the run config (e.g. ``local_epochs``)."""
    method, variant = split_run(run)
    section = config.get("methods", {}).get(method)
    if section is None:
        raise ValueError(f"run {run!r}: method {method!r} has no section under 'methods' in the config")
    params = {k: v for k, v in section.items() if k != "variants"}
    overrides: dict = {}
    if variant is not None:
        variants = section.get("variants", {})
        if variant not in variants:
            raise ValueError(f"run {run!r}: no variant {variant!r} under methods.{method}.variants (have: {sorted(variants)})")
        for key, value in variants[variant].items():
            if key in params:
                params[key] = value
            else:
                overrides[key] = value
    return params, overrides


def resolve_run(config: dict, task: str, run: str, seed: int) -> dict:
    """The fully resolved configuration of one training run: everything that can change its numbers."""
    spec = config["tasks"][task]
    method, variant = split_run(run)
    params, overrides = method_params(config, run)
    data_dir = task_data_dir(config, task)
    cfg = {key: copy.deepcopy(spec[key]) for key in TRAINING_KEYS if key in spec}
    cfg.update(
        task=task,
        method=method,
        variant=variant,
        run=run,
        seed=int(seed),
        method_params=params,
        data={
            "store": str(data_dir / "store"),
            "split": str(data_dir / "split.csv"),
            "synthetic": bool(config["data"][spec["dataset"]].get("synthetic", False)),
        },
    )
    return deep_merge(cfg, overrides)


EXPERIMENT_KINDS = ("table", "sweep", "qualitative", "ampnorm")


def experiment_kind(config: dict, experiment: str) -> str:
    return config["experiments"][experiment].get("kind", "table")


def experiment_run_names(spec: dict) -> list[str]:
    """Runs of an experiment in display order (a sweep's runs come from its series)."""
    if "series" in spec:
        names = [run for runs in spec["series"].values() for run in runs.values()]
    else:
        names = spec.get("runs", [])
    return list(dict.fromkeys(names))


def experiment_runs(config: dict, experiment: str) -> list[tuple[str, str, int]]:
    """(task, run, seed) of every training job an experiment needs."""
    spec = config["experiments"][experiment]
    tasks = spec.get("tasks") or [spec["task"]]
    return [(task, run, seed) for task in tasks for run in experiment_run_names(spec) for seed in spec.get("seeds", [])]


def train_dir(config: dict, task: str, run: str, seed: int) -> Path:
    return results_root(config) / "train" / task / run / f"seed{seed}"
