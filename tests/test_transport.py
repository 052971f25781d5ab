"""The round loop over a transport (fl/transport.py) is the engine's, bit for bit: the same run through
``serve`` + ``InProcessTransport`` writes byte-identical final.json, history.csv, model_best.pt and
predictions.npz. Methods: a global one, a personalized one, one with a query/answer exchange, one
with client-side deputies and a two-stage client."""

import filecmp

import pytest

from fedmedbench.fl.engine import run_training
from fedmedbench.fl.transport import InProcessTransport, SiteError, in_process_sites, serve
from fedmedbench.registry import merge_params
from fedmedbench.runconfig import RunConfig
from tests.conftest import tiny_run_config

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


def test_ood_cohorts_are_refused_in_one_line(tmp_path, tiny_task):
    store, split = tiny_task
    run = merged(tiny_run_config(store, split, "fedavg", rounds=1, clients=["A", "B"], ood_clients=["C"]))
    with pytest.raises(SiteError, match="ood_clients"):
        serve(run, tmp_path / "x", InProcessTransport([]), progress=False)


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
    with pytest.raises(SiteError, match="round 3: in-process sites keep no snapshots of their own; resume an in-process run with the engine"):
        InProcessTransport(in_process_sites(run)).resume(3, [])
