"""The options of a user's own data (`family: folders`) are declared once, in the config's schema:
the config check and the typed options read from it say the same thing about a wrong value."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fedmedbench import config as cfgmod
from fedmedbench.data.folders.options import FoldersOptions, options_schema
from fedmedbench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BASE = cfgmod.load_config(ROOT / "config" / "config.yaml")
KEYS = sorted(options_schema()["properties"])


def test_the_typed_options_are_the_schemas_keys():
    assert sorted(f.name for f in dataclasses.fields(FoldersOptions)) == KEYS
    assert options_schema()["required"] == ["root"]


def wrong_value(key: str):
    """A value of the wrong type for the key: a list where a scalar or mapping is expected, else a number."""
    return 7 if options_schema()["properties"][key].get("type") == "array" else ["x"]


@pytest.mark.parametrize("key", KEYS)
def test_the_config_check_and_the_options_name_the_same_expectation(key):
    section = {"root": "x", key: wrong_value(key)}
    with pytest.raises(ConfigError) as checked:
        cfgmod.validate(cfgmod.deep_merge(BASE, {"data": {"mine": {"family": "folders", **section}}}), "overlay.yaml")
    with pytest.raises(ConfigError) as built:
        FoldersOptions.from_dict(section, where="overlay.yaml: data.mine")
    expected = str(checked.value).partition(", got ")[0]
    assert expected.startswith(f"overlay.yaml: data.mine.{key}: expected ") and str(built.value).startswith(
        expected + ", got "
    )
