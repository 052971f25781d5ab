"""One file per method, found by name: ``fedmedbench.methods.<name>`` defines ``Server``, ``Client``,
``DEFAULTS`` (its hyperparameters) and ``PERSONALIZED`` (whether each client keeps its own model,
which switches model selection to per-client)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from fedmedbench.errors import ConfigError, closest, unknown_key


def available_methods() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def _check_name(name: str) -> None:
    if name not in available_methods():
        raise ConfigError(f"unknown method {name!r}{closest(name, available_methods())}; available: {', '.join(available_methods())}")


def load_method(name: str) -> ModuleType:
    _check_name(name)
    return importlib.import_module(f"{__name__}.{name}")


def method_defaults(name: str) -> dict:
    """A method's ``DEFAULTS`` read from its source without importing it (no torch): the config is
    checked when Snakemake builds the DAG, long before a job imports the method."""
    _check_name(name)
    tree = ast.parse((Path(__file__).parent / f"{name}.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "DEFAULTS":
            return ast.literal_eval(node.value)
    raise ConfigError(f"method {name!r} defines no literal DEFAULTS")


def merge_params(name: str, given: dict, where: str) -> dict:
    """The method's DEFAULTS updated by ``given``; a key the method does not declare is an error."""
    defaults = method_defaults(name)
    for key in given:
        if key not in defaults:
            raise unknown_key(where, key, defaults)
    return {**defaults, **given}
