"""A tiny federation and run config for testing a method: public, for the tests of your own methods.

``python -m fedmedbench new-method NAME`` writes a package whose test is three lines on top of this
module::

    cfg = tiny_run_config("NAME.method", tmp_path / "data")
    final = run_training(cfg, tmp_path / "run", progress=False)

The run's hyperparameters are the method's own ``DEFAULTS`` (read from its source, as the pipeline
reads them), so the test keeps passing when the method's parameters are renamed, added or removed.
Seconds on a CPU: three sites of ten 16 x 16 images, a UNet of width 2, two rounds.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd

from fedmedbench.config import deep_merge
from fedmedbench.data.store import write_client, write_split_csv
from fedmedbench.registry import merge_params
from fedmedbench.runconfig import RunConfig

SITES = ("siteA", "siteB", "siteC")
IMAGES_PER_SITE = 10
IMAGE_SIZE = 16  # the UNet halves it four times


def write_tiny_federation(root: str | Path, sites=SITES, seed: int = 0) -> tuple[Path, Path]:
    """Write (once) a segmentation federation under ``root``: per site 10 images of 16 x 16 pixels with
    a bright 6 x 6 square whose pixels are the class-1 label; 6 train, 2 val, 2 test images. Returns
    (store folder, split CSV). Deterministic in ``seed``; an existing one is reused."""
    root = Path(root)
    store, split = root / "store", root / "split.csv"
    if split.is_file():
        return store, split
    rng = np.random.default_rng(seed)
    rows = []
    for site in sites:
        images = rng.integers(0, 60, (IMAGES_PER_SITE, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
        labels = np.zeros((IMAGES_PER_SITE, IMAGE_SIZE, IMAGE_SIZE), np.uint8)
        for i in range(IMAGES_PER_SITE):
            y, x = rng.integers(2, IMAGE_SIZE - 8, 2)
            labels[i, y : y + 6, x : x + 6] = 1
            images[i, y : y + 6, x : x + 6] += 150
        ids = [f"{site}/{i}" for i in range(IMAGES_PER_SITE)]
        write_client(store, site, images, labels, pd.DataFrame({"id": ids, "group": ids, "source": "synthetic"}))
        parts = ["train"] * 6 + ["val"] * 2 + ["test"] * 2
        rows += [
            {"client": site, "split": part, "row": i, "id": ids[i], "group": ids[i]} for i, part in enumerate(parts)
        ]
    write_split_csv(pd.DataFrame(rows), split)
    return store, split


def tiny_run_config(
    method_module: str, root: str | Path, method: str | None = None, params: dict | None = None, **overrides
) -> dict:
    """The resolved run config of a two-round training of the method in ``method_module`` (e.g.
    ``"fedxyz.method"``) on the tiny federation under ``root`` (written there if absent).

    ``method``: its name in the run (default: the module's top-level package, as ``new-method``
    names it). Hyperparameters: the module's ``DEFAULTS`` updated by ``params`` (checked against
    ``DEFAULTS`` and ``PARAM_SCHEMA`` like a config's ``methods.<name>`` section). ``overrides``:
    any run-config key (``rounds=3``, ``model={"init_features": 4}``), merged in. Read strictly, as
    the pipeline reads a run config: an unknown key is an error naming it.
    """
    method = method or method_module.split(".")[0]
    store, split = write_tiny_federation(root)
    cfg = {
        "task": "tiny", "method": method, "method_module": method_module, "variant": None, "run": method, "seed": 0,
        "kind": "segmentation", "clients": list(SITES), "client_labels": list(SITES),
        "data": {"store": str(store), "split": str(split), "synthetic": True},
        "model": {"name": "unet", "init_features": 2, "in_channels": 3, "num_classes": 2},
        "loss": "dice_ce", "optimizer": {"name": "adam", "lr": 1e-2},
        "rounds": 2, "local_epochs": 1, "batch_size": 4, "intensity_scale": 1 / 255,
        "aggregation": {"weighting": "uniform", "bn_buffers": "average"}, "selection_metric": "dice_paper",
        "method_params": merge_params(method, copy.deepcopy(params or {}), f"tiny_run_config({method_module!r}) params", method_module),
    }  # fmt: skip
    return RunConfig.from_dict(deep_merge(cfg, overrides), where=f"tiny_run_config({method_module!r})").to_dict()
