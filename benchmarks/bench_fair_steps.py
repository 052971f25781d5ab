"""How far the fair baselines' official rules move the global model, measured against FedAvg's step.

    python benchmarks/bench_fair_steps.py                      # the demo's Fed-LWR tasks, 3 rounds
    python benchmarks/bench_fair_steps.py --paper-model        # also the paper's UNet and optimizer
    python benchmarks/bench_fair_steps.py --csv benchmarks/results/2026-12-02-fair-steps.csv \\
        --markdown benchmarks/results/2026-12-02-fair-steps.md --paper-model

On the demo's Fed-LWR tasks (``prostate_lwr``, ``fundus``: config/config.yaml with the demo overlay
workflow/profiles/demo/demo.yaml, on the synthetic twins, which the pipeline's own rules prepare in a
temporary results folder), each of FedAvg, ``cgsv-official`` (Γ = 1), ``cgsv`` (Γ per round),
``qfedavg-official`` (L = 1/lr) and ``qfedavg`` (L capped) trains ``--rounds`` rounds from the same
initial model, seed and data order, built as the engine builds them, without evaluation. Per round:

- the global model's step ‖w^{t+1} − w^t‖ over the trainable parameters, and its ratio to FedAvg's step
  in the same round (each method on its own trajectory from round 2 on; round 1 starts from the same
  model, so every client's update Δ_i of round 1 is the same for every method);
- the mean over clients of ‖Δ_i‖, a client's trained parameters minus those it started the round with,
  and of ‖Δ_i‖ / (η·s_i·√N): Adam moves each of the N parameters by about η at most per step, so s_i
  local steps move the model by at most about η·s_i·√N (the paper-size estimates scale from this);
- CGSV: Γ of the round (‖u_N‖ <= Γ);
- q-FedAvg: Σ_k q F_k^(q−1) ‖Δw_k‖² / Σ_k L F_k^q, the ratio of h_k's two terms summed over clients
  (with Δw_k = L (w^t − w̄_k)), and L.

``--paper-model`` adds the same on the paper's model and optimizer (config/config.yaml's UNet at
init_features 32, Adam lr 1e-3, batch 8) on the same demo data (32 px images, the demo's few cases),
``--paper-rounds`` rounds (default 1): the model's size is the paper's, the number of local steps a
round is not (a few here, tens at paper size).
"""

from __future__ import annotations

import argparse
import copy
import csv
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CONFIGS = [ROOT / "config" / "config.yaml", ROOT / "workflow" / "profiles" / "demo" / "demo.yaml"]
TASKS = ("prostate_lwr", "fundus")
RUNS = ("fedavg", "cgsv-official", "cgsv", "qfedavg-official", "qfedavg")
# The paper's model and optimizer (config/config.yaml's task, before the demo overlay).
PAPER_KEYS = ("model", "optimizer", "batch_size")


def norm(tensors) -> float:
    return math.sqrt(math.fsum(float((t.double() ** 2).sum()) for t in tensors))


def measure(cfg, rounds: int) -> list[dict]:
    """Train ``rounds`` rounds of ``cfg`` (a RunConfig, method defaults merged) on CPU, as the engine's
    round loop without evaluation; per round: the global step, the clients' mean update, Γ (CGSV),
    h_k's term ratio and L (q-FedAvg), the mean local steps."""
    from fedmedbench.fl.data import load_clients
    from fedmedbench.fl.hooks import load_method
    from fedmedbench.fl.seeding import client_generator, seed_everything
    from fedmedbench.models import build_model
    from fedmedbench.ops.aggregate import parameter_keys

    device = torch.device("cpu")
    method = load_method(cfg.method, cfg.method_module)
    data = load_clients(Path(cfg.data.store), Path(cfg.data.split), list(cfg.clients), cfg.truncate_to_smallest)
    seed_everything(cfg.seed, device)
    model = build_model(cfg.model)
    keys = sorted(parameter_keys(model))
    root_n = math.sqrt(sum(p.numel() for p in model.parameters() if p.requires_grad))
    server = method.Server(cfg, model, len(data))
    clients = [
        method.Client(cfg, i, d, copy.deepcopy(model), client_generator(cfg.seed, i), device)
        for i, d in enumerate(data)
    ]
    for c in clients:
        c.receive(copy.deepcopy(server.package(c.index, 0)))
    rows = []
    for r in range(1, rounds + 1):
        server.round_index = r
        before = {k: server.global_state[k].detach().clone() for k in keys}
        replies, updates, steps, fractions = [], [], [], []
        for c in clients:
            start = {n: p.detach().clone() for n, p in c.model.named_parameters()}
            c.round_index = r
            c.train(cfg.local_epochs)
            # Δ_i before the reply: CGSV's reply resets the client's parameters.
            updates.append(norm(p.detach() - start[n] for n, p in c.model.named_parameters()))
            steps.append(c.steps)
            fractions.append(updates[-1] / (cfg.optimizer.lr * max(c.steps, 1) * root_n))
            replies.append(copy.deepcopy(c.reply()))
        queries = server.query(r, replies)
        if queries is not None:
            for c, q, reply in zip(clients, queries, replies):
                reply["answer"] = c.answer(q)
        server.aggregate(r, replies)
        log = server.round_log(r) or {}
        row = {
            "round": r,
            "global_step": norm(server.global_state[k].double() - before[k].double() for k in keys),
            "mean_client_update": math.fsum(updates) / len(updates),
            "local_steps": math.fsum(steps) / len(steps),
            "adam_bound_fraction": math.fsum(fractions) / len(fractions),
            "gamma": None,
            "h_term_ratio": None,
            "lipschitz": None,
        }
        if cfg.method == "cgsv":
            row["gamma"] = float(log[0]["gamma"])
        if cfg.method == "qfedavg":
            q = float(cfg.method_params["q"])
            L = float(log[0]["lipschitz"])
            linear = [L * v["loss"] ** q for v in log.values()]
            row["h_term_ratio"] = math.fsum(v["h"] for v in log.values()) / math.fsum(linear) - 1.0
            row["lipschitz"] = L
        rows.append(row)
        for c in clients:
            c.receive(copy.deepcopy(server.package(c.index, r)))
    return rows


def run_config(config: dict, task: str, run: str, paper: dict | None):
    """The run's RunConfig from the merged config; ``paper``: the task's paper model and optimizer."""
    from fedmedbench.config import resolve_run
    from fedmedbench.runconfig import RunConfig

    resolved = resolve_run(config, task, run, 0)
    if paper is not None:
        resolved.update({k: copy.deepcopy(paper[k]) for k in PAPER_KEYS})
    return RunConfig.from_dict(resolved, where=f"tasks.{task} (run {run})")


def prepare(results: Path) -> dict:
    """The merged demo config with its results under ``results``, the two tasks' data prepared there."""
    from fedmedbench import config as cfgmod
    from fedmedbench.federation.local import prepare_data

    config = cfgmod.load_config(*CONFIGS)
    config["results_dir"] = str(results)
    targets = [cfgmod.task_data_dir(config, t) / "split.csv" for t in TASKS]
    # The rules' shell commands call `python -m fedmedbench`: this interpreter's.
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    prepare_data([str(p) for p in CONFIGS], str(results), targets, results / "snakemake.log")
    return config


def fmt(value) -> str:
    """Three significant digits; exponents written short (7.93e3, 3.26e-5)."""
    if value is None:
        return ""
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), f"{value:.3g}")


def table(config: dict, settings: list[tuple[str, dict | None, int]], task: str) -> list[dict]:
    out = []
    for setting, paper, rounds in settings:
        measured = {}
        for run in RUNS:
            cfg = run_config(config, task, run, paper)
            measured[run] = measure(cfg, rounds)
        for run in RUNS:
            rows = measured[run]
            ratios = [m["global_step"] / f["global_step"] for m, f in zip(rows, measured["fedavg"])]
            first = rows[0]
            out.append(
                {
                    "task": task,
                    "setting": setting,
                    "model": f"UNet-{cfg.model.init_features}",
                    "local_steps": fmt(first["local_steps"]),
                    "run": run,
                    "global_step_r1": fmt(first["global_step"]),
                    "step_over_fedavg_r1": fmt(ratios[0]),
                    "step_over_fedavg_rounds": " / ".join(fmt(x) for x in ratios),
                    "mean_client_update_r1": fmt(first["mean_client_update"]),
                    "adam_bound_fraction_r1": fmt(first["adam_bound_fraction"]),
                    "gamma_r1": fmt(first["gamma"]),
                    "h_term_ratio_r1": fmt(first["h_term_ratio"]),
                    "lipschitz_r1": fmt(first["lipschitz"]),
                }
            )
    return out


def machine() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), model)
    except (OSError, subprocess.CalledProcessError):
        pass
    memory = ""
    try:
        kb = next(
            int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")
        )
        memory = f", {kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{model} (lscpu model name), {os.cpu_count()} CPUs{memory}; torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "benchmarks/bench_fair_steps.py"], cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    changed = [line[3:] for line in dirty.stdout.splitlines()]
    return head.stdout.strip() + (f" (uncommitted changes in: {', '.join(changed)})" if changed else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3)")
    parser.add_argument("--paper-model", action="store_true", help="also the paper's UNet-32, Adam 1e-3, batch 8")
    parser.add_argument("--paper-rounds", type=int, default=1, help="rounds of the paper-model runs (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--results", type=Path, help="where to prepare the data (default: a temporary folder)")
    parser.add_argument("--csv", type=Path, help="write the table here")
    parser.add_argument("--markdown", type=Path, help="write the record here: machine, commit, command, how")
    args = parser.parse_args(argv)
    for name in ("rounds", "paper_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a whole number >= 1, got {getattr(args, name)}")
    if args.markdown and not args.csv:
        parser.error("--markdown: give --csv too (the record shows the CSV's table)")
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fair-steps-") as tmp:
        results = (args.results or Path(tmp)).resolve()
        config = prepare(results)
        from fedmedbench.config import load_config

        base = load_config(CONFIGS[0])  # the paper's tasks, before the demo overlay
        rows = []
        for task in TASKS:
            settings = [("demo", None, args.rounds)]
            if args.paper_model:
                settings.append(("paper model, demo data", base["tasks"][task], args.paper_rounds))
            rows += table(config, settings, task)
    seconds = time.perf_counter() - started
    columns = list(rows[0])
    writer = csv.DictWriter(sys.stdout, columns)
    writer.writeheader()
    writer.writerows(rows)
    print(f"bench_fair_steps: {seconds:.0f} s", file=sys.stderr)
    if args.csv:
        with open(args.csv, "w", newline="", encoding="utf-8") as f:
            out = csv.DictWriter(f, columns, lineterminator="\n")
            out.writeheader()
            out.writerows(rows)
    if args.markdown:
        command = "python " + " ".join(
            shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])]
        )
        args.markdown.write_text(record(command, args), encoding="utf-8")
    return 0


def record(command: str, args) -> str:
    csv_name = args.csv.name
    block = args.csv.stem  # scripts/docs_numbers.py's RECORD_TABLES fills it
    paper = (
        f" The setting 'paper model, demo data' ({args.paper_rounds} round(s)) replaces the demo's model,"
        " optimizer and batch size by config/config.yaml's (UNet-32, Adam lr 1e-3, batch 8) on the same"
        " 32 px demo data: the paper's model size, not its number of local steps."
        if args.paper_model
        else ""
    )
    return f"""# The fair baselines' official rules: how far they move the model against FedAvg ({time.strftime("%Y-%m-%d")})

| | |
|---|---|
| machine | {machine()}; no GPU; load average {os.getloadavg()[0]:.1f} at the end |
| commit | {commit()} |
| command | `{command}` |
| result | [`{csv_name}`]({csv_name}); the table in [docs/reviewers/fedlwr.md](../../docs/reviewers/fedlwr.md#adapted-and-official-rule-rows) is written from it by `make docs` |

What was run ([`benchmarks/bench_fair_steps.py`](../bench_fair_steps.py), its docstring says it in full):
the demo's Fed-LWR tasks (`prostate_lwr` and `fundus`: config/config.yaml with the demo overlay, on
the synthetic twins, prepared by the pipeline's own rules in a temporary results folder), each of
FedAvg, `cgsv-official`, `cgsv`, `qfedavg-official` and `qfedavg` trained {args.rounds} round(s) from the
same initial model, seed and data order, without evaluation, on CPU.{paper}

Columns of the CSV:

- `local_steps`: a client's optimizer steps in round 1, the mean over clients;
- `global_step_r1`: ‖w¹ − w⁰‖ of the global model over the trainable parameters;
- `step_over_fedavg_r1`: that over FedAvg's in the same setting; `step_over_fedavg_rounds` the same
  ratio for every round, each method on its own trajectory from round 2 on;
- `mean_client_update_r1`: the mean over clients of ‖Δ_i‖ in round 1 (the same for every method: the
  same model, data order and optimizer);
- `adam_bound_fraction_r1`: ‖Δ_i‖ over η·s_i·√N, the most s_i Adam steps of length η per coordinate
  can move N parameters, the mean over clients in round 1;
- `gamma_r1`: CGSV's Γ in round 1 (the server's step is at most Γ);
- `h_term_ratio_r1`: q-FedAvg's Σ_k q·F_k^(q−1)·‖Δw_k‖² over Σ_k L·F_k^q in round 1, with
  Δw_k = L·(w⁰ − w̄_k); `lipschitz_r1` the L of round 1.

Values have three significant digits as written by the script; they are deterministic for a given
commit, thread count and machine's floating point.

## Result (`{csv_name}`)

<!-- generated:{block} -->
<!-- /generated -->
"""


if __name__ == "__main__":
    sys.exit(main())
