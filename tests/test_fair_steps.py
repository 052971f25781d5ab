"""The fair baselines' measured steps (``benchmarks/bench_fair_steps.py``): its measurement on a tiny UNet
gives hand-checkable numbers, and the measured table that docs/reviewers/fedlwr.md and the CGSV and
q-FedAvg docstrings point at holds the relations the page states."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from fedmedbench.methods import cgsv, fedavg, qfedavg
from fedmedbench.runconfig import RunConfig
from tests.conftest import tiny_run_config, write_tiny_task

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "benchmarks" / "results" / "2026-12-02-fair-steps.csv"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_fair_steps", ROOT / "benchmarks" / "bench_fair_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_task(tmp_path_factory.mktemp("tiny"))


def config(tiny, module, name, **params):
    store, split = tiny
    cfg = tiny_run_config(store, split, name, local_epochs=4)  # Adam lr 1e-2: ||Δ_i|| well above 1
    return RunConfig.from_dict({**cfg, "method_params": {**module.DEFAULTS, **params}})


def test_fedavg_against_itself_is_one_and_round_one_updates_are_the_methods_own(bench, tiny):
    first = bench.measure(config(tiny, fedavg, "fedavg"), 1)[0]
    again = bench.measure(config(tiny, fedavg, "fedavg"), 1)[0]
    assert first["global_step"] > 0 and again["global_step"] / first["global_step"] == 1.0
    # Round 1 starts every method from the same model, data order and optimizer: the same Δ_i.
    official = bench.measure(config(tiny, cgsv, "cgsv", gamma=1.0, official_code=True), 1)[0]
    assert official["mean_client_update"] == pytest.approx(first["mean_client_update"], rel=1e-6)
    # Adam moves a coordinate by about η at most per step: ||Δ_i|| <= ~η·s·√N.
    assert 0 < first["adam_bound_fraction"] <= 1.05


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_cgsv_fixed_gamma_bounds_the_step(bench, tiny, gamma):
    row = bench.measure(config(tiny, cgsv, "cgsv", gamma=gamma, official_code=True), 1)[0]
    assert row["gamma"] == gamma
    assert row["mean_client_update"] > 2 * gamma  # the bound bites: the updates are longer than Γ
    # ||u_N|| = ||Σ w_i Γ Δ_i/||Δ_i|| || <= Γ Σ w_i = Γ, and near Γ when the updates agree.
    assert 0.5 * gamma < row["global_step"] <= gamma + 1e-6


def test_qfedavg_term_ratio_is_capped_at_2q_and_grows_with_l(bench, tiny):
    capped = bench.measure(config(tiny, qfedavg, "qfedavg", q=0.5), 1)[0]
    assert 0 < capped["h_term_ratio"] <= 2 * 0.5 + 1e-9  # smoothness cap: q L ||w - w̄||²/F <= 2q
    official = bench.measure(config(tiny, qfedavg, "qfedavg", q=0.5, lipschitz_rule="inverse_lr"), 1)[0]
    assert official["lipschitz"] == pytest.approx(1 / 1e-2)
    assert official["h_term_ratio"] > 10 * capped["h_term_ratio"]


def rows():
    with open(CSV, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_measured_table_holds_what_the_reviewer_page_says():
    table = rows()
    settings = {(r["task"], r["setting"]) for r in table}
    assert {t for t, _ in settings} == {"prostate_lwr", "fundus"} and ("fundus", "demo") in settings
    for task, setting in settings:
        by_run = {r["run"]: r for r in table if (r["task"], r["setting"]) == (task, setting)}
        assert set(by_run) == {"fedavg", "cgsv-official", "cgsv", "qfedavg-official", "qfedavg"}
        assert set(by_run["fedavg"]["step_over_fedavg_rounds"].split(" / ")) == {"1"}
        # CGSV, Γ = 1: the step is about Γ / mean ||Δ_i|| of FedAvg's (the page's relation).
        official = by_run["cgsv-official"]
        assert float(official["gamma_r1"]) == 1.0
        expected = 1.0 / float(official["mean_client_update_r1"])
        assert float(official["step_over_fedavg_r1"]) == pytest.approx(expected, rel=0.05), (task, setting)
        # q-FedAvg, L = 1/η: the step is about 1 / (1 + the term ratio) of FedAvg's, the ratio in the thousands.
        q_official = by_run["qfedavg-official"]
        ratio = float(q_official["h_term_ratio_r1"])
        assert ratio > 1e3
        assert float(q_official["step_over_fedavg_r1"]) == pytest.approx(1 / (1 + ratio), rel=0.05), (task, setting)
        assert float(by_run["qfedavg"]["h_term_ratio_r1"]) <= 1.0 + 1e-9  # 2q, q = 0.5


def test_docstrings_and_page_point_at_the_measurement():
    page = (ROOT / "docs" / "reviewers" / "fedlwr.md").read_text(encoding="utf-8")
    assert "<!-- generated:fair-steps -->" in page
    for module in (cgsv, qfedavg):
        doc = module.__doc__
        assert "**estimated**" in doc and "**Measured**" in doc, module.__name__
        assert "docs/reviewers/fedlwr.md" in doc and "benchmarks/results/2026-12-02-fair-steps.csv" in doc
    assert CSV.exists() and CSV.with_suffix(".md").exists()
