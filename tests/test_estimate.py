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


def test_jobs_share_a_measurement_only_when_their_rounds_cost_the_same():
    from pathlib import Path

    from fedmedbench import config as cfgmod

    config = cfgmod.load_config(Path(__file__).resolve().parents[1] / "config" / "config.yaml")
    jobs = {(j.run, j.seed): j.cost_key for j in estimate.jobs_of(config, ["harmofl_table6_ablation_prostate"])}
    assert jobs[("fedavg", 0)] == jobs[("fedavg", 2)]  # seeds: one measurement
    # HarmoFL with and without its weight perturbation (a second forward/backward a step) are two kinds
    kinds = {jobs[(run, 0)] for run in ("fedavg", "harmofl", "harmofl-ampnorm", "harmofl-official")}
    assert len(kinds) == 4 and len(set(jobs.values())) == 4


def test_wall_hours_with_shared_gpus():
    # 8 one-hour jobs, 1 GPU, 4 per GPU with a 2.5x throughput gain: 8 / 2.5 = 3.2 h
    assert estimate.wall_hours([3600.0] * 8, gpus=1, jobs_per_gpu=4, sharing_gain=2.5) == pytest.approx(3.2)
    # never below the longest job, slowed by sharing (4 jobs at 2.5x: each runs 1.6x slower)
    assert estimate.wall_hours([36000.0, 60.0], gpus=4, jobs_per_gpu=4, sharing_gain=2.5) == pytest.approx(16.0)


def test_test_is_evaluated_every_curve_every_rounds_and_in_the_last():
    assert estimate.rounds_with_test(100, 2) == 50  # Camelyon17: 100 rounds, ~50 curve points
    assert estimate.rounds_with_test(5, 2) == 3  # rounds 2, 4 and the last, 5
    assert estimate.rounds_with_test(7, 1) == 7


def test_evaluation_cost_counts_the_engines_passes_and_is_printed_as_a_share_of_the_round(tmp_path, tiny_task):
    from tests.conftest import tiny_run_config

    store, split = tiny_task  # train / val / test per client: 8/2/2, 6/2/2, 4/2/2
    cfg = tiny_run_config(store, split, rounds=5, curve_every=2)
    cost = estimate.measure_evaluation(cfg, "cpu", threads=1)
    assert (cost.trained_samples, cost.val_passes) == (18, 6)
    assert cost.test_passes == pytest.approx(6 * 3 / 5)  # test in rounds 2, 4, 5 of 5
    assert cost.seconds > 0
    truncated = estimate.measure_evaluation(
        {**cfg, "truncate_to_smallest": True, "local_epochs": 2}, "cpu", threads=1, data_workers=2
    )
    assert truncated.trained_samples == 4 * 3 * 2 and truncated.val_passes == 6  # evaluation is never truncated

    jobs = [Job("table", "tiny", "fedavg", 0, 5, "k"), Job("table", "tiny", "fedavg", 1, 5, "k")]
    fixed = estimate.EvalCost(trained_samples=18, val_passes=6, test_passes=3.6, seconds=1.0)
    text = estimate.format_evaluation(jobs, {"k": Timing(2.0, 4.0)}, {"k": fixed})
    assert "| tiny / fedavg | 18 | 10 (6 + 4) | 1.00 | 4.00 | 25% |" in text
    assert text.count("| tiny / fedavg |") == 1  # one row per kind of job


def test_a_job_is_projected_with_its_own_test_cadence_not_the_short_runs_one(tmp_path, tiny_task, monkeypatch):
    """The timed 1- and k-round runs test only in their last round; a job's further test rounds are
    added at one test pass each. A fake engine on a fake clock: 1 s start, 2 s a round, 3 s a test
    evaluation (every `curve_every`-th round and the last, as the engine does). A 500-round job with
    the paper config's `curve_every: 0` (test every 10th round: 50 test rounds) then costs exactly
    1 + 500 x 2 + 50 x 3 = 1151 s. Timed with the job's own cadence, a 2-round run would test every
    round and project 1 + 500 x 5 = 2501 s."""
    from fedmedbench.fl import engine
    from tests.conftest import tiny_run_config

    store, split = tiny_task
    cfg = tiny_run_config(store, split, rounds=500, curve_every=0)
    now, runs = [0.0], []

    def fake_run_training(run_cfg, out, **kwargs):
        rounds, every = run_cfg["rounds"], run_cfg.get("curve_every") or max(1, run_cfg["rounds"] // 50)
        runs.append((rounds, every))
        now[0] += 1.0 + 2.0 * rounds + 3.0 * sum(1 for r in range(1, rounds + 1) if r % every == 0 or r == rounds)

    monkeypatch.setattr(engine, "run_training", fake_run_training)
    monkeypatch.setattr(estimate.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(
        estimate,
        "measure_evaluation",
        lambda *a, **k: estimate.EvalCost(
            trained_samples=1, val_passes=1, test_passes=0.1, seconds=0.5, test_seconds=3.0
        ),
    )
    config = {"tasks": {}, "experiments": {}}
    monkeypatch.setattr(estimate.cfgmod, "resolve_run", lambda config, task, run, seed: cfg)
    job = Job("table", "tiny", "fedavg", 0, 500, "k", estimate.rounds_with_test(500, 10))
    assert job.test_rounds == 50
    timing = estimate.measure(config, [job], 2, "cpu", 1)["k"]
    assert runs[1:] == [(1, 3), (2, 3)]  # after the warm-up: the timed runs test in their last round only
    assert timing == Timing(fixed_seconds=4.0, seconds_per_round=2.0, test_seconds=3.0)
    assert timing.job_seconds(500, 50) == 1151.0 and timing.round_seconds(500, 50) == pytest.approx(
        2.0 + 49 * 3.0 / 500
    )
    rows = {
        r["experiment"]: r for r in estimate.project([job], {"k": timing}, gpus=1, jobs_per_gpu=1, sharing_gain=1.0)
    }
    assert rows["table"]["gpu_hours"] == pytest.approx(1151.0 / 3600)


def test_jobs_know_their_test_rounds_from_the_config():
    from pathlib import Path

    from fedmedbench import config as cfgmod

    config = cfgmod.load_config(Path(__file__).resolve().parents[1] / "config" / "config.yaml")
    jobs = estimate.jobs_of(config, ["harmofl_table6_ablation_prostate"])
    assert {(j.rounds, j.test_rounds) for j in jobs} == {(500, 50)}  # curve_every 0: every 10th of 500


SHARING_GAIN = "--sharing-gain must be above 0: the throughput of --jobs-per-gpu jobs sharing a GPU over one job's"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpus", "0"], "--gpus must be at least 1 (got 0)"),
        (["--gpus", "-2"], "--gpus must be at least 1 (got -2)"),
        (["--jobs-per-gpu", "0"], "--jobs-per-gpu must be at least 1 (got 0)"),
        (["--threads", "0"], "--threads must be at least 1 (got 0)"),
        (["--data-workers", "-1"], "--data-workers must be at least 0 (got -1)"),
        (["--rounds-to-time", "1"], "--rounds-to-time must be at least 2 (got 1)"),
        (["--sharing-gain", "0"], f"{SHARING_GAIN} (got 0.0)"),
        (["--sharing-gain", "-1.5"], f"{SHARING_GAIN} (got -1.5)"),
        (["--sharing-gain", "nan"], f"{SHARING_GAIN} (got nan)"),
    ],
)
def test_impossible_counts_are_refused_in_one_line_before_any_timing(argv, message, monkeypatch, capsys):
    from pathlib import Path

    from fedmedbench import cli

    def no_timing(*args, **kwargs):
        raise AssertionError("timed although an option was refused")

    monkeypatch.setattr(estimate, "measure", no_timing)
    monkeypatch.chdir(Path(__file__).resolve().parents[1])  # the default config/config.yaml
    assert cli.main(["estimate", *argv]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(f"ConfigError: {message}"), line
