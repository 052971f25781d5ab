"""Every value a user gives is checked for type and range when the DAG is built, against one
declaration (the schema for task keys, DEFAULTS/PARAM_SCHEMA for method parameters), through an
overlay and through a variant; the error names the key path (and, for a variant, the run)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedmedbench import config as cfgmod
from fedmedbench import values
from fedmedbench.errors import ConfigError
from fedmedbench.registry import available_methods, method_defaults, param_schemas
from fedmedbench.runconfig import RunConfig
from tests.conftest import tiny_run_config

ROOT = Path(__file__).resolve().parents[1]
BASE = cfgmod.load_config(ROOT / "config" / "config.yaml")
TASK = "prostate"


def bad_values(schema: dict) -> list:
    """Values the declaration must refuse: another type, null (unless nullable), out of range."""
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    out = []
    if "enum" in schema:
        out += ["no-such-choice", None if None not in schema["enum"] else 12345]
    if "boolean" in types:
        out += ["false", "true", 0, 1]
    if "number" in types or "integer" in types:
        out += ["0.01", True]
    if "integer" in types:
        out += [1.5]
    if "string" in types:
        out += [5, True]
    if "array" in types:
        out += ["a,b"]
    if "null" not in types and "enum" not in schema:
        out.append(None)
    for key, delta in (("minimum", -1), ("exclusiveMinimum", 0), ("maximum", 1), ("exclusiveMaximum", 0)):
        if key in schema:
            out.append(schema[key] + delta)
    return out


def method_cases():
    for method in available_methods():
        for key, schema in param_schemas(method).items():
            for value in bad_values(schema):
                yield pytest.param(method, key, value, id=f"{method}.{key}={value!r}")


def task_key_cases():
    properties = cfgmod.schema()["properties"]["tasks"]["additionalProperties"]["properties"]
    for key in cfgmod.TRAINING_KEYS:
        schema = properties[key]
        nested = schema.get("properties")
        if nested:  # optimizer.lr, model.init_features, aggregation.weighting ...
            for sub, sub_schema in nested.items():
                for value in bad_values(sub_schema):
                    yield pytest.param({key: {sub: value}}, f"{key}.{sub}", id=f"{key}.{sub}={value!r}")
        else:
            for value in bad_values(schema):
                yield pytest.param({key: value}, key, id=f"{key}={value!r}")


def with_methods(config: dict, method: str, section: dict) -> dict:
    merged = cfgmod.deep_merge(config, {"methods": {method: section}})
    return merged


@pytest.mark.parametrize(("method", "key", "value"), list(method_cases()))
def test_a_wrong_method_parameter_is_refused_at_dag_time_overlay_and_variant(method, key, value):
    overlay = with_methods(BASE, method, {key: value})
    with pytest.raises(ConfigError, match=rf"methods\.{method}\.{key}: expected "):
        cfgmod.validate(overlay, "overlay.yaml")
    variant = with_methods(BASE, method, {"variants": {"bad": {key: value}}})
    with pytest.raises(ConfigError, match=rf"methods\.{method}\.variants\.bad \(run {method}-bad\)\.{key}: expected "):
        cfgmod.validate(variant, "overlay.yaml")


@pytest.mark.parametrize(("change", "path"), list(task_key_cases()))
def test_a_wrong_task_key_is_refused_at_dag_time_overlay_and_variant(change, path):
    overlay = cfgmod.deep_merge(BASE, {"tasks": {TASK: change}})
    with pytest.raises(ConfigError, match=rf"tasks\.{TASK}\.{path}: expected |tasks\.{TASK}\.{path}: "):
        cfgmod.validate(overlay, "overlay.yaml")
    variant = with_methods(BASE, "fedavg", {"variants": {"bad": change}})
    with pytest.raises(ConfigError, match=rf"methods\.fedavg\.variants\.bad \(run fedavg-bad\)\.{path}: expected "):
        cfgmod.validate(variant, "overlay.yaml")


def test_every_method_parameter_has_a_declared_type():
    for method in available_methods():
        schemas = param_schemas(method)
        assert set(schemas) == set(method_defaults(method)), method
        for key, default in method_defaults(method).items():
            values.check(default, schemas[key], f"{method}.{key}")  # the default satisfies its own declaration


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"amp_norm": "false"}, 'methods.harmofl.amp_norm: expected boolean (true/false, not a string), got "false"'),
        (
            {"variants": {"noamp": {"amp_norm": "false"}}},
            "methods.harmofl.variants.noamp (run harmofl-noamp).amp_norm: expected boolean",
        ),
        (
            {"variants": {"short": {"rounds": 0}}},
            "variants.short (run harmofl-short).rounds: expected integer >= 1, got 0",
        ),
        (
            {"variants": {"short": {"local_epochs": 0}}},
            "(run harmofl-short).local_epochs: expected integer >= 1, got 0",
        ),
        (
            {"variants": {"neg": {"optimizer": {"lr": -0.01}}}},
            "(run harmofl-neg).optimizer.lr: expected number > 0, got -0.01",
        ),
        ({"variants": {"str": {"batch_size": "8"}}}, '(run harmofl-str).batch_size: expected integer >= 1, got "8"'),
        ({"amplitude_mode": "fulll"}, 'methods.harmofl.amplitude_mode: expected one of "full", "dc", got "fulll"'),
    ],
)
def test_the_audit_cases_name_key_run_and_expected_type(section, message):
    with pytest.raises(ConfigError) as err:
        cfgmod.validate(with_methods(BASE, "harmofl", section), "config.yaml")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0.01", 'expected number >= 0, got "0.01"'),
        (None, "expected number >= 0, got null"),
        (-1, "expected number >= 0, got -1"),
    ],
)
def test_fedprox_mu_of_the_wrong_type_is_refused(value, message):
    with pytest.raises(ConfigError, match="methods.fedprox.mu: " + message.replace("(", r"\(")):
        cfgmod.validate(with_methods(BASE, "fedprox", {"mu": value}), "config.yaml")


def test_a_hand_written_run_config_is_read_strictly_too(tmp_path):
    cfg = tiny_run_config("s", "p")
    for key, value, expected in (
        ("truncate_to_smallest", "false", 'truncate_to_smallest: expected a boolean (true/false), got "false"'),
        ("batch_size", "8", 'batch_size: expected an integer, got "8"'),
        ("rounds", True, "rounds: expected an integer, got true"),
    ):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            RunConfig.from_dict({**cfg, key: value})
    from fedmedbench.fl.engine import run_training

    with pytest.raises(ConfigError, match=r"method_params\.mu: expected number >= 0"):
        run_training(
            {**cfg, "method": "fedprox", "run": "fedprox", "method_params": {"mu": "0.01"}},
            tmp_path / "run",
            progress=False,
        )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"experiments": {"harmofl_table1_prostate": {"task": "prostat"}}},
            "experiments.harmofl_table1_prostate: task 'prostat' is not a section of tasks (did you mean 'prostate'?)",
        ),
        (
            {"experiments": {"harmofl_table1_prostate": {"runs": ["fedavg", "fedprox-mu9"]}}},
            "run 'fedprox-mu9': no variant 'mu9' under methods.fedprox.variants",
        ),
        (
            {"experiments": {"harmofl_table1_prostate": {"runs": ["fedavgg"]}}},
            "method 'fedavgg' is neither built in nor an installed plug-in (did you mean 'fedavg'?)",
        ),
        (
            {"tasks": {"prostate": {"protocol": "harmofll"}}},
            "tasks.prostate.protocol: 'harmofll' is not one of data.prostate.protocols (did you mean 'harmofl'?)",
        ),
        (
            {"data": {"prostate": {"protocols": {"harmofl": {"image_size": 100}}}}},
            "data.prostate.protocols.harmofl.image_size: 100 is not a multiple of 16",
        ),
        (
            {"selected_experiments": ["harmofl_tabel1_prostate"]},
            "selected_experiments: 'harmofl_tabel1_prostate' is not an experiment",
        ),
    ],
)
def test_references_and_model_sizes_are_checked_at_dag_time(change, message):
    with pytest.raises(ConfigError) as err:
        cfgmod.validate(cfgmod.deep_merge(BASE, change), "config.yaml")
    assert message in str(err.value)


def test_a_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path):
    bad = tmp_path / "overlay.yaml"
    bad.write_text("tasks:\n  prostate:\n    rounds: [1,\n    batch_size: 4\n  bad: : x\n")
    with pytest.raises(ConfigError, match=rf"{bad}:\d+:\d+: YAML syntax error: "):
        cfgmod.load_config(ROOT / "config" / "config.yaml", bad)
    result = subprocess.run(
        [sys.executable, "-m", "fedmedbench", "train", "--config", str(ROOT / "config" / "config.yaml"), str(bad), "--task", "prostate", "--run", "fedavg", "--seed", "0", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{bad}:5:6: YAML syntax error: " in lines[0], result.stderr


def test_checkpoint_cadence_is_not_part_of_the_run_config():
    config = cfgmod.deep_merge(BASE, {"tasks": {TASK: {"checkpoint_every": 7}}})
    resolved = cfgmod.resolve_run(config, TASK, "fedavg", 0)
    assert resolved == cfgmod.resolve_run(BASE, TASK, "fedavg", 0)
    assert "checkpoint_every" not in json.dumps(resolved)
    assert cfgmod.checkpoint_every(config, TASK) == 7 and cfgmod.checkpoint_every(BASE, "nuclei") == 1


def test_the_demo_overlay_is_valid():
    cfgmod.load_config(ROOT / "config" / "config.yaml", ROOT / "workflow/profiles/demo/demo.yaml")
    assert yaml.safe_load((ROOT / "workflow/profiles/default/config.yaml").read_text())["rerun-incomplete"] is True
