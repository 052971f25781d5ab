"""One file per method, found by name: ``fedmedbench.methods.<name>`` defines ``Server``, ``Client``,
``DEFAULTS`` (its hyperparameters) and ``PERSONALIZED`` (whether each client keeps its own model,
which switches model selection to per-client)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def available_methods() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load_method(name: str) -> ModuleType:
    if name not in available_methods():
        raise ValueError(f"unknown method {name!r}; available: {', '.join(available_methods())}")
    return importlib.import_module(f"{__name__}.{name}")
