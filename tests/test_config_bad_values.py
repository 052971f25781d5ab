"""Values that pass a range check but are no numbers (NaN, infinity), and a null data section, are
refused when the config is checked, before any job, in one line naming the key."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from fedmedbench import config as cfgmod
from fedmedbench.errors import ConfigError
from fedmedbench.registry import available_methods, param_schemas
from fedmedbench.runconfig import RunConfig
from tests.conftest import tiny_run_config

ROOT = Path(__file__).resolve().parents[1]
BASE = cfgmod.load_config(ROOT / "config" / "config.yaml")
NON_FINITE = [(math.nan, ".nan"), (math.inf, ".inf"), (-math.inf, "-.inf")]


def numeric_paths(schema: dict, path: str = ""):
    """(key path, how the value is nested) of every number or integer the schema declares, arrays of
    numbers included (their first item): e.g. optimizer.lr, optimizer.betas[0], fractions[0]."""
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if "number" in types or "integer" in types:
        yield path
    if "array" in types and isinstance(schema.get("items"), dict):
        yield from numeric_paths(schema["items"], f"{path}[0]")
    for key, sub in (schema.get("properties") or {}).items():
        yield from numeric_paths(sub, f"{path}.{key}" if path else key)


def put(path: str, value):
    """{'optimizer': {'betas': [value]}} for 'optimizer.betas[0]'."""
    for part in reversed(path.split(".")):
        name, _, index = part.partition("[")
        if index:
            value = [value]
        value = {name: value}
    return value


TASK_KEYS = list(numeric_paths(cfgmod.schema()["properties"]["tasks"]["additionalProperties"]))
FOLDERS_KEYS = list(numeric_paths(cfgmod.schema()["properties"]["data"]["additionalProperties"]["then"]))
# The walk finds the issue's keys (and so every other number the schema declares).
assert {"optimizer.lr", "optimizer.betas[0]", "intensity_scale", "selection_window", "rounds"} <= set(TASK_KEYS)
assert {"fractions[0]", "seed", "image_size"} <= set(FOLDERS_KEYS)


@pytest.mark.parametrize("path", TASK_KEYS)
@pytest.mark.parametrize(("value", "shown"), NON_FINITE, ids=[s for _, s in NON_FINITE])
def test_every_numeric_task_key_refuses_nan_and_infinity(path, value, shown):
    config = cfgmod.deep_merge(BASE, {"tasks": {"prostate": put(path, value)}})
    with pytest.raises(ConfigError) as err:
        cfgmod.validate(config, "overlay.yaml")
    assert str(err.value).startswith(f"overlay.yaml: tasks.prostate.{path}: expected a finite number, got {shown}"), (
        err.value
    )


@pytest.mark.parametrize("path", FOLDERS_KEYS)
def test_every_numeric_key_of_a_users_data_section_refuses_nan(path):
    config = cfgmod.deep_merge(BASE, {"data": {"mine": {"family": "folders", "root": "x", **put(path, math.nan)}}})
    with pytest.raises(
        ConfigError, match=re.escape(f"overlay.yaml: data.mine.{path}: expected a finite number, got .nan")
    ):
        cfgmod.validate(config, "overlay.yaml")


def method_numeric_keys():
    for method in available_methods():
        for key, schema in param_schemas(method).items():
            if set(numeric_paths(schema)) == {""}:
                yield pytest.param(method, key, id=f"{method}.{key}")


@pytest.mark.parametrize(("method", "key"), list(method_numeric_keys()))
def test_every_numeric_method_parameter_refuses_nan_and_infinity_directly_and_in_a_variant(method, key):
    for value, shown in NON_FINITE:
        with pytest.raises(
            ConfigError, match=re.escape(f"methods.{method}.{key}: expected a finite number, got {shown}")
        ):
            cfgmod.validate(cfgmod.deep_merge(BASE, {"methods": {method: {key: value}}}), "overlay.yaml")
        with pytest.raises(
            ConfigError, match=re.escape(f"methods.{method}.variants.bad.{key}: expected a finite number, got {shown}")
        ):
            cfgmod.validate(
                cfgmod.deep_merge(BASE, {"methods": {method: {"variants": {"bad": {key: value}}}}}), "overlay.yaml"
            )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("tasks: {prostate: {optimizer: {lr: .nan}}}", "tasks.prostate.optimizer.lr"),
        ("tasks: {prostate: {optimizer: {lr: .inf}}}", "tasks.prostate.optimizer.lr"),
        ("methods: {fedprox: {mu: .nan}}", "methods.fedprox.mu"),
    ],
)
def test_the_issues_overlays_stop_at_the_check_with_one_line(tmp_path, text, key, capsys, monkeypatch):
    """The issue's cases, as a user types them, through the CLI: one line naming the key, exit 1,
    before any job (estimate would time rounds next)."""
    from fedmedbench import cli, estimate

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(text + "\n")
    monkeypatch.setattr(estimate, "jobs_of", lambda *a, **k: pytest.fail("a job was planned"))
    assert cli.main(["estimate", "--config", str(ROOT / "config" / "config.yaml"), str(overlay)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f": {key}: expected a finite number, got ." in line, line


def test_a_hand_written_run_config_refuses_nan_and_infinity():
    cfg = tiny_run_config("s", "p")
    for change, key in (
        ({"optimizer": {**cfg["optimizer"], "lr": math.nan}}, "optimizer.lr"),
        ({"intensity_scale": math.inf}, "intensity_scale"),
        ({"optimizer": {**cfg["optimizer"], "betas": [0.9, math.nan]}}, "optimizer.betas[1]"),
    ):
        with pytest.raises(ConfigError, match=re.escape(f"run config.{key}: expected a finite number, got ")):
            RunConfig.from_dict(json.loads(json.dumps({**cfg, **change})))  # json reads NaN and Infinity


def test_a_null_data_section_is_named_not_the_task_on_it(tmp_path):
    """A task on a user's data is completed from its data section; with that section null the task
    lacks `protocol`, and that was the error told (tasks.mysites: 'protocol' is a required property)."""
    overlay = tmp_path / "null.yaml"
    overlay.write_text("data:\n  mysites: null\n")
    with pytest.raises(ConfigError) as err:
        cfgmod.load_config(ROOT / "config" / "config.yaml", ROOT / "examples" / "your_data.yaml", overlay)
    assert str(err.value).endswith("data.mysites: expected object, got null"), err.value
