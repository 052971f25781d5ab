"""Every client of a run config as a transport ``Site`` (and its test-only cohorts as ``Cohort``s) in the
test's own process, built as the engine builds them: what the transport tests serve over
``InProcessTransport``, without Flower."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from fedmedbench.fl.data import load_clients, load_test_only
from fedmedbench.fl.hooks import load_method
from fedmedbench.fl.rounds import Cohort, Site
from fedmedbench.fl.seeding import client_generator, seed_everything
from fedmedbench.models import build_model


def in_process_sites(cfg, device: torch.device | None = None) -> list[Site]:
    """Every client of ``cfg`` as a ``Site`` in this process, built as the engine builds them."""
    device = device or torch.device("cpu")
    method = load_method(cfg.method, cfg.method_module)
    data = load_clients(Path(cfg.data.store), Path(cfg.data.split), list(cfg.clients), cfg.truncate_to_smallest)
    seed_everything(cfg.seed, device)
    model = build_model(cfg.model)
    return [
        Site(cfg, method.Client(cfg, i, d, copy.deepcopy(model), client_generator(cfg.seed, i), device), device)
        for i, d in enumerate(data)
    ]


def in_process_cohorts(cfg, device: torch.device | None = None) -> list[Cohort]:
    """The test-only cohorts of ``cfg`` (``ood_clients``) as ``Cohort``s in this process."""
    splits = (
        load_test_only(Path(cfg.data.store), Path(cfg.data.split), list(cfg.ood_clients)) if cfg.ood_clients else {}
    )
    return [Cohort(cfg, name, split, device or torch.device("cpu")) for name, split in splits.items()]
