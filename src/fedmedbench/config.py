"""Pipeline configuration: load + validate config.yaml (and overlays), resolve one run's config.

Used by the Snakefile (workflow/rules/common.smk) and the CLI, so a training job's config is the
same whether Snakemake or a person starts it. No torch import here: the Snakefile loads this module.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedmedbench.errors import ConfigError, unknown_key
from fedmedbench.runconfig import RunConfig, Strict, field_names

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
SCHEMA = PACKAGE_ROOT / "workflow" / "schemas" / "config.schema.yaml"

# Run-config keys a task section may set; its other keys (dataset, protocol) say which data to use.
RUN_IDENTITY_KEYS = ("task", "method", "variant", "run", "seed", "data", "method_params")
TRAINING_KEYS = tuple(k for k in field_names(RunConfig) if k not in RUN_IDENTITY_KEYS)


def deep_merge(base: dict, overlay: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def validate(config: dict, source: str = "config") -> None:
    """The schema (types, ranges, no unknown keys at any level), then every method's parameters and
    variants against the method's DEFAULTS. Errors name the key and suggest the closest spelling."""
    import jsonschema

    schema = yaml.safe_load(SCHEMA.read_text())
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(config))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = error.schema.get("properties", {})
            extra = [k for k in error.instance if k not in allowed]
            raise unknown_key(f"{source}: {where}", extra[0], allowed)
        raise ConfigError(f"{source}: invalid config at {where}: {error.message}")
    for method, section in config.get("methods", {}).items():
        check_method_section(method, section or {}, f"{source}: methods.{method}")


def check_method_section(method: str, section: dict, where: str) -> None:
    from fedmedbench.methods import merge_params

    params = {k: v for k, v in section.items() if k != "variants"}
    merge_params(method, params, where)
    known = set(params) | set(merge_params(method, {}, where)) | set(TRAINING_KEYS)
    for variant, changes in (section.get("variants") or {}).items():
        for key in changes:
            if key not in known:
                raise unknown_key(f"{where}.variants.{variant}", key, known)


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
    from fedmedbench.methods import merge_params

    params = merge_params(method, {k: v for k, v in section.items() if k != "variants"}, f"methods.{method}")
    overrides: dict = {}
    if variant is not None:
        variants = section.get("variants", {})
        if variant not in variants:
            raise ConfigError(f"run {run!r}: no variant {variant!r} under methods.{method}.variants (have: {sorted(variants)})")
        for key, value in variants[variant].items():
            if key in params:
                params[key] = value
            else:
                overrides[key] = value
    return params, overrides


def resolve_run(config: dict, task: str, run: str, seed: int) -> dict:
    """The fully resolved configuration of one training run: everything that can change its numbers,
    defaults included (read strictly through RunConfig, so a wrong key fails here, at DAG time)."""
    if task not in config["tasks"]:
        raise ConfigError(f"unknown task {task!r}; tasks in the config: {', '.join(config['tasks'])}")
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
    resolved = deep_merge(cfg, overrides)
    return RunConfig.from_dict(resolved, where=f"tasks.{task} (run {run})").to_dict()


@dataclass(frozen=True)
class Experiment(Strict):
    """One paper table or figure (``experiments.<name>`` in config.yaml), every default in one place.
    The schema checks the types; which keys a kind needs is in the schema's ``allOf``."""

    title: str
    seeds: tuple[int, ...]
    kind: str = "table"  # the schema lists the kinds (experiments.*.kind)
    task: str | None = None
    tasks: tuple[str, ...] = ()  # kinds over several tasks (qualitative, ampnorm)
    runs: tuple[str, ...] = ()
    labels: dict = field(default_factory=dict)  # run -> display name
    paper_ids: dict = field(default_factory=dict)  # run -> the paper table's row id
    metric: str | None = None
    paper_table: str | None = None
    paper_metric: str | None = None  # table: the paper CSV's metric when it holds several
    cohort: str | None = None  # ood_table: the test-only client
    client: str | None = None  # retrogress: the client whose local-epoch curve is drawn
    std_row: bool = False  # table: Fed-LWR's Std column (population std across clients)
    select_on: str = "val"  # table: val | test (the official Fed-LWR selection, a switch)
    series: dict = field(default_factory=dict)  # sweep: legend label -> {x value: run}
    error: str = "seeds"  # sweep: seeds | clients_sem
    x_label: str = "value"
    log_x: bool = False
    per_client: int = 1  # qualitative: rows per client
    clients: dict = field(default_factory=dict)  # qualitative: task -> clients shown
    # Added by the workflow for the jobs that draw and report (workflow/rules/common.smk).
    task_specs: dict = field(default_factory=dict)
    figure: str | None = None

    def task_names(self) -> tuple[str, ...]:
        return self.tasks or (self.task,)

    def run_names(self) -> list[str]:
        """Runs in display order (a sweep's runs come from its series)."""
        if self.series:
            return list(dict.fromkeys(run for runs in self.series.values() for run in runs.values()))
        return list(dict.fromkeys(self.runs))

    def label(self, run: str) -> str:
        return self.labels.get(run, run)

    def paper_id_map(self) -> dict[str, str]:
        """run -> the paper table's row id (default: the method name, the run without its variant)."""
        return {run: self.paper_ids.get(run, run.split("-")[0]) for run in self.runs}


def experiment(config: dict, name: str) -> Experiment:
    return Experiment.from_dict(config["experiments"][name], where=f"experiments.{name}")


def experiment_kind(config: dict, name: str) -> str:
    return experiment(config, name).kind


def experiment_runs(config: dict, name: str) -> list[tuple[str, str, int]]:
    """(task, run, seed) of every training job an experiment needs."""
    spec = experiment(config, name)
    return [(task, run, seed) for task in spec.task_names() for run in spec.run_names() for seed in spec.seeds]


def train_dir(config: dict, task: str, run: str, seed: int) -> Path:
    return results_root(config) / "train" / task / run / f"seed{seed}"
