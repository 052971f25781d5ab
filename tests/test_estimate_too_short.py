"""`estimate` never prints an impossible figure: a round of 0 s (the k-round run no longer than the
1-round one, clamped) or an evaluation longer than the round it is part of. It says the measurement
was too short and what to do."""

from __future__ import annotations

import pytest

from fedmedbench import estimate
from fedmedbench.estimate import EvalCost, Job, Timing


def timed(monkeypatch, tiny_task, run_seconds: dict[int, float], val_seconds: float, k: int = 2) -> Timing:
    """``estimate.measure`` on a fake clock: a timed run of r rounds takes run_seconds[r]."""
    from fedmedbench.fl import engine
    from tests.conftest import tiny_run_config

    store, split = tiny_task
    cfg = tiny_run_config(store, split, rounds=100, curve_every=10)
    now = [0.0]
    monkeypatch.setattr(
        engine, "run_training", lambda run_cfg, out, **kw: now.__setitem__(0, now[0] + run_seconds[run_cfg["rounds"]])
    )
    monkeypatch.setattr(estimate.time, "perf_counter", lambda: now[0])
    cost = EvalCost(
        trained_samples=18,
        val_passes=6,
        test_passes=0.6,
        seconds=val_seconds + 0.1 * 0.5,
        test_seconds=0.5,
        val_seconds=val_seconds,
    )
    monkeypatch.setattr(estimate, "measure_evaluation", lambda *a, **kw: cost)
    monkeypatch.setattr(estimate.cfgmod, "resolve_run", lambda config, task, run, seed: cfg)
    job = Job("table", "tiny", "fedavg", 0, 100, "k", 10)
    timings = estimate.measure({}, [job], k, "cpu", 1, evaluation=(evaluation := {}))
    return timings["k"], job, evaluation


def test_a_k_round_run_no_longer_than_the_one_round_run_is_too_short_not_0_s_a_round(monkeypatch, tiny_task, caplog):
    # 1 round 3.10 s, 2 rounds 3.05 s: the difference is noise; it was clamped to "0.00 s per round"
    timing, job, evaluation = timed(monkeypatch, tiny_task, {1: 3.10, 2: 3.05}, val_seconds=0.4)
    assert timing.too_short
    assert timing.seconds_per_round == pytest.approx(0.4)  # its validation pass: a lower bound, never 0 s
    assert timing.fixed_seconds == pytest.approx(3.10 - 0.4)
    assert "0.00 s per round" not in caplog.text and "rerun with --rounds-to-time 8" in caplog.text
    text = estimate.format_evaluation([job], {"k": timing}, evaluation, rounds_to_time=2)
    [row] = [line for line in text.splitlines() if line.startswith("| tiny / fedavg")]
    assert row.endswith("| too short | n/a |"), row
    assert "100%" not in text and "rerun with --rounds-to-time 8" in text
    rows = estimate.project([job], {"k": timing}, gpus=1, jobs_per_gpu=1, sharing_gain=1.0)
    table = estimate.format_table(rows, "cpu", 1, 1, 1.0, rounds_to_time=2)
    hours = timing.job_seconds(100, 10) / 3600
    assert f"| table | 1 | >= {hours:.2f} | >= {hours:.2f} |" in table
    assert "a lower bound" in table and "rerun with --rounds-to-time 8" in table


def test_an_evaluation_longer_than_its_round_is_too_short_not_a_share_of_100_percent(monkeypatch, tiny_task):
    # A FedAvg measured as reported: evaluation 2.06 s a round, the round measured at 1.46 s
    timing, job, evaluation = timed(monkeypatch, tiny_task, {1: 5.0, 4: 5.0 + 3 * 1.46}, val_seconds=2.06, k=4)
    assert timing.too_short and timing.seconds_per_round == pytest.approx(2.06)
    text = estimate.format_evaluation([job], {"k": timing}, evaluation, rounds_to_time=4)
    assert "| too short | n/a |" in text and "100%" not in text and "1.46" not in text
    assert "rerun with --rounds-to-time 16" in text


def test_a_long_enough_measurement_prints_its_share_below_100_percent(monkeypatch, tiny_task):
    timing, job, evaluation = timed(monkeypatch, tiny_task, {1: 5.0, 2: 7.0}, val_seconds=0.5)
    assert not timing.too_short and timing.seconds_per_round == pytest.approx(2.0)
    text = estimate.format_evaluation([job], {"k": timing}, evaluation)
    # a round: 2.0 s + its 10 test passes of 0.5 s over 100 rounds; evaluation: 0.5 + 0.05
    assert "| 0.55 | 2.05 | 27% |" in text and "too short" not in text
    table = estimate.format_table(estimate.project([job], {"k": timing}, 1, 1, 1.0), "cpu", 1, 1, 1.0)
    assert ">=" not in table
