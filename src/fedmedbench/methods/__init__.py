"""One file per method, found by name: ``fedmedbench.methods.<name>`` defines ``Server``, ``Client``,
``DEFAULTS`` (its hyperparameters) and ``PERSONALIZED`` (whether each client keeps its own model,
which switches model selection to per-client).

A parameter's type is its default's (bool, int, float, str); ``PARAM_SCHEMA`` (optional, a literal
dict of JSON-Schema fragments) declares ranges, choices and parameters whose default is ``None``.
Both are read from the source without importing the method (no torch at DAG time).
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from fedmedbench import values
from fedmedbench.errors import ConfigError, closest, unknown_key


@functools.lru_cache(maxsize=None)
def available_methods() -> tuple[str, ...]:
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


def _check_name(name: str) -> None:
    if name not in available_methods():
        raise ConfigError(f"unknown method {name!r}{closest(name, available_methods())}; available: {', '.join(available_methods())}")


def load_method(name: str) -> ModuleType:
    _check_name(name)
    return importlib.import_module(f"{__name__}.{name}")


@functools.lru_cache(maxsize=None)
def _declarations(name: str) -> tuple[dict, dict]:
    """(DEFAULTS, PARAM_SCHEMA) as literals from the method's source; parsed once per process
    (Snakemake resolves every job's parameters when it builds the DAG)."""
    _check_name(name)
    found: dict[str, dict] = {}
    for node in ast.parse((Path(__file__).parent / f"{name}.py").read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id in ("DEFAULTS", "PARAM_SCHEMA"):
            found[target.id] = ast.literal_eval(node.value)
    if "DEFAULTS" not in found:
        raise ConfigError(f"method {name!r} defines no literal DEFAULTS")
    return found["DEFAULTS"], found.get("PARAM_SCHEMA", {})


def method_defaults(name: str) -> dict:
    """A method's ``DEFAULTS`` (a copy)."""
    return dict(_declarations(name)[0])


@functools.lru_cache(maxsize=None)
def _param_schemas(name: str) -> dict[str, dict]:
    defaults, declared = _declarations(name)
    for key in declared:
        if key not in defaults:
            raise ConfigError(f"method {name!r}: PARAM_SCHEMA declares {key!r}, which is not in DEFAULTS")
    schemas = {}
    for key, default in defaults.items():
        schema = declared.get(key) or values.inferred_schema(default)
        if schema is None:
            raise ConfigError(f"method {name!r}: parameter {key!r} defaults to {default!r}; declare its type in PARAM_SCHEMA")
        schemas[key] = schema
    return schemas


def param_schemas(name: str) -> dict[str, dict]:
    """Per parameter, its JSON-Schema declaration (PARAM_SCHEMA, else the default's type)."""
    return dict(_param_schemas(name))


def check_param(name: str, key: str, value, where: str) -> None:
    schemas = _param_schemas(name)
    if key not in schemas:
        raise unknown_key(where, key, schemas)
    values.check(value, schemas[key], f"{where}.{key}")


def merge_params(name: str, given: dict, where: str) -> dict:
    """The method's DEFAULTS updated by ``given``; an unknown key, a value of the wrong type or out
    of range is a ConfigError naming ``where.<key>``."""
    for key, value in given.items():
        check_param(name, key, value, where)
    return {**_declarations(name)[0], **given}
