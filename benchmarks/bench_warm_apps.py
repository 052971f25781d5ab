#!/usr/bin/env python3
"""What the warm app server of a local Flower federation costs (``federation/warm.py``): the CPU of
its start (the imports a fresh ClientApp would repeat for every message) and its memory once ready.

    python benchmarks/bench_warm_apps.py --repeats 3 --csv benchmarks/results/DATE-warm-apps.csv

Starts the server as ``local_federation`` does (``warm.start``) in a temporary folder, waits until it
serves, reads its CPU time and memory (``psutil``: resident, of it file-backed), ends it; beside
it, one fresh interpreter running the same imports (``warm.preload``): the CPU a cold app pays per
message. Medians over ``--repeats``. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedmedbench.federation import warm  # noqa: E402
from fedmedbench.federation.processes import process_guard  # noqa: E402

PRELOAD = "import resource; from fedmedbench.federation.warm import preload; preload(); r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"


def warm_server() -> dict[str, float]:
    """One start of the warm app server: CPU seconds until it serves, memory (MB) once it does."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp, process_guard(env):  # ends the server as local_federation does
        t0 = time.monotonic()
        process, _ = warm.start(Path(tmp), env)
        wall = time.monotonic() - t0
        info = psutil.Process(process.pid)
        cpu, memory = info.cpu_times(), info.memory_info()
        return {
            "wall_s": wall,
            "cpu_s": cpu.user + cpu.system,
            "rss_mb": memory.rss / 1e6,
            "shared_mb": memory.shared / 1e6,
        }


def cold_imports() -> float:
    """CPU seconds of one fresh interpreter's imports of a ClientApp (what each cold message pays)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p),
    }
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD], env=env, capture_output=True, text=True, check=True, timeout=600
    )
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", type=Path, help="write the medians here (quantity, value, unit, how)")
    args = parser.parse_args(argv)
    starts = [warm_server() for _ in range(args.repeats)]
    colds = [cold_imports() for _ in range(args.repeats)]
    med = {key: statistics.median(s[key] for s in starts) for key in starts[0]}
    how = f"benchmarks/bench_warm_apps.py --repeats {args.repeats}; median"
    rows = [
        ("warm app server: CPU of its start (once per federation)", f"{med['cpu_s']:.1f}", "CPU s", how),
        ("warm app server: wall time until it serves", f"{med['wall_s']:.1f}", "s", how),
        ("warm app server: resident memory once ready", f"{med['rss_mb'] / 1000:.2f}", "GB", how),
        (
            "of it file-backed (libraries: shared with other processes that map them)",
            f"{med['shared_mb'] / 1000:.2f}",
            "GB",
            how,
        ),
        ("cold app: CPU of the same imports, for every message", f"{statistics.median(colds):.1f}", "CPU s", how),
    ]
    for quantity, value, unit, _ in rows:
        print(f"{quantity}: {value} {unit}")
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["quantity", "value", "unit", "how"])
            writer.writerows(rows)
        print(f"written: {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
