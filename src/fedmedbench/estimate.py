"""A cost estimate to read before launching: ``python -m fedmedbench estimate``.

Every training job of the selected experiments is resolved from the config. Jobs that cost the same
per round — same task, method and method parameters, local epochs, model, batch size and precision —
share one measurement: that job is trained
here, on this device, once for 1 round and once for k rounds (``--rounds-to-time``), which separates
the fixed cost (process start, data, first-round warm-up, final outputs) from the cost of one more
round. Both timed runs evaluate test once, in their last round, as every job does; the test
evaluations a job does besides (every ``curve_every`` rounds) are timed apart, one pass over every
client's test split, so a job is projected as ``fixed + rounds x per_round + (test rounds - 1) x
test pass``. (Timing the short runs with the job's own cadence would not do: a 2-round run of a
job with ``curve_every: 0`` tests every round, ~50 curve points per run, where its 500 rounds test
every 10th, and the test pass would count in every projected round.)

GPU-hours are the sum over jobs. Wall-hours assume the jobs are spread over ``gpus`` devices with
``jobs_per_gpu`` concurrent jobs each, whose combined throughput is ``sharing_gain`` times one job's
(1.0 = no gain from sharing, the safe default; measure yours with ``benchmarks/bench_engine.py``).
They are never less than the longest single job, slowed by sharing.

Evaluation is part of every round: validation of every client's evaluated model every round (model
selection, as the papers' code does) and test every ``curve_every`` rounds (the curves). Its cost
per round does not depend on the method, so it is timed once per (task, model, batch, precision):
one pass over every client's validation and test split, scaled by how often each is evaluated, and
printed next to the round time it is part of (Camelyon17: training is truncated to the smallest
hospital, evaluation is not, so a round evaluates about as many samples as it trains on: 118,544
forward passes beside 111,700 trained samples with the paper config).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fedmedbench import config as cfgmod
from fedmedbench.errors import DataError
from fedmedbench.fl import engine  # engine.run_training looked up when called: the tests replace it
from fedmedbench.fl.data import BatchReader, load_clients
from fedmedbench.fl.evaluation import curve_every, evaluate
from fedmedbench.models import build_model
from fedmedbench.runconfig import RunConfig

log = logging.getLogger("fedmedbench.estimate")


@dataclass(frozen=True)
class Job:
    experiment: str
    task: str
    run: str
    seed: int
    rounds: int
    cost_key: str  # jobs with the same key cost the same per round
    test_rounds: int = 1  # rounds in which it evaluates test (every `curve_every`-th and the last)


@dataclass(frozen=True)
class Timing:
    fixed_seconds: float  # includes one test evaluation (a job's last round has one)
    seconds_per_round: float  # a round without test evaluation
    test_seconds: float = 0.0  # one test evaluation of every client
    too_short: bool = False  # the timed runs were too short to tell a round's cost (see too_short())

    def job_seconds(self, rounds: int, test_rounds: int = 1) -> float:
        return self.fixed_seconds + rounds * self.seconds_per_round + max(test_rounds - 1, 0) * self.test_seconds

    def round_seconds(self, rounds: int, test_rounds: int = 1) -> float:
        """A round's average over a job of ``rounds`` rounds, its test evaluations included."""
        return self.seconds_per_round + max(test_rounds - 1, 0) * self.test_seconds / rounds


@dataclass(frozen=True)
class EvalCost:
    """Evaluation per round: forward passes and their measured seconds, beside the training samples."""

    trained_samples: int  # samples a round trains on: every client's (truncated) train split x local epochs
    val_passes: int  # validation forward passes per round (every round)
    test_passes: float  # test forward passes per round, on average (test every `curve_every` rounds)
    seconds: float  # evaluation seconds per round: validation + test x its share of rounds
    test_seconds: float = 0.0  # one test evaluation of every client
    val_seconds: float = 0.0  # one validation pass of every client (part of every round)

    @property
    def passes(self) -> float:
        return self.val_passes + self.test_passes


def rounds_with_test(rounds: int, every: int) -> int:
    """Rounds in which the engine evaluates test for the curves: every ``every``-th and the last."""
    return rounds // every + (1 if rounds % every else 0)


def eval_key(run_cfg: dict) -> str:
    keys = ("task", "model", "batch_size", "eval_batch_size", "precision", "rounds", "curve_every", "local_epochs")
    return json.dumps([run_cfg.get(k) for k in keys], sort_keys=True)


def measure_evaluation(run_cfg: dict, device: str, threads: int | None, data_workers: int = 0) -> EvalCost:
    """One timed pass of the run's model over every client's validation and test split, as the
    engine evaluates them (``evaluation.evaluate``: batched, on ``device``, read by ``data_workers``)."""
    cfg = RunConfig.from_dict(run_cfg)
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    reader = BatchReader(data_workers) if data_workers else None
    try:
        clients = load_clients(
            Path(cfg.data.store), Path(cfg.data.split), list(cfg.clients), cfg.truncate_to_smallest, reader
        )
        model = build_model(cfg.model)
        model = model.to(dev, memory_format=torch.channels_last) if cfg.precision == "bf16" else model.to(dev)
        evaluate(model, clients[0].val, cfg, dev)  # warm-up: kernels, allocator
        seconds = {}
        for part in ("val", "test"):
            started = time.perf_counter()
            for client in clients:
                evaluate(model, getattr(client, part), cfg, dev)  # reads its scores back: synchronised
            seconds[part] = time.perf_counter() - started
    finally:
        if reader is not None:
            reader.close()
    share = rounds_with_test(cfg.rounds, curve_every(cfg)) / cfg.rounds
    return EvalCost(
        trained_samples=sum(len(c.train) for c in clients) * cfg.local_epochs,
        val_passes=sum(len(c.val) for c in clients),
        test_passes=sum(len(c.test) for c in clients) * share,
        seconds=seconds["val"] + seconds["test"] * share,
        test_seconds=seconds["test"],
        val_seconds=seconds["val"],
    )


def cost_key(run_cfg: dict) -> str:
    """Jobs whose rounds cost the same. A method's parameters are part of it: HarmoFL with and
    without its weight perturbation (one more forward and backward a step) are different kinds."""
    keys = ("task", "method", "method_params", "local_epochs", "model", "batch_size", "precision")
    return json.dumps([run_cfg.get(k) for k in keys], sort_keys=True)


def jobs_of(config: dict, experiments: list[str]) -> list[Job]:
    jobs = []
    for experiment in experiments:
        for task, run, seed in cfgmod.experiment_runs(config, experiment):
            run_cfg = cfgmod.resolve_run(config, task, run, seed)
            tests = rounds_with_test(run_cfg["rounds"], curve_every(RunConfig.from_dict(run_cfg)))
            jobs.append(Job(experiment, task, run, seed, run_cfg["rounds"], cost_key(run_cfg), tests))
    return jobs


def too_short(seconds_one_round: float, seconds_k_rounds: float, k: int, val_seconds: float) -> bool:
    """True when the 1- and k-round runs cannot tell what a round costs: the k rounds took no longer
    than the one (their difference is noise, which would be clamped to 0 s a round), or a round came
    out shorter than its own validation pass, which is part of every round."""
    per_round = (seconds_k_rounds - seconds_one_round) / (k - 1)
    return per_round <= 0 or per_round < val_seconds


def too_short_advice(k: int) -> str:
    """What a too-short measurement means and what to do (printed under both tables)."""
    return (
        f"too short: the {k}-round timed run took no longer than the 1-round one plus its rounds' validation, so the "
        f"cost of a round is below the noise; rerun with --rounds-to-time {4 * k} (or more). Until then such a round "
        f"counts as its validation pass alone, so its projected hours are a lower bound (marked >=)"
    )


def timing_from(seconds_one_round: float, seconds_k_rounds: float, k: int) -> Timing:
    """Two measurements -> fixed cost and cost per round (k >= 2)."""
    per_round = max((seconds_k_rounds - seconds_one_round) / (k - 1), 0.0)
    return Timing(max(seconds_one_round - per_round, 0.0), per_round)


def wall_hours(job_seconds: list[float], gpus: int, jobs_per_gpu: int, sharing_gain: float) -> float:
    if not job_seconds:
        return 0.0
    gpu_hours = sum(job_seconds) / 3600
    spread = gpu_hours / (gpus * sharing_gain)
    # One job alone cannot finish sooner than its own time, slowed by its neighbours on the GPU.
    longest = max(job_seconds) / 3600 * (jobs_per_gpu / sharing_gain if jobs_per_gpu > 1 else 1.0)
    return max(spread, longest)


def project(
    jobs: list[Job], timings: dict[str, Timing], gpus: int, jobs_per_gpu: int, sharing_gain: float
) -> list[dict]:
    """One row per experiment and a final ``total`` row (a job shared by experiments counted once)."""
    rows = []
    by_experiment: dict[str, list[Job]] = {}
    for job in jobs:
        by_experiment.setdefault(job.experiment, []).append(job)
    unique = {(j.task, j.run, j.seed): j for j in jobs}
    for name, group in [*by_experiment.items(), ("total", list(unique.values()))]:
        seconds = [timings[j.cost_key].job_seconds(j.rounds, j.test_rounds) for j in group]
        rows.append(
            {
                "experiment": name,
                "jobs": len(group),
                "gpu_hours": sum(seconds) / 3600,
                "wall_hours": wall_hours(seconds, gpus, jobs_per_gpu, sharing_gain),
                "lower_bound": any(timings[j.cost_key].too_short for j in group),
            }
        )
    return rows


def measure(
    config: dict,
    jobs: list[Job],
    k: int,
    device: str,
    threads: int | None,
    data_workers: int = 0,
    evaluation: dict[str, EvalCost] | None = None,
) -> dict[str, Timing]:
    """Per cost key: fixed, per-round and test-pass seconds. With ``evaluation`` (a dict to fill),
    also the evaluation cost of each kind of job, keyed like the timings (measured once per
    ``eval_key``)."""
    timings: dict[str, Timing] = {}
    by_eval_key: dict[str, EvalCost] = {}
    warmed_up = False
    for job in jobs:
        if job.cost_key in timings:
            continue
        run_cfg = cfgmod.resolve_run(config, job.task, job.run, job.seed)
        store = Path(run_cfg["data"]["store"])
        if not store.exists():
            raise DataError(f"{store} does not exist: prepare the data first (e.g. snakemake {store.parent}/split.csv)")
        if not warmed_up:  # the first run in a process pays one-off costs (kernels, allocator, caches)
            with tempfile.TemporaryDirectory(prefix="fedmedbench-estimate-") as out:
                engine.run_training(
                    {**run_cfg, "rounds": 1},
                    Path(out),
                    device=device,
                    threads=threads,
                    progress=False,
                    data_workers=data_workers,
                )
            warmed_up = True
        seconds = []
        for rounds in (1, k):
            with tempfile.TemporaryDirectory(prefix="fedmedbench-estimate-") as out:
                started = time.perf_counter()
                # Test in the last round only (curve_every beyond it): see the module's docstring.
                engine.run_training(
                    {**run_cfg, "rounds": rounds, "curve_every": k + 1},
                    Path(out),
                    device=device,
                    threads=threads,
                    progress=False,
                    data_workers=data_workers,
                )
                seconds.append(time.perf_counter() - started)
        key = eval_key(run_cfg)
        if key not in by_eval_key:
            by_eval_key[key] = measure_evaluation(run_cfg, device, threads, data_workers)
        cost = by_eval_key[key]
        timing = dataclasses.replace(timing_from(seconds[0], seconds[1], k), test_seconds=cost.test_seconds)
        if too_short(seconds[0], seconds[1], k, cost.val_seconds):
            # Never a round of 0 s, or one shorter than its own validation: its validation is a lower bound.
            per_round = max(timing.seconds_per_round, cost.val_seconds)
            timing = dataclasses.replace(
                timing, fixed_seconds=max(seconds[0] - per_round, 0.0), seconds_per_round=per_round, too_short=True
            )
            log.warning("%s/%s: %s", job.task, job.run, too_short_advice(k))
        else:
            log.info(
                "%s/%s: %.2f s fixed + %.2f s per round + %.2f s per further test evaluation",
                job.task,
                job.run,
                timing.fixed_seconds,
                timing.seconds_per_round,
                timing.test_seconds,
            )
        timings[job.cost_key] = timing
        if evaluation is not None:
            evaluation[job.cost_key] = cost
    return timings


def format_table(
    rows: list[dict], device: str, gpus: int, jobs_per_gpu: int, sharing_gain: float, rounds_to_time: int = 2
) -> str:
    unit = "CPU-hours" if device.startswith("cpu") else "GPU-hours"
    lines = [
        f"Projected cost on {device} ({gpus} device(s), {jobs_per_gpu} job(s) each, sharing gain {sharing_gain:g}),",
        "not counting data preparation, Python start-up (a few seconds per job) and the report:",
        "",
        f"| experiment | jobs | {unit} | wall-hours |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        name = f"**{row['experiment']}**" if row["experiment"] == "total" else row["experiment"]
        at_least = ">= " if row.get("lower_bound") else ""
        lines.append(
            f"| {name} | {row['jobs']} | {at_least}{row['gpu_hours']:.2f} | {at_least}{row['wall_hours']:.2f} |"
        )
    if any(row.get("lower_bound") for row in rows):
        lines += ["", f">= {too_short_advice(rounds_to_time)}."]
    return "\n".join(lines)


def format_evaluation(
    jobs: list[Job], timings: dict[str, Timing], evaluation: dict[str, EvalCost], rounds_to_time: int = 2
) -> str:
    """One row per kind of job: what a round trains on, what it evaluates, and evaluation's share of
    the round's measured time (the rest: training, aggregation, checkpoint)."""
    lines = [
        "Evaluation per round (validation every round for model selection, test every `curve_every` rounds",
        "for the curves; a protocol choice, see docs/reviewers/index.md), measured on the same device:",
        "",
        "| task / run | samples trained | forward passes evaluated (val + test) | evaluation s | round s | evaluation share |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    seen = set()
    for job in jobs:
        if job.cost_key in seen or job.cost_key not in evaluation:
            continue
        seen.add(job.cost_key)
        cost, timing = evaluation[job.cost_key], timings[job.cost_key]
        # The round's average with every test pass of the job, the last one too (in fixed_seconds), as
        # the evaluation column counts them: then evaluation is a part of the round, never more.
        per_round = timing.round_seconds(job.rounds, job.test_rounds) + timing.test_seconds / job.rounds
        if timing.too_short or per_round <= 0:
            round_cell, share = "too short", "n/a"
        else:
            round_cell, share = f"{per_round:.2f}", f"{cost.seconds / per_round:.0%}"
        lines.append(
            f"| {job.task} / {job.run} | {cost.trained_samples:,} | {cost.passes:,.0f} ({cost.val_passes:,} + {cost.test_passes:,.0f}) "
            f"| {cost.seconds:.2f} | {round_cell} | {share} |"
        )
    if any(timings[key].too_short for key in seen):
        lines += ["", f"round s {too_short_advice(rounds_to_time)}."]
    return "\n".join(lines)
