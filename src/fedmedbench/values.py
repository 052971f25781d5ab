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


def check(value, schema: dict, where: str) -> None:
    """Raise a ConfigError naming ``where``, the expected type or range and the value given."""
    import jsonschema

    error = jsonschema.exceptions.best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value))
    if error is None:
        return
    inner = "".join(f".{p}" for p in error.absolute_path)
    expected = describe(error.schema) if error.validator in ("type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") else error.message
    raise ConfigError(f"{where}{inner}: expected {expected}, got {json.dumps(error.instance)} ({type(error.instance).__name__})")
