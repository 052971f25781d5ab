"""A cost estimate to read before launching: ``python -m fedmedbench estimate``.

Every training job of the selected experiments is resolved from the config. Jobs that cost the same
per round — same task, method, local epochs and model — share one measurement: that job is trained
here, on this device, once for 1 round and once for k rounds (``--rounds-to-time``), which separates
the fixed cost (process start, data, first-round warm-up, final outputs) from the cost of one more
round. Each job is then projected as ``fixed + rounds x per_round``.

GPU-hours are the sum over jobs. Wall-hours assume the jobs are spread over ``gpus`` devices with
``jobs_per_gpu`` concurrent jobs each, whose combined throughput is ``sharing_gain`` times one job's
(1.0 = no gain from sharing, the safe default; measure yours with ``benchmarks/bench_engine.py``).
They are never less than the longest single job, slowed by sharing.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fedmedbench import config as cfgmod

log = logging.getLogger("fedmedbench.estimate")


@dataclass(frozen=True)
class Job:
    experiment: str
    task: str
    run: str
    seed: int
    rounds: int
    cost_key: str  # jobs with the same key cost the same per round


@dataclass(frozen=True)
class Timing:
    fixed_seconds: float
    seconds_per_round: float

    def job_seconds(self, rounds: int) -> float:
        return self.fixed_seconds + rounds * self.seconds_per_round


def cost_key(run_cfg: dict) -> str:
    return json.dumps([run_cfg["task"], run_cfg["method"], run_cfg["local_epochs"], run_cfg["model"]], sort_keys=True)


def jobs_of(config: dict, experiments: list[str]) -> list[Job]:
    jobs = []
    for experiment in experiments:
        for task, run, seed in cfgmod.experiment_runs(config, experiment):
            run_cfg = cfgmod.resolve_run(config, task, run, seed)
            jobs.append(Job(experiment, task, run, seed, run_cfg["rounds"], cost_key(run_cfg)))
    return jobs


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


def project(jobs: list[Job], timings: dict[str, Timing], gpus: int, jobs_per_gpu: int, sharing_gain: float) -> list[dict]:
    """One row per experiment and a final ``total`` row (a job shared by experiments counted once)."""
    rows = []
    by_experiment: dict[str, list[Job]] = {}
    for job in jobs:
        by_experiment.setdefault(job.experiment, []).append(job)
    unique = {(j.task, j.run, j.seed): j for j in jobs}
    for name, group in [*by_experiment.items(), ("total", list(unique.values()))]:
        seconds = [timings[j.cost_key].job_seconds(j.rounds) for j in group]
        rows.append({"experiment": name, "jobs": len(group), "gpu_hours": sum(seconds) / 3600, "wall_hours": wall_hours(seconds, gpus, jobs_per_gpu, sharing_gain)})
    return rows


def measure(config: dict, jobs: list[Job], k: int, device: str, threads: int | None) -> dict[str, Timing]:
    from fedmedbench.fl.engine import run_training

    timings: dict[str, Timing] = {}
    warmed_up = False
    for job in jobs:
        if job.cost_key in timings:
            continue
        run_cfg = cfgmod.resolve_run(config, job.task, job.run, job.seed)
        store = Path(run_cfg["data"]["store"])
        if not store.exists():
            from fedmedbench.errors import DataError

            raise DataError(f"{store} does not exist: prepare the data first (e.g. snakemake {store.parent}/split.csv)")
        if not warmed_up:  # the first run in a process pays one-off costs (kernels, allocator, caches)
            with tempfile.TemporaryDirectory(prefix="fedmedbench-estimate-") as out:
                run_training({**run_cfg, "rounds": 1}, Path(out), device=device, threads=threads, progress=False)
            warmed_up = True
        seconds = []
        for rounds in (1, k):
            with tempfile.TemporaryDirectory(prefix="fedmedbench-estimate-") as out:
                started = time.perf_counter()
                run_training({**run_cfg, "rounds": rounds}, Path(out), device=device, threads=threads, progress=False)
                seconds.append(time.perf_counter() - started)
        timings[job.cost_key] = timing_from(seconds[0], seconds[1], k)
        log.info("%s/%s: %.2f s fixed + %.2f s per round", job.task, job.run, timings[job.cost_key].fixed_seconds, timings[job.cost_key].seconds_per_round)
    return timings


def format_table(rows: list[dict], device: str, gpus: int, jobs_per_gpu: int, sharing_gain: float) -> str:
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
        lines.append(f"| {name} | {row['jobs']} | {row['gpu_hours']:.2f} | {row['wall_hours']:.2f} |")
    return "\n".join(lines)
