"""Dataset families: one package per family, all with the same interface, so the pipeline handles
every family with the same rules and commands.

A built-in family is a package ``fedmedbench.data.<family>`` whose files show its parts:
``sites.py`` (the clients of each protocol, the counts of record, the family's error),
``download.py`` (the raw files, where they come from, their licences and manual steps), ``raw.py``
(reading the raw release into the canonical store), ``splits.py`` (the splits of record) and
``synthetic.py`` (the synthetic twin, in the release's formats). ``folders`` (a user's own data) has
its own parts (options, reading, splits, example writer, check-data). Every family, through
``load_family``, provides:

- ``DOWNLOADS: list[DownloadSpec]``: the raw files (archives or single files such as a metadata CSV);
  ``spec.filename`` is the name under ``raw/``; ``spec.url == "manual"`` stops with ``spec.manual_step``.
- ``PROTOCOLS: dict[str, list[str]]``: the client names of each paper protocol.
- ``write_synthetic(out_dir, seed=0, **options) -> dict``: the synthetic twin, every file of DOWNLOADS
  under its real name and layout.
- ``preprocess(raw, store_dir, protocol, *, expect_real_counts=False, size=None, log=print) -> dict``:
  ``raw`` maps each DOWNLOADS filename to its extracted folder (archives) or to the file itself; writes
  the canonical store and returns the per-client sample counts.
- ``split(store_dir, out_csv, protocol, *, permutation="default", seed=0) -> DataFrame``: the split of record.

Family modules must not import torch (data jobs start fast).
"""

from __future__ import annotations

import importlib
from types import ModuleType

FAMILIES = ("prostate", "camelyon17", "nuclei", "skin", "fundus", "folders")  # folders: a user's own data
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")


def load_family(name: str) -> ModuleType:
    if name not in FAMILIES:
        raise ValueError(f"unknown dataset family {name!r}; known: {', '.join(FAMILIES)}")
    return importlib.import_module(f"{__name__}.{name}")


def check_protocol(family: str, protocol: str, protocols: dict) -> None:
    """Every family's ``preprocess`` and ``split`` refuse a protocol they do not define, naming the known ones."""
    if protocol not in protocols:
        raise ValueError(f"{family}: unknown protocol {protocol!r}; known: {sorted(protocols)}")


def is_archive(filename: str) -> bool:
    return filename.lower().endswith(ARCHIVE_SUFFIXES)
