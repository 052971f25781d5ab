"""The cost estimate's arithmetic, and one real measurement on the tiny task."""

import pytest

from fedmedbench import estimate
from fedmedbench.estimate import Job, Timing


def test_two_measurements_separate_fixed_and_per_round_cost():
    t = estimate.timing_from(seconds_one_round=7.0, seconds_k_rounds=13.0, k=4)
    assert t == Timing(fixed_seconds=5.0, seconds_per_round=2.0)
    assert t.job_seconds(100) == 205.0


def test_projection_per_experiment_and_total_counts_shared_jobs_once():
    timings = {"a": Timing(0.0, 36.0), "b": Timing(360.0, 0.0)}  # 100 rounds of a = 1 h; b = 0.1 h
    jobs = [
        Job("table", "t", "fedavg", 0, 100, "a"),
        Job("table", "t", "fedavg", 1, 100, "a"),
        Job("table", "t", "harmofl", 0, 100, "b"),
        Job("ablation", "t", "fedavg", 0, 100, "a"),  # the same job as the table's
    ]
    rows = {r["experiment"]: r for r in estimate.project(jobs, timings, gpus=2, jobs_per_gpu=1, sharing_gain=1.0)}
    assert rows["table"]["jobs"] == 3 and rows["table"]["gpu_hours"] == pytest.approx(2.1)
    assert rows["ablation"]["gpu_hours"] == pytest.approx(1.0)
    assert rows["total"]["jobs"] == 3 and rows["total"]["gpu_hours"] == pytest.approx(2.1)
    assert rows["total"]["wall_hours"] == pytest.approx(1.05)  # 2.1 GPU-h over 2 GPUs


def test_wall_hours_with_shared_gpus():
    # 8 one-hour jobs, 1 GPU, 4 per GPU with a 2.5x throughput gain: 8 / 2.5 = 3.2 h
    assert estimate.wall_hours([3600.0] * 8, gpus=1, jobs_per_gpu=4, sharing_gain=2.5) == pytest.approx(3.2)
    # never below the longest job, slowed by sharing (4 jobs at 2.5x: each runs 1.6x slower)
    assert estimate.wall_hours([36000.0, 60.0], gpus=4, jobs_per_gpu=4, sharing_gain=2.5) == pytest.approx(16.0)
