"""Where a no-op Snakemake call spends its time (a no-op rerun of the demo must stay <= 5 s).

Measures, in one run on this machine:
- the config: load + validate (schema, every method parameter and variant, references), and the
  resolution of every training job's run config (what Snakemake evaluates for each job's params);
- the job server: time from `with-jobserver` to its command starting (`true`);
- `snakemake -n` and a no-op `with-jobserver snakemake` on the demo profile. The demo must be built
  (`make demo`): without it the "no-op" would build the whole demo, so the benchmark refuses in one
  line, before timing anything.

    python benchmarks/bench_dag.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
PROFILE = ["--workflow-profile", "workflow/profiles/demo"]


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)


def demo_problem() -> str | None:
    """Why the no-op cannot be timed (the demo is not built, or the DAG fails), else None. A dry run
    only: nothing is built."""
    dry = run([sys.executable, "-m", "snakemake", "-n", *PROFILE])
    output = dry.stdout + dry.stderr
    if dry.returncode != 0:
        last = [line for line in output.splitlines() if line.strip()][-1:] or ["(no output)"]
        return f"`snakemake -n` on the demo profile fails: {last[0].strip()}"
    if "Nothing to be done" not in output:
        planned = re.search(r"^total\s+(\d+)", output, re.MULTILINE)
        jobs = f"{planned.group(1)} jobs" if planned else "jobs"
        return f"the demo is not built ({jobs} to run): run `make demo` first, so that the no-op rerun this benchmark times has nothing to do"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    problem = demo_problem()
    if problem:
        raise SystemExit(f"bench_dag: {problem}")
    from fedmedbench import config as cfgmod

    files = [ROOT / "config" / "config.yaml", ROOT / "workflow/profiles/demo/demo.yaml"]
    config = cfgmod.load_config(*files)
    jobs = sorted({job for name in config["experiments"] for job in cfgmod.experiment_runs(config, name)})
    rows = [
        ("config load + validate", best_of(args.repeat, lambda: cfgmod.load_config(*files))),
        (
            f"resolve {len(jobs)} run configs",
            best_of(args.repeat, lambda: [cfgmod.resolve_run(config, *job) for job in jobs]),
        ),
        (
            "with-jobserver: command starts",
            best_of(args.repeat, lambda: run([sys.executable, "-m", "fedmedbench", "with-jobserver", "true"])),
        ),
        ("snakemake -n (demo)", best_of(args.repeat, lambda: run([sys.executable, "-m", "snakemake", "-n", *PROFILE]))),
    ]
    rows.append(
        (
            "no-op with-jobserver snakemake (demo)",
            best_of(
                args.repeat,
                lambda: run(
                    [sys.executable, "-m", "fedmedbench", "with-jobserver", sys.executable, "-m", "snakemake", *PROFILE]
                ),
            ),
        )
    )
    load = os.getloadavg()[0]
    print(f"best of {args.repeat}, {os.cpu_count()} cores, load average {load:.1f}")
    for name, seconds in rows:
        print(f"{name:<40} {seconds:6.2f} s")


if __name__ == "__main__":
    main()
