"""The round loop over a transport (fl/rounds.py) is the engine's, bit for bit: the same run through
``serve`` + ``InProcessTransport`` writes byte-identical final.json, history.csv, model_best.pt and
predictions.npz. Methods: a global one, a personalized one, one with a query/answer exchange, one
with client-side deputies and a two-stage client."""

import filecmp

import pytest
import torch

from fedmedbench.fl.engine import run_training
from fedmedbench.fl.rounds import InProcessTransport, SiteError, serve
from fedmedbench.registry import merge_params
from fedmedbench.runconfig import RunConfig
from tests.conftest import tiny_run_config
from tests.in_process import in_process_cohorts, in_process_sites

OUTPUTS = ("final.json", "history.csv", "model_best.pt", "predictions.npz")


def merged(cfg: dict) -> RunConfig:
    run = RunConfig.from_dict(cfg)
    return run.replace(method_params=merge_params(run.method, run.method_params, "test", run.method_module))


@pytest.mark.parametrize("method", ["fedavg", "ditto", "fedce", "prrfl"])
def test_in_process_transport_equals_the_engine_byte_for_byte(tmp_path, tiny_task, method):
    store, split = tiny_task
    cfg = tiny_run_config(store, split, method, rounds=2)
    run_training(cfg, tmp_path / "engine", progress=False)
    run = merged(cfg)
    serve(run, tmp_path / "transport", InProcessTransport(in_process_sites(run)), progress=False)
    for name in OUTPUTS:
        assert filecmp.cmp(tmp_path / "engine" / name, tmp_path / "transport" / name, shallow=False), name


def test_a_site_without_a_kept_model_has_nothing_to_test(tmp_path, tiny_task):
    store, split = tiny_task
    run = merged(tiny_run_config(store, split, "fedavg", rounds=1))
    site = in_process_sites(run)[0]
    with pytest.raises(SiteError, match="site A: no model was kept"):
        site.final()


# PRR-FL's two flows (the paper's, per-client selection; the official code's, one pooled round).
PRRFL_OFFICIAL = {
    "method_params": {"fourier_mode": "official", "phi_split": "train", "upload": "deputy"},
    "selection_window": 0.5,
    "selection_scope": "pooled",
}


@pytest.mark.parametrize("overrides", [{}, PRRFL_OFFICIAL], ids=["paper", "official"])
def test_a_test_only_cohort_served_in_process_equals_the_engine_byte_for_byte(tmp_path, tiny_task, overrides):
    """Site C as PRR-FL's unseen institution (its test rows only): ``serve`` with an in-process
    ``Cohort`` writes the engine's files, final.json's ood part included."""
    import json

    store, split = tiny_task
    cfg = tiny_run_config(store, split, "prrfl", rounds=2, clients=["A", "B"], ood_clients=["C"], **overrides)
    run_training(cfg, tmp_path / "engine", progress=False)
    run = merged(cfg)
    serve(
        run, tmp_path / "transport", InProcessTransport(in_process_sites(run), in_process_cohorts(run)), progress=False
    )
    for name in OUTPUTS:
        assert filecmp.cmp(tmp_path / "engine" / name, tmp_path / "transport" / name, shallow=False), name
    ood = json.loads((tmp_path / "transport" / "final.json").read_text())["ood"]["C"]
    assert list(ood["per_model"]) == ["A", "B"]
    for metric, value in ood["mean"].items():  # the mean of the two models' scores
        assert value == pytest.approx((ood["per_model"]["A"][metric] + ood["per_model"]["B"][metric]) / 2), metric


def test_a_transport_that_does_not_serve_the_runs_cohorts_is_refused(tmp_path, tiny_task):
    store, split = tiny_task
    run = merged(tiny_run_config(store, split, "fedavg", rounds=1, clients=["A", "B"], ood_clients=["C"]))
    with pytest.raises(
        SiteError, match=r"run fedavg: its test-only cohorts \(ood_clients\) are \['C'\], the transport serves \[\]"
    ):
        serve(run, tmp_path / "x", InProcessTransport([]), progress=False)
    assert not (tmp_path / "x").exists()


def test_a_cohort_refuses_a_model_that_is_not_the_runs_network(tiny_task):
    store, split = tiny_task
    run = merged(tiny_run_config(store, split, "fedavg", rounds=1, clients=["A", "B"], ood_clients=["C"]))
    cohort = in_process_cohorts(run)[0]
    state = in_process_sites(run)[0].client.model.state_dict()
    assert len(cohort.split) == 2  # C's test rows only
    with pytest.raises(
        SiteError,
        match=r"cohort C: site B's selected model is not the run's network 'unet' \(.*amplitude.*\); a test-only cohort scores that network only; refused",
    ):
        cohort.score({"A": state, "B": {**state, "amplitude": torch.zeros(3)}})


def test_the_engines_sites_hand_the_kept_model_over_without_keeping_a_copy(tmp_path, tiny_task):
    """The engine's sites (``hold_kept=False``) keep nothing: its ``Selection`` holds the one copy of a
    kept model (paper scale: one model per client in memory, not two). A site that holds its kept
    model (a Flower site, ``serve`` in-process) holds the very tensors it returned, no copy either."""
    store, split = tiny_task
    run = merged(tiny_run_config(store, split, "fedavg", rounds=1))
    site = in_process_sites(run)[0]
    engine_site = type(site)(run, site.client, site.device, hold_kept=False)
    state, predictions = engine_site.keep(1)
    assert engine_site.kept is None and set(state) == set(site.client.eval_model().state_dict())
    state, _ = site.keep(1)
    assert site.kept["model"] is state and site.kept["round"] == 1


def test_in_process_sites_are_not_resumed_by_serve(tmp_path, tiny_task):
    store, split = tiny_task
    run = merged(tiny_run_config(store, split, "fedavg", rounds=1))
    with pytest.raises(
        SiteError,
        match="round 3: in-process sites keep no snapshots of their own; resume an in-process run with the engine",
    ):
        InProcessTransport(in_process_sites(run)).resume(3, [])
