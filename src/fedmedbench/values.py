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

from fedmedbench.errors import ConfigError, closest, unknown_key

JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    tuple: "array",
    dict: "object",
}


def inferred_schema(default) -> dict | None:
    """The declaration implied by a default value (None: the default does not say)."""
    return {"type": JSON_TYPES[type(default)]} if type(default) in JSON_TYPES else None


def describe(schema: dict) -> str:
    """``number > 0``, ``one of 'full', 'dc'``, ``boolean (true/false)``, ``integer >= 1 or null``; or
    the schema's own ``expected`` phrase, where a type and a range alone would not say what the value
    means (e.g. ``1 (one slice, replicated to 3 channels) or 3 (slices i-1, i, i+1)``)."""
    if "expected" in schema:
        return schema["expected"]
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    types = schema.get("type", "any value")
    types = [types] if isinstance(types, str) else list(types)
    nullable = "null" in types
    text = " or ".join(t if t != "boolean" else "boolean (true/false, not a string)" for t in types if t != "null")
    bounds = [
        f"{op} {schema[key]}"
        for key, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))
        if key in schema
    ]
    if bounds:
        text += " " + " and ".join(bounds)
    return text + (" or null" if nullable else "")


@functools.lru_cache(maxsize=None)
def _validator(schema_json: str):
    import jsonschema  # noqa: PLC0415  (jsonschema: ~55 ms; the CLI imports this module at start-up (through config), --help checks nothing)

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
        raise ConfigError(
            f"{where}{inner}: expected a finite number, got {yaml_number(number)}: NaN and infinity are refused for every number of the config"
        )


def check(value, schema: dict, where: str) -> None:
    """Raise a ConfigError naming ``where``, the expected type or range and the value given; an
    unknown key names its closest spelling, a missing one what it is for."""
    import jsonschema  # noqa: PLC0415  (see _validator)

    check_finite(value, where)

    error = jsonschema.exceptions.best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value))
    if error is None:
        return
    place = where + "".join(f".{p}" for p in error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {})
        raise unknown_key(place, next(str(k) for k in error.instance if k not in allowed), allowed)
    if error.validator == "required":
        key = next(k for k in error.validator_value if k not in error.instance)
        meaning = error.schema.get("properties", {}).get(key, {}).get("expected")
        raise ConfigError(f"{place}: {key!r} is required" + (f": {meaning}" if meaning else ""))
    typed = (
        error.validator in ("type", "enum", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
        or "expected" in error.schema
    )
    expected = describe(error.schema) if typed else error.message
    hint = (
        closest(error.instance, map(str, error.schema["enum"]))
        if error.validator == "enum" and isinstance(error.instance, str)
        else ""
    )
    raise ConfigError(
        f"{place}: expected {expected}, got {json.dumps(error.instance, default=str)} ({type(error.instance).__name__}){hint}"
    )
