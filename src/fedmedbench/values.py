"""Typed values: one check of a config value against its declaration (a JSON-Schema fragment).

Task keys are declared in workflow/schemas/config.schema.yaml, method parameters by the method's
``DEFAULTS`` (the type of each default) and optional ``PARAM_SCHEMA`` (ranges, choices, nullable
values). Every value a user gives (config, overlay, variant, hand-written run config) goes through
:func:`check`, so a string is never read as a boolean or a number and an out-of-range value never
reaches a job. No torch import here.
"""

from __future__ import annotations

import functools
import json
import math

from fedmedbench.errors import ConfigError

JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", tuple: "array", dict: "object"}


def inferred_schema(default) -> dict | None:
    """The declaration implied by a default value (None: the default does not say)."""
    return {"type": JSON_TYPES[type(default)]} if type(default) in JSON_TYPES else None


def describe(schema: dict) -> str:
    """``number > 0``, ``one of 'full', 'dc'``, ``boolean (true/false)``, ``integer >= 1 or null``."""
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    types = schema.get("type", "any value")
    types = [types] if isinstance(types, str) else list(types)
    nullable = "null" in types
    text = " or ".join(t if t != "boolean" else "boolean (true/false, not a string)" for t in types if t != "null")
    bounds = [f"{op} {schema[key]}" for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")) if key in schema]
    if bounds:
        text += " " + " and ".join(bounds)
    return text + (" or null" if nullable else "")


@functools.lru_cache(maxsize=None)
def _validator(schema_json: str):
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(schema_json))


def _non_finite(value, path: str = ""):
    """(the key path inside ``value``, the number) of its first NaN or infinity, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    if isinstance(value, dict):
        items = ((f".{key}", item) for key, item in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    for suffix, item in items:
        found = _non_finite(item, path + suffix)
        if found is not None:
            return found
    return None


def yaml_number(number: float) -> str:
    """A non-finite number as YAML writes it (.nan, .inf, -.inf), the way the user typed it."""
    return ".nan" if math.isnan(number) else (".inf" if number > 0 else "-.inf")


def check_finite(value, where: str) -> None:
    """No NaN or infinity anywhere in ``value`` (every number of a config is finite). JSON Schema's
    ``exclusiveMinimum: 0`` lets ``.inf`` through and every comparison with ``.nan`` is false, so the
    schema alone would let both reach a job, which then fails on the method or the learning rate."""
    found = _non_finite(value)
    if found is not None:
        inner, number = found
        raise ConfigError(f"{where}{inner}: expected a finite number, got {yaml_number(number)}: NaN and infinity are refused for every number of the config")


def check(value, schema: dict, where: str) -> None:
    """Raise a ConfigError naming ``where``, the expected type or range and the value given."""
    import jsonschema

    check_finite(value, where)

    error = jsonschema.exceptions.best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value))
    if error is None:
        return
    inner = "".join(f".{p}" for p in error.absolute_path)
    expected = describe(error.schema) if error.validator in ("type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") else error.message
    raise ConfigError(f"{where}{inner}: expected {expected}, got {json.dumps(error.instance)} ({type(error.instance).__name__})")
