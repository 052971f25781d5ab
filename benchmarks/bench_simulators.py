"""Two simulators of the same FedAvg: this project's engine vs Flower's simulation runtime (Ray).

    python benchmarks/bench_simulators.py                      # prostate, bench_engine's small shapes
    python benchmarks/bench_simulators.py --rounds 2 --repeats 3 --task camelyon17

The work is ``bench_engine.py``'s (the same task shapes, store and run config, so its plain-loop
table is the third column beside this one): FedAvg, 2 clients, CPU, one torch thread per site and
for the server. The Flower leg is ``runtime: flower-simulation``
(``fedmedbench.federation.simulation.run_simulated``): Flower 1.42's ``run_simulation`` with
the generic ServerApp (the engine's round loop over ``Grid.send_and_receive``) and the generic
ClientApp (the engine's client, its state restored before every message) in Ray actors.

Every run is a fresh process (so neither leg inherits the other's imports, threads or Ray), in the
order engine R, engine 2R, Flower R, Flower 2R per repetition (interleaved: load on this shared
machine hits both legs alike). Per round: ``(t(2R) - t(R)) / R`` of the time inside the process
around the training call (interpreter start-up excluded, Ray start-up and shut-down included in
both runs, so it cancels). Peak memory: the largest sum of the resident set sizes of the process
and all its descendants (Ray's GCS, raylet and worker processes included), sampled every 50 ms
(RSS counts shared pages in every process, so a multi-process leg is over-counted by its shared
libraries; stated beside the number). Weights: the largest absolute difference between the two
legs' ``model_best.pt`` tensors (2R rounds). Refuses in one line where flwr or Ray is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

try:
    import flwr  # noqa: F401
    import ray  # noqa: F401
except ImportError as err:
    sys.exit(
        f"bench_simulators.py: Flower's simulation runtime is not installed ({err.name} missing); install the flower extra (pip install -e '.[flower]')"
    )

import psutil  # noqa: E402


def child(args) -> None:
    """One run in this fresh process; prints {"seconds": ...} as its last line."""
    import bench_engine as b
    import torch

    torch.set_num_threads(1)
    spec = b.task_spec(args.task, small=not args.paper)
    cfg = b.run_config(spec, args.store, args.split, args.rounds)
    started = time.perf_counter()
    if args.child == "engine":
        from fedmedbench.fl.engine import run_training

        run_training(cfg, Path(args.out), device="cpu", threads=1, progress=False)
    else:
        from fedmedbench.federation.simulation import run_simulated

        run_simulated(cfg, Path(args.out), device="cpu", threads=1, progress=False)
    print(json.dumps({"seconds": time.perf_counter() - started}), flush=True)


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def stop_tree(process: psutil.Process) -> None:
    """End a leg and every process it started (Ray's included), children first."""
    procs = process.children(recursive=True) + [process]
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(procs, timeout=10)


def measured(command: list[str], log: Path, timeout: float) -> tuple[float, int]:
    """Run ``command``; (its reported seconds, peak RSS of its process tree in bytes)."""
    with log.open("w") as handle:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=handle, text=True, env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
        )
    peak, root, done = 0, psutil.Process(proc.pid), threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, tree_rss(root))
            except psutil.NoSuchProcess:
                return
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # e.g. Ray's raylet that never came up on an overloaded machine
        stop_tree(root)
        done.set()
        sys.exit(
            f"bench_simulators.py: {' '.join(command[2:6])} did not end within {timeout:.0f} s (stopped); its log: {log}\n{log.read_text()[-1500:]}"
        )
    done.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(
            f"bench_simulators.py: {' '.join(command[2:6])} failed with exit code {proc.returncode}; its log: {log}\n{log.read_text()[-3000:]}"
        )
    return json.loads(out.strip().splitlines()[-1])["seconds"], peak


def flat_tensors(value, prefix="") -> dict:
    import torch

    if isinstance(value, torch.Tensor):
        return {prefix: value}
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(flat_tensors(item, f"{prefix}/{key}"))
        return out
    return {}


def max_weight_difference(a: Path, b: Path) -> float:
    import torch

    ta = flat_tensors(torch.load(a, map_location="cpu", weights_only=True))
    tb = flat_tensors(torch.load(b, map_location="cpu", weights_only=True))
    if ta.keys() != tb.keys():
        return float("inf")
    return max((float((ta[k].double() - tb[k].double()).abs().max()) if ta[k].numel() else 0.0) for k in ta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="prostate", choices=["prostate", "camelyon17", "nuclei"])
    parser.add_argument(
        "--paper", action="store_true", help="the papers' shapes (for a GPU machine; minutes per round on a CPU)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="R: each leg runs R and 2R rounds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument(
        "--leg-timeout",
        type=float,
        default=900,
        help="seconds one run may take before the benchmark stops it and refuses",
    )
    parser.add_argument("--child", choices=["engine", "flower"], help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--split", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    import bench_engine as b

    spec = b.task_spec(args.task, small=not args.paper)
    r = args.rounds
    print(f"machine: {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f} at start; flwr {flwr.__version__}, ray {ray.__version__}; "
          f"task {args.task} ({spec['size']}², batch {spec['batch']}, {spec['samples']} train samples per client, 2 clients), FedAvg, 1 thread per site\n")  # fmt: skip
    times: dict[str, dict[int, list[float]]] = {"engine": {r: [], 2 * r: []}, "flower": {r: [], 2 * r: []}}
    peaks: dict[str, list[int]] = {"engine": [], "flower": []}
    diffs = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store, split = b.write_store(tmp, spec)
        for rep in range(args.repeats):
            for leg in ("engine", "flower"):
                for rounds in (r, 2 * r):
                    out = tmp / f"{leg}-{rounds}-{rep}"
                    command = [
                        sys.executable,
                        __file__,
                        "--child",
                        leg,
                        "--task",
                        args.task,
                        "--rounds",
                        str(rounds),
                        "--store",
                        str(store),
                        "--split",
                        str(split),
                        "--out",
                        str(out),
                    ]
                    if args.paper:
                        command.append("--paper")
                    seconds, peak = measured(command, tmp / f"{leg}-{rounds}-{rep}.log", args.leg_timeout)
                    times[leg][rounds].append(seconds)
                    peaks[leg].append(peak)
            diffs.append(
                max_weight_difference(
                    tmp / f"engine-{2 * r}-{rep}" / "model_best.pt", tmp / f"flower-{2 * r}-{rep}" / "model_best.pt"
                )
            )
            print(f"  repetition {rep + 1}: engine {times['engine'][r][-1]:.1f} / {times['engine'][2 * r][-1]:.1f} s, Flower (Ray) {times['flower'][r][-1]:.1f} / {times['flower'][2 * r][-1]:.1f} s "
                  f"({r} / {2 * r} rounds); max |Δw| {diffs[-1]:.3g}", flush=True)  # fmt: skip
    per_round = {leg: [(b2 - b1) / r for b1, b2 in zip(t[r], t[2 * r])] for leg, t in times.items()}
    ratios = [f / e for e, f in zip(per_round["engine"], per_round["flower"])]
    startup = {leg: statistics.median([b1 - (b2 - b1) for b1, b2 in zip(t[r], t[2 * r])]) for leg, t in times.items()}
    mib = 1024**2
    print(f"\nmachine load average at the end: {os.getloadavg()[0]:.1f}\n")
    print(
        f"| simulator | s/round (median of {args.repeats}) | × engine (per repetition) | start-up + shut-down s | peak RSS, all processes (MiB) | × engine | max abs weight difference vs engine |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(
        f"| engine (fedmedbench) | {statistics.median(per_round['engine']):.2f} | 1 | {startup['engine']:.1f} | {max(peaks['engine']) / mib:.0f} | 1 | 0 |"
    )
    print(
        f"| Flower simulation (Ray) | {statistics.median(per_round['flower']):.2f} | {', '.join(f'{x:.2f}' for x in ratios)} | {startup['flower']:.1f} | {max(peaks['flower']) / mib:.0f} | {max(peaks['flower']) / max(peaks['engine']):.1f} | {max(diffs):.3g} |"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "task": args.task,
                    "spec": spec,
                    "times": times,
                    "per_round": per_round,
                    "peak_rss": peaks,
                    "max_weight_difference": diffs,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
