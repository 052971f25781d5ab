"""Pipeline configuration: load + validate config.yaml (and overlays), resolve one run's config.

Used by the Snakefile (workflow/rules/common.smk) and the CLI, so a training job's config is the
same whether Snakemake or a person starts it. No torch import here: the Snakefile loads this module.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fedmedbench import values
from fedmedbench.errors import ConfigError, closest, unknown_key
from fedmedbench.runconfig import RunConfig, Strict, field_names
from fedmedbench.schema import SCHEMA, YAML_LOADER, schema  # noqa: F401  (SCHEMA: config.SCHEMA for callers)

# Start-up: the CLI imports this module for every command, --help included, and the Snakefile at DAG
# time. What only some calls need is imported in the function that needs it (noqa: PLC0415): the
# method registry (~30 ms: ast, importlib.metadata), jsonschema (~55 ms) and fedmedbench.data.folders
# (~350 ms: numpy, pandas; only for a `family: folders` data section).

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# The workflow's configuration, relative to the working directory, where the Snakemake workflow
# catalog's layout puts it (the Snakefile's `configfile:`, the CLI's default --config).
DEFAULT_CONFIG = Path("config") / "config.yaml"

# Run-config keys a task section may set; its other keys (dataset, protocol) say which data to use.
RUN_IDENTITY_KEYS = (
    "task",
    "method",
    "variant",
    "run",
    "seed",
    "data",
    "method_params",
    "method_module",
    "method_digest",
)
TRAINING_KEYS = tuple(k for k in field_names(RunConfig) if k not in RUN_IDENTITY_KEYS)


def deep_merge(base: dict, overlay: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _relaxed(node):
    """The schema without ``required`` anywhere: what a partial override (a variant's ``optimizer:
    {lr: ...}``, merged into the task's) must satisfy."""
    if isinstance(node, dict):
        return {k: _relaxed(v) for k, v in node.items() if k != "required"}
    if isinstance(node, list):
        return [_relaxed(v) for v in node]
    return node


BUILTIN_FAMILIES = ("prostate", "camelyon17", "nuclei", "skin", "fundus")
USER_PROTOCOL = "default"  # the one protocol of a user's own data (`family: folders`)

# A task on a user's own data needs only `dataset` and `kind`: the rest comes from here (and its
# `clients` from the sites found). Any key the task sets wins.
KIND_DEFAULTS = {
    "segmentation": {
        "model": {"name": "unet", "init_features": 32, "in_channels": 3},
        "loss": "dice_ce",
        "optimizer": {"name": "adam", "lr": 1.0e-3, "betas": [0.9, 0.99], "weight_decay": 1.0e-4},
        "rounds": 100, "local_epochs": 1, "batch_size": 8, "augment": "none",
        "intensity_scale": 1 / 255, "aggregation": {"weighting": "uniform", "bn_buffers": "average"},
        # Foreground Dice: Dice incl. background (`dice_paper`, the papers' convention) gives an
        # all-background model ~30 % on 3 classes. `selection_metric: dice_paper` on request.
        "selection_metric": "dice_fg",
    },
    "classification": {
        "model": {"name": "densenet", "growth_rate": 32, "block_config": [6, 12, 24, 16], "num_init_features": 64},
        "loss": "ce",
        "optimizer": {"name": "sgd", "lr": 1.0e-3, "momentum": 0.9, "weight_decay": 1.0e-4},
        "rounds": 100, "local_epochs": 1, "batch_size": 32, "augment": "none",
        "intensity_scale": 1 / 255, "aggregation": {"weighting": "uniform", "bn_buffers": "average"},
        "selection_metric": "accuracy",
    },
}  # fmt: skip
# Experiment kinds that draw or tabulate one test metric (`metric`).
METRIC_KINDS = ("table", "sweep", "retrogress", "fairness_curves", "fairness_bars")


def family_of(config: dict, dataset: str) -> str:
    """A data section's family: its `family` key, else its name (`prostate:` is the prostate family)."""
    return (config["data"].get(dataset) or {}).get("family", dataset)


def folders_options(config: dict, dataset: str) -> dict:
    """The `folders` options of a user's data section (what `fedmedbench preprocess --options` reads)."""
    return {k: v for k, v in config["data"][dataset].items() if k not in ("family", "protocols")}


def complete_user_data(config: dict, source: str = "config") -> None:
    """In place: a `family: folders` data section gets its one protocol, and a task on it the per-kind
    defaults, `num_classes` from the declared classes and `clients` = the sites found on disk."""
    data = config.get("data")
    if not isinstance(data, dict) or not any(
        isinstance(s, dict) and s.get("family") == "folders" for s in data.values()
    ):
        return
    from fedmedbench.data import folders  # noqa: PLC0415  (start-up: see the comment at the top)

    options = {}
    for name, section in data.items():
        if isinstance(section, dict) and section.get("family") == "folders":
            section.setdefault("protocols", {USER_PROTOCOL: {}})
            options[name] = folders.FoldersOptions.from_dict(
                folders_options(config, name), where=f"{source}: data.{name}"
            )
    for name, spec in (config.get("tasks") or {}).items():
        if not isinstance(spec, dict) or spec.get("dataset") not in options:
            continue
        found = options[spec["dataset"]]
        kind = spec.get("kind", found.kind)
        if kind != found.kind:
            raise ConfigError(
                f"{source}: tasks.{name}.kind: {kind!r}, but data.{spec['dataset']} holds {found.kind} data"
            )
        sites = folders.discover_sites(found.root, found.kind)
        defaults = {**copy.deepcopy(KIND_DEFAULTS[kind]), "kind": kind, "protocol": USER_PROTOCOL, "clients": sites}
        defaults["model"]["num_classes"] = found.num_classes
        completed = deep_merge(defaults, spec)
        completed.setdefault("client_labels", list(completed["clients"]))
        spec.clear()
        spec.update(completed)
    # A table or figure on a user's task shows the metric its models were selected on, unless it
    # names one: foreground Dice for segmentation by default (KIND_DEFAULTS).
    user_tasks = {
        name
        for name, spec in (config.get("tasks") or {}).items()
        if isinstance(spec, dict) and spec.get("dataset") in options
    }
    for spec in (config.get("experiments") or {}).values():
        if isinstance(spec, dict) and spec.get("task") in user_tasks and spec.get("kind", "table") in METRIC_KINDS:
            spec.setdefault("metric", config["tasks"][spec["task"]]["selection_metric"])


def validate(config: dict, source: str = "config") -> None:
    """Everything a job will read, checked once before any job runs: the schema (types, ranges, no
    unknown keys at any level); every method parameter and variant override against its declaration
    (the method's DEFAULTS/PARAM_SCHEMA, the task schema); and the references between sections
    (an experiment's tasks and runs, a task's dataset and protocol). Errors name the key path and,
    for a variant, the run; a misspelt key gets its closest spelling."""
    import jsonschema  # noqa: PLC0415  (start-up: see the comment at the top)

    for key, value in config.items():  # before the schema: its ranges let .inf through and compare .nan as false
        values.check_finite(value, f"{source}: {key}")
    errors = list(jsonschema.Draft202012Validator(schema()).iter_errors(config))
    # A task on a user's data is completed from its data section (complete_user_data): with that
    # section null or wrong, the task lacks keys because of it, so the data section's error is told.
    error = jsonschema.exceptions.best_match([e for e in errors if list(e.absolute_path)[:1] == ["data"]] or errors)
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = error.schema.get("properties", {})
            extra = [k for k in error.instance if k not in allowed]
            raise unknown_key(f"{source}: {where}", extra[0], allowed)
        if error.validator in ("type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            raise ConfigError(
                f"{source}: {where}: expected {values.describe(error.schema)}, got {json.dumps(error.instance)}"
            )
        raise ConfigError(f"{source}: invalid config at {where}: {error.message}")
    check_names(config, source)
    for method, section in config.get("methods", {}).items():
        check_method_section(method, section or {}, f"{source}: methods.{method}")
    check_references(config, source)


def check_method_section(method: str, section: dict, where: str) -> None:
    """The method's parameters, and each variant's keys: a method parameter (typed by the method)
    or a task key (typed by the task schema, as a partial override)."""
    from fedmedbench.registry import check_param, merge_params  # noqa: PLC0415  (start-up: see the comment at the top)

    module = section.get("module")
    merge_params(method, method_section_params(section), where, module)
    task_keys = _relaxed(schema()["properties"]["tasks"]["additionalProperties"])["properties"]
    params = set(merge_params(method, {}, where, module))
    for variant, changes in (section.get("variants") or {}).items():
        place = f"{where}.variants.{variant} (run {method}-{variant})"
        for key, value in changes.items():
            if key in params:
                check_param(method, key, value, place, module)
            elif key in TRAINING_KEYS and key in task_keys:
                values.check(value, task_keys[key], f"{place}.{key}")
            else:
                raise unknown_key(place, key, params | set(TRAINING_KEYS))


# UNet halves the resolution four times (models/unet.py: four encoders, each followed by a 2x2
# max-pool) and concatenates skip connections of equal size: each side must divide by 2**4.
UNET_POOLINGS = 4
UNET_DIVISOR = 2**UNET_POOLINGS
MODEL_LABELS = {"unet": "UNet", "densenet": "DenseNet", "vgg16_bn": "VGG-16-BN", "vgg_slim": "slim VGG"}


def _model_min_size(model) -> int:
    """The smallest side a classifier can take (its strided layers must leave at least one pixel);
    0 where any size works or the model is unknown. Forward passes confirm it (tests/test_folders_geometry.py)."""
    get = model.get if isinstance(model, dict) else lambda key, default=None: getattr(model, key, default)
    if get("name") in ("vgg16_bn", "vgg_slim"):
        return 32  # five 2x2 max-pools, each rounding down
    if get("name") == "densenet":
        # conv0 (7x7, stride 2) and pool0 (3x3, stride 2) each take s to ceil(s / 2); HarmoFL's
        # ZeroPad2d(2) after the first block adds 4 (models/densenet.py); each of the
        # len(block_config) - 1 transitions halves it (2x2 average pool, rounding down).
        after_pool0 = max(1, 2 ** (len(get("block_config", (6, 12, 24, 16))) - 1) - 4)
        return 4 * after_pool0 - 3
    return 0


def model_size_problem(model, height: int, width: int, task: str | None = None) -> str | None:
    """Why a model (a task's ``model`` mapping or a ``ModelConfig``) cannot take H x W images, or
    None. The text follows the size, e.g. ``100 is not a multiple of 16, which the UNet needs ...``."""
    get = model.get if isinstance(model, dict) else lambda key, default=None: getattr(model, key, default)
    name = get("name")
    of_task = f" of task {task!r}" if task else ""
    label = MODEL_LABELS.get(name, name)
    shown = f"{height}" if height == width else f"{height}x{width} (H x W)"
    if name == "unet":
        bad = [(side, n) for side, n in (("H", height), ("W", width)) if n % UNET_DIVISOR]
        if not bad:
            return None

        def nearest(n: int) -> str:
            low = n // UNET_DIVISOR * UNET_DIVISOR
            return " or ".join(str(v) for v in (low, low + UNET_DIVISOR) if v > 0)

        near = nearest(height) if height == width else ", ".join(f"{nearest(n)} for {side} {n}" for side, n in bad)
        return (
            f"{shown} is not a multiple of {UNET_DIVISOR}, which the {label}{of_task} needs (it halves the resolution "
            f"{UNET_POOLINGS} times); nearest valid sizes: {near}"
        )
    minimum = _model_min_size(model)
    if min(height, width) < minimum:
        return f"{shown} is below {minimum}, the smallest size the {label}{of_task} can take (its strided layers would leave no pixel)"
    return None


def task_image_size(config: dict, task: str, source: str = "config") -> tuple[str, tuple[int, int] | None, str]:
    """(the config key that sets a task's image size, (H, W) or None where it is unknown before
    preprocessing, a note on where the size comes from). A user's data without ``image_size`` keeps
    its native size: the first image's header says it (cheap, read once per DAG build)."""
    spec = config["tasks"][task]
    dataset = spec["dataset"]
    if family_of(config, dataset) == "folders":
        size = config["data"][dataset].get("image_size")
        if size is not None:
            return f"data.{dataset}.image_size", (size, size), ""
        from fedmedbench.data import folders  # noqa: PLC0415  (start-up: see the comment at the top)

        found = folders.reading.native_size(folders_options(config, dataset))
        if found is None:
            return f"data.{dataset}.image_size", None, ""
        height, width, path = found
        return (
            f"data.{dataset}.image_size",
            (height, width),
            f"; it is not set, so the images keep their native size (e.g. {path}): set it to resize them",
        )
    size = ((config["data"][dataset].get("protocols") or {}).get(spec["protocol"]) or {}).get("image_size")
    # A built-in protocol without image_size gets its family's default size (all multiples of 16).
    return f"data.{dataset}.protocols.{spec['protocol']}.image_size", None if size is None else (size, size), ""


def check_references(config: dict, source: str) -> None:
    """Names that point to other sections exist, and sizes fit the models (not a shape error at the
    first training step)."""
    tasks, methods, data = config["tasks"], config.get("methods", {}), config["data"]
    for name in data:
        if family_of(config, name) not in (*BUILTIN_FAMILIES, "folders"):
            raise ConfigError(
                f"{source}: data.{name}: not a built-in dataset family{closest(name, BUILTIN_FAMILIES)} ({', '.join(BUILTIN_FAMILIES)}); "
                f"for your own multi-site data set `family: folders` and `root:` (docs/extending.md)"
            )
    for name, spec in tasks.items():
        where = f"{source}: tasks.{name}"
        if spec["dataset"] not in data:
            raise ConfigError(
                f"{where}.dataset: {spec['dataset']!r} is not a section of data{closest(spec['dataset'], data)}; have: {', '.join(data)}"
            )
        protocols = data[spec["dataset"]].get("protocols") or {}
        if spec["protocol"] not in protocols:
            raise ConfigError(
                f"{where}.protocol: {spec['protocol']!r} is not one of data.{spec['dataset']}.protocols{closest(spec['protocol'], protocols)}; have: {', '.join(protocols)}"
            )
        key, size, note = task_image_size(config, name, source)
        problem = None if size is None else model_size_problem(spec["model"], *size, task=name)
        if problem:
            raise ConfigError(f"{source}: {key}: {problem}{note}")
    for name, spec in config["experiments"].items():
        where = f"{source}: experiments.{name}"
        for task in ([spec["task"]] if "task" in spec else []) + list(spec.get("tasks", [])):
            if task not in tasks:
                raise ConfigError(
                    f"{where}: task {task!r} is not a section of tasks{closest(task, tasks)}; have: {', '.join(tasks)}"
                )
        runs = list(spec.get("runs", [])) + [
            run for series in (spec.get("series") or {}).values() for run in series.values()
        ]
        points = {x for series in (spec.get("series") or {}).values() for x in series}
        unknown = [x for x in spec.get("x_values", []) if x not in points]
        if unknown:
            raise ConfigError(
                f"{where}.x_values: {unknown} are not x values of its series; have: {', '.join(sorted(points))}"
            )
        for run in runs:
            method, variant = split_run(run)
            check_run_method(method, methods, f"{where}: run {run!r}")
            variants = (methods.get(method) or {}).get("variants") or {}
            if variant is not None and variant not in variants:
                raise ConfigError(
                    f"{where}: run {run!r}: no variant {variant!r} under methods.{method}.variants{closest(variant, variants)}; have: {', '.join(variants) or 'none'} "
                    f"(a variant is added as `methods: {{{method}: {{variants: {{{variant}: {{<parameter or task key>: <value>}}}}}}}}`)"
                )
    for name in config.get("selected_experiments") or []:
        if name not in config["experiments"]:
            raise ConfigError(
                f"{source}: selected_experiments: {name!r} is not an experiment{closest(name, config['experiments'])}"
            )


def check_run_method(method: str, methods: dict, where: str) -> None:
    """A run's method is built in, an installed plug-in (its entry point: no section needed, its
    DEFAULTS apply) or a section of ``methods`` (a plug-in by ``module:``); else one line saying
    which YAML lines to add."""
    if method in methods:
        return
    from fedmedbench.registry import available_methods  # noqa: PLC0415  (start-up: see the comment at the top)

    if method in available_methods():
        return
    raise ConfigError(
        f"{where}: method {method!r} is neither built in nor an installed plug-in{closest(method, {*available_methods(), *methods})}; "
        f"for a method of your own, `pip install -e` its package (docs/extending.md) or add its module to the config: "
        f"`methods: {{{method}: {{module: <its import path, e.g. {method}.method>}}}}`"
    )


# Snakemake renders a YAML config file that sets this top-level key as a YTE template: the Python
# in it runs when Snakemake reads the file (snakemake/common/configfile.py: yte.process_yaml).
YTE_KEY = "__use_yte__"


# The most values a YAML file may hold once its aliases (*name) are expanded. config/config.yaml holds
# about 2,000; a "billion laughs" file (each anchor listing the previous one ten times) holds billions
# in a few lines, which the schema check, deepcopy and json would walk for minutes and gigabytes.
MAX_YAML_VALUES = 100_000
MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key, first: int, second: int):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


class TooManyValues(yaml.YAMLError):
    def __init__(self, values: int, key: str):
        super().__init__(key)
        self.values, self.key = values, key


def _yaml_children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _expanded_sizes(root) -> dict[int, int]:
    """id(node) -> its values once every alias is expanded (itself included). An alias is the node
    it names, shared: each node is counted once, so this takes time in the size of the file, not
    of the expansion. An alias inside its own anchor (an endless value): TooManyValues(-1, ...)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _yaml_children(node))
        elif key not in sizes:
            if key in on_path:
                raise TooManyValues(-1, "(an alias inside its own anchor)")
            on_path.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _yaml_children(node) if id(child) not in sizes)
    return sizes


def _largest_key(root, sizes: dict[int, int]) -> str:
    """The key path (through mappings) of the largest value that is over the bound, e.g. tasks.x.clients."""
    path, node = [], root
    while isinstance(node, yaml.MappingNode) and node.value:
        key, value = max(node.value, key=lambda pair: sizes[id(pair[1])])
        if sizes[id(value)] <= MAX_YAML_VALUES or not isinstance(key, yaml.ScalarNode):
            break
        path.append(str(key.value))
        node = value
    return ".".join(path) or "(top level)"


class StrictLoader(YAML_LOADER):
    """YAML_LOADER that refuses a key given twice in one mapping (PyYAML keeps the last one silently)
    and a file whose aliases expand to more than MAX_YAML_VALUES values, before building it."""

    def construct_document(self, node):
        sizes = _expanded_sizes(node)
        if sizes[id(node)] > MAX_YAML_VALUES:
            raise TooManyValues(sizes[id(node)], _largest_key(node, sizes))
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            lines: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue  # `<<: *base` then a key of base: an override, as YAML's merge key means
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in lines:
                        raise DuplicateKey(key, lines[key], key_node.start_mark.line + 1)
                    lines[key] = key_node.start_mark.line + 1
                except TypeError:
                    continue  # an unhashable key: the constructor's own error follows
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path) -> dict:
    """A YAML config file as a mapping; a syntax error is one line with file, line and column; a key
    given twice and an alias bomb are refused (StrictLoader)."""
    try:
        with open(path, encoding="utf-8") as handle:
            loaded = yaml.load(handle, Loader=StrictLoader)
    except DuplicateKey as err:
        raise ConfigError(
            f"{path}: key {err.key!r} is given twice in the same mapping, on lines {err.first} and {err.second}: "
            f"YAML would keep only the second silently; remove one of them"
        ) from None
    except TooManyValues as err:
        if err.values < 0:
            raise ConfigError(
                f"{path}: an alias (*name) inside its own anchor (&name) makes an endless value; refused"
            ) from None
        raise ConfigError(
            f"{path}: {err.key}: its aliases (*name) expand to {err.values:,} values, more than the {MAX_YAML_VALUES:,} "
            f"a config file may hold (an alias bomb?); refused before reading it"
        ) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {err.problem or err.context}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: YAML error: {err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got a {type(loaded).__name__}")
    if YTE_KEY in loaded:
        raise ConfigError(
            f"{path}: {YTE_KEY}: asks Snakemake to run the Python in this file (a YTE template); fedmedbench reads plain "
            f"YAML only, so it is refused (docs/engineering.md: a config overlay or profile is code to Snakemake)"
        )
    return loaded


# A profile folder's settings file as Snakemake names it (profile.yaml, config.yaml, config.v9+.yaml).
PROFILE_FILE = re.compile(r"^(profile|config)(\.v\d+\+)?\.yaml$")


def refuse_templated_configs(command: list[str]) -> None:
    """Before ``with-jobserver`` starts ``command``: Snakemake runs a YTE template in a profile or a
    --configfile while it reads its arguments, before the Snakefile could refuse it, so every YAML
    file the command names, the settings files of every folder it names (a profile) and the config
    files those list are read by read_yaml first, which refuses ``__use_yte__``. No model of
    Snakemake's options: any argument (``--opt=value`` too) that is such a file or folder counts."""
    for arg in command[1:]:
        path = arg.partition("=")[2] if arg.startswith("-") else arg
        if not path:
            continue
        if os.path.isdir(path):  # os.path: False, not an error, for an argument too long to be a path
            files = sorted(p for p in Path(path).iterdir() if PROFILE_FILE.match(p.name))
        else:
            files = [path] if path.endswith((".yaml", ".yml")) and os.path.isfile(path) else []
        for found in files:
            listed = read_yaml(found)
            for key in ("configfile", "configfiles"):
                value = listed.get(key)
                for listed_file in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
                    if os.path.isfile(str(listed_file)):
                        read_yaml(listed_file)


def load_config(*paths: Path) -> dict:
    config: dict = {}
    for path in paths:
        config = deep_merge(config, read_yaml(path))
    complete_user_data(config, " + ".join(str(p) for p in paths))
    validate(config, " + ".join(str(p) for p in paths))
    return config


def results_root(config: dict) -> Path:
    return Path(config.get("results_dir", "results")) / config["run_name"]


# Names that become folders of the results and Snakemake wildcard values (run_name, data sections,
# tasks, experiments, paper tables): one plain path component each, so no output path can leave
# <results_dir>/<run_name>/ ('..', '/', an absolute path) and none holds a Snakemake wildcard brace.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
NAME_RULE = "letters, digits and _ . + -, not starting with '.'"
# A method's name is the first part of a run name (`fedprox-mu0.1`) and a protocol a wildcard of its
# own: both the workflow's wildcard patterns (workflow/rules/common.smk).
METHOD_PATTERN = re.compile(r"^[a-z0-9_]+$")
RUN_PATTERN = re.compile(r"^[a-z0-9_]+(-[A-Za-z0-9_.]+)?$")


def plain_folder_name(name) -> bool:
    """A site (client) name that is one folder of the store: not empty, not `.`/`..`, no separator,
    not hidden (the data layer's rule, fedmedbench.data.store)."""
    return (
        isinstance(name, str)
        and bool(name)
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def check_results_dir(config: dict, source: str = "config") -> None:
    """`results_dir` is a folder of its own (anywhere, e.g. a scratch disk), never the working
    directory, this checkout, or a folder above them: `run_name` folders are made inside it."""
    value = config.get("results_dir", "results")
    if "{" in value or "}" in value:
        raise ConfigError(
            f"{source}: results_dir: {value!r} holds a brace, which Snakemake reads as a wildcard in every output path"
        )
    resolved = Path(value or ".").resolve()
    for protected, what in (
        (Path.cwd().resolve(), "the working directory"),
        (PACKAGE_ROOT, "the fedmedbench checkout"),
    ):
        if resolved == protected or resolved in protected.parents:
            raise ConfigError(
                f"{source}: results_dir: {value!r} is {what} ({protected}) or a folder above it; give a folder of its own (default: results)"
            )


def check_names(config: dict, source: str = "config") -> None:
    """Every name that becomes part of an output path is one plain folder name, so every path the
    workflow builds (results_root, task_data_dir, train_dir, tables/<experiment>.md, ...) lies inside
    <results_dir>/<run_name>/; and every site a task reads is one folder of its store. One line
    naming the key and the name."""

    def name(value, where: str, what: str, pattern=NAME_PATTERN, rule=NAME_RULE, inside=None) -> None:
        if not isinstance(value, str) or not pattern.match(value):
            raise ConfigError(
                f"{source}: {where}: {what} {value!r} must be a plain name ({rule}): it becomes a folder or file name "
                f"under {inside or root + '/'}, and no name may lead outside it"
            )

    root = config.get("results_dir", "results")
    check_results_dir(config, source)
    name(config["run_name"], "run_name", "the run name")
    for dataset, section in config["data"].items():
        name(dataset, "data", "the data section name")
        for protocol in (section or {}).get("protocols") or {}:
            name(
                protocol,
                f"data.{dataset}.protocols",
                "the protocol name",
                METHOD_PATTERN,
                "lowercase letters, digits and _",
            )
    for task, spec in config["tasks"].items():
        name(task, "tasks", "the task name")
        for key in ("clients", "ood_clients"):
            for site in spec.get(key) or ():
                if not plain_folder_name(site):
                    raise ConfigError(
                        f"{source}: tasks.{task}.{key}: the site {site!r} is not one folder name of the store (no '/', not starting with '.')"
                    )
    for method in config.get("methods") or {}:
        name(
            method,
            "methods",
            "the method name",
            METHOD_PATTERN,
            "lowercase letters, digits and _; a '-' would start a variant in a run name",
        )
    for experiment, spec in config["experiments"].items():
        name(experiment, "experiments", "the experiment name")
        if spec.get("paper_table") is not None:
            name(
                spec["paper_table"],
                f"experiments.{experiment}.paper_table",
                "the paper table",
                inside="resources/paper_tables/",
            )
        for label, series in (spec.get("series") or {}).items():
            for run in series.values():
                name(
                    run,
                    f"experiments.{experiment}.series.{label}",
                    "the run",
                    RUN_PATTERN,
                    "method or method-variant, e.g. fedprox-mu0.1",
                )


# Task keys that say how to run, not what: they change no number, so no job's params hold them.
EXECUTION_KEYS = ("checkpoint_every", "hook_timeout_s")


def task_spec_for_params(config: dict, task: str) -> dict:
    """A task section without its execution keys (what report jobs receive as params)."""
    return {k: v for k, v in config["tasks"][task].items() if k not in EXECUTION_KEYS}


def checkpoint_every(config: dict, task: str) -> int:
    """How often a task's jobs checkpoint (every round by default). Not part of the run config: it
    cannot change a number, so changing it re-runs nothing and keeps a killed job's checkpoint."""
    return config["tasks"][task].get("checkpoint_every", 1)


def hook_timeout_s(config: dict, task: str) -> float | None:
    """The seconds a method hook of a task's jobs may run before it is ended with a line naming it
    (None: no limit, the default). Not part of the run config, as ``checkpoint_every``."""
    return config["tasks"][task].get("hook_timeout_s")


def task_data_dir(config: dict, task: str) -> Path:
    spec = config["tasks"][task]
    return results_root(config) / "data" / spec["dataset"] / spec["protocol"]


def split_run(run: str) -> tuple[str, str | None]:
    """``fedprox-mu0.1`` -> (``fedprox``, ``mu0.1``); ``fedavg`` -> (``fedavg``, None)."""
    method, _, variant = run.partition("-")
    return method, (variant or None)


# Keys of a `methods.<name>` section that are not hyperparameters of the method.
SECTION_KEYS = ("variants", "module")


def method_section_params(section: dict) -> dict:
    return {k: v for k, v in section.items() if k not in SECTION_KEYS}


def method_params(config: dict, run: str) -> tuple[dict, dict]:
    """(method hyperparameters, run-config overrides) of a run. A variant's keys that name a method
    hyperparameter change it; any other key overrides the run config (e.g. ``local_epochs``)."""
    method, variant = split_run(run)
    check_run_method(method, config.get("methods") or {}, f"run {run!r}")
    section = config.get("methods", {}).get(method) or {}  # none: a built-in's or installed plug-in's DEFAULTS
    from fedmedbench.registry import merge_params  # noqa: PLC0415  (start-up: see the comment at the top)

    params = merge_params(method, method_section_params(section), f"methods.{method}", section.get("module"))
    overrides: dict = {}
    if variant is not None:
        variants = section.get("variants", {})
        if variant not in variants:
            raise ConfigError(
                f"run {run!r}: no variant {variant!r} under methods.{method}.variants (have: {sorted(variants)})"
            )
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
    from fedmedbench.registry import find_method  # noqa: PLC0415  (start-up: see the comment at the top)

    spec = config["tasks"][task]
    method, variant = split_run(run)
    params, overrides = method_params(config, run)
    data_dir = task_data_dir(config, task)
    cfg = {key: copy.deepcopy(spec[key]) for key in TRAINING_KEYS if key in spec}
    ref = find_method(method, (config["methods"].get(method) or {}).get("module"))
    cfg.update(
        task=task,
        method=method,
        # A plug-in's module and a digest of its source: editing it re-runs exactly its jobs.
        method_module=None if ref.builtin else ref.module,
        method_digest=None if ref.builtin else ref.digest(),
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
    x_values: tuple[str, ...] = ()  # sweep: draw only these x values (default: all); an overlay narrows a sweep with it
    error: str = "seeds"  # sweep: seeds | clients_std | clients_sem (report.sweeps.SWEEP_ERRORS)
    x_label: str = "value"
    log_x: bool = False
    per_client: int = 1  # qualitative: rows per client
    clients: dict = field(default_factory=dict)  # qualitative: task -> clients shown
    notes: tuple[
        str, ...
    ] = ()  # lines the report prints under the table (e.g. what a "(paper)" and an "(official code)" row differ in)
    # Added by the workflow for the jobs that draw and report (workflow/rules/common.smk).
    task_specs: dict = field(default_factory=dict)
    figure: str | None = None

    def task_names(self) -> tuple[str, ...]:
        return self.tasks or (self.task,)

    def run_names(self) -> list[str]:
        """Runs in display order (a sweep's runs come from its series)."""
        if self.series:
            return list(dict.fromkeys(run for runs in self.sweep_series().values() for run in runs.values()))
        return list(dict.fromkeys(self.runs))

    def sweep_series(self) -> dict:
        """The series as drawn: each {x value: run}, narrowed to ``x_values`` when given."""
        if not self.x_values:
            return self.series
        return {name: {x: run for x, run in runs.items() if x in self.x_values} for name, runs in self.series.items()}

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
