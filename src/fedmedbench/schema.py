"""The configuration's schema, workflow/schemas/config.schema.yaml: the one declaration of every
config key's type and range, read by the config check (``config.validate``) and by the typed options
built from a section (``data.folders.FoldersOptions``). No torch import here (the Snakefile loads it)."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

# libyaml's safe loader where it is built (10x faster; Snakemake parses the config on every call).
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


@functools.lru_cache(maxsize=1)
def schema() -> dict:
    return yaml.load(SCHEMA.read_text(), Loader=YAML_LOADER)
