"""Engine vs a plain PyTorch loop, per task: ms per optimizer step, the per-round breakdown
(train / eval / checkpoint) and the throughput of 1, 2, 4 concurrent jobs on one device.

    python benchmarks/bench_engine.py               # the paper shapes (for a GPU)
    python benchmarks/bench_engine.py --small       # shrunk shapes, minutes on a CPU

The plain loop is the reference the engine is measured against: the same model, optimizer, loss
and batch size, one batch already on the device, nothing else (no data loading, no evaluation, no
checkpoint). The engine runs the real round loop (FedAvg, 2 clients) on random data of the task's
shape written in the canonical store format. Prints Markdown tables; results go to
a dated file under benchmarks/results/ with the device named.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedmedbench.data.store import write_client, write_split_csv  # noqa: E402
from fedmedbench.fl import engine  # noqa: E402
from fedmedbench.fl import rounds as round_loop  # noqa: E402
from fedmedbench.fl.client import Client, build_optimizer  # noqa: E402
from fedmedbench.losses import build_loss  # noqa: E402
from fedmedbench.models import build_model  # noqa: E402
from fedmedbench.runconfig import RunConfig  # noqa: E402

UNET32 = {"name": "unet", "init_features": 32, "in_channels": 3, "num_classes": 2}
DENSENET121 = {"name": "densenet", "num_classes": 2}
TASKS = {
    # name: (kind, model, loss, optimizer, image size, batch, train samples per client)
    "prostate": ("segmentation", UNET32, "dice_ce", {"name": "adam", "lr": 1e-4, "betas": [0.9, 0.99]}, 384, 16, 100),
    "camelyon17": ("classification", DENSENET121, "ce", {"name": "sgd", "lr": 1e-3, "momentum": 0.9}, 96, 128, 1024),
    "nuclei": ("segmentation", UNET32, "dice", {"name": "sgd", "lr": 1e-4, "momentum": 0.9}, 256, 8, 64),
}
SMALL = {"prostate": (64, 8, 24), "camelyon17": (32, 32, 96), "nuclei": (64, 4, 16)}  # size, batch, samples
SMALL_MODELS = {"prostate": {**UNET32, "init_features": 8}, "nuclei": {**UNET32, "init_features": 8},
                "camelyon17": {**DENSENET121, "growth_rate": 8, "block_config": [2, 2, 2, 2], "num_init_features": 16}}  # fmt: skip


def task_spec(name: str, small: bool) -> dict:
    kind, model, loss, optimizer, size, batch, samples = TASKS[name]
    if small:
        (size, batch, samples), model = SMALL[name], SMALL_MODELS[name]
    return {
        "kind": kind,
        "model": model,
        "loss": loss,
        "optimizer": optimizer,
        "size": size,
        "batch": batch,
        "samples": samples,
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def kernel_choice(deterministic: bool):
    """cuDNN's and torch's kernel choice for a timed loop, restored after it. The engine's jobs run
    deterministic kernels on CUDA (``seeding.seed_everything``: cudnn.deterministic, no autotuning) and
    the engine's runs leave that set in this process, so each plain loop sets what it is timed with
    instead of inheriting whatever ran before it."""
    saved = (
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
    )
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = deterministic, False
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[0], saved[1]
        torch.use_deterministic_algorithms(saved[2], warn_only=True)


def plain_loop_ms(
    spec: dict, device: torch.device, steps: int, precision: str = "fp32", deterministic: bool = False
) -> float:
    """ms per step of the reference loop: forward, loss, backward, step on one resident batch, with
    torch's default kernel choice or (``deterministic``) the engine's."""
    with kernel_choice(deterministic):
        return _plain_loop_ms(spec, device, steps, precision)


def _plain_loop_ms(spec: dict, device: torch.device, steps: int, precision: str) -> float:
    model = build_model(spec["model"]).to(device)
    optimizer = build_optimizer(model.parameters(), RunConfig.from_dict(run_config(spec, "-", "-", 1)).optimizer)
    loss_fn = build_loss(spec["loss"])
    x = torch.rand(spec["batch"], 3, spec["size"], spec["size"], device=device)
    if spec["kind"] == "segmentation":
        y = torch.randint(0, 2, (spec["batch"], spec["size"], spec["size"]), device=device)
    else:
        y = torch.randint(0, 2, (spec["batch"],), device=device)
    if precision == "bf16":
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    model.train()

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - started) / steps * 1000


def write_store(root: Path, spec: dict, clients: int = 2) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    rows = []
    n_train = spec["samples"]
    n = n_train + 2 * spec["batch"]
    for c in range(clients):
        name = f"c{c}"
        images = rng.integers(0, 255, (n, spec["size"], spec["size"], 3), dtype=np.uint8)
        if spec["kind"] == "segmentation":
            labels = (rng.random((n, spec["size"], spec["size"])) > 0.7).astype(np.uint8)
        else:
            labels = rng.integers(0, 2, n).astype(np.int64)
        meta = pd.DataFrame(
            {"id": [f"{name}/{i}" for i in range(n)], "group": [f"{name}/{i}" for i in range(n)], "source": "bench"}
        )
        write_client(root / "store", name, images, labels, meta)
        parts = ["train"] * n_train + ["val"] * spec["batch"] + ["test"] * spec["batch"]
        rows += [
            {"client": name, "split": s, "row": i, "id": f"{name}/{i}", "group": f"{name}/{i}"}
            for i, s in enumerate(parts)
        ]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv"


def run_config(spec: dict, store, split, rounds: int, precision: str = "fp32") -> dict:
    return {
        "task": "bench", "method": "fedavg", "run": "fedavg", "seed": 0, "data": {"store": str(store), "split": str(split)},
        "kind": spec["kind"], "clients": ["c0", "c1"], "model": spec["model"], "loss": spec["loss"], "optimizer": spec["optimizer"],
        "rounds": rounds, "local_epochs": 1, "batch_size": spec["batch"], "selection_metric": "dice_paper" if spec["kind"] == "segmentation" else "accuracy",
        "intensity_scale": 1 / 255, "qualitative_samples": 0, "curve_every": 1, "precision": precision,
    }  # fmt: skip


def engine_breakdown(spec: dict, device: str, rounds: int, precision: str = "fp32") -> dict:
    """Seconds per round in train / eval / checkpoint, and engine ms per training step."""
    spent = {"train": 0.0, "eval": 0.0, "checkpoint": 0.0}
    dev = torch.device(device)

    def timed(part, fn):
        def wrapper(*args, **kwargs):
            sync(dev)
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync(dev)
                spent[part] += time.perf_counter() - started

        return wrapper

    # Patched where they are called: the sites' per-round evaluation, the engine's checkpoint.
    original = (Client.train, round_loop.evaluate, engine.save_state)
    Client.train = timed("train", Client.train)
    round_loop.evaluate = timed("eval", round_loop.evaluate)
    engine.save_state = timed("checkpoint", engine.save_state)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store, split = write_store(Path(tmp), spec)
            engine.run_training(
                run_config(spec, store, split, 1, precision), Path(tmp) / "warmup", device=device, progress=False
            )
            for part in spent:
                spent[part] = 0.0
            engine.run_training(
                run_config(spec, store, split, rounds, precision), Path(tmp) / "run", device=device, progress=False
            )
    finally:
        Client.train, round_loop.evaluate, engine.save_state = original
    steps_per_round = 2 * -(-spec["samples"] // spec["batch"])
    per_round = {k: v / rounds for k, v in spent.items()}
    return {
        **per_round,
        "steps_per_round": steps_per_round,
        "engine_ms_per_step": per_round["train"] / steps_per_round * 1000,
    }


def concurrent_throughput(task: str, small: bool, device: str, jobs: int, steps: int) -> float:
    """Steps per second of ``jobs`` plain-loop processes on one device: each builds its model and
    warms up, then all start timing together (a line on stdin), so start-up is not counted."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import bench_engine as b, torch;"
        f"b.plain_loop_ms(b.task_spec({task!r}, {small}), torch.device({device!r}), 2); print('ready', flush=True); sys.stdin.readline();"
        f"print(b.plain_loop_ms(b.task_spec({task!r}, {small}), torch.device({device!r}), {steps}), flush=True)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(jobs)
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    ms = [float(p.communicate()[0].strip()) for p in procs]
    return sum(1000 / m for m in ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="shrunk shapes for a CPU")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device: {name}; torch {torch.__version__}; shapes: {'small' if args.small else 'paper'}\n")
    results = {}
    # engine / plain: against the plain loop with the engine's (deterministic) kernel choice, the same numerics.
    print(
        "| task | plain ms/step fp32 | plain fp32, deterministic kernels | plain ms/step bf16 | engine ms/step (fp32, deterministic) | engine / plain | s/round train | eval | checkpoint |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for task in args.tasks:
        spec = task_spec(task, args.small)
        plain = plain_loop_ms(spec, device, args.steps)
        plain_det = plain_loop_ms(spec, device, args.steps, deterministic=True)
        plain_bf16 = plain_loop_ms(spec, device, args.steps, "bf16")
        eng = engine_breakdown(spec, args.device, args.rounds)
        results[task] = {"plain_ms": plain, "plain_deterministic_ms": plain_det, "plain_bf16_ms": plain_bf16, **eng}
        print(
            f"| {task} ({spec['size']}², batch {spec['batch']}) | {plain:.1f} | {plain_det:.1f} | {plain_bf16:.1f} | {eng['engine_ms_per_step']:.1f} | {eng['engine_ms_per_step'] / plain_det:.2f} | {eng['train']:.2f} | {eng['eval']:.2f} | {eng['checkpoint']:.2f} |"
        )
    print("\n| task | " + " | ".join(f"{j} job(s): steps/s (× one job)" for j in args.concurrency) + " |")
    print("|---|" + "---:|" * len(args.concurrency))
    for task in args.tasks:
        rates = [concurrent_throughput(task, args.small, args.device, j, args.steps) for j in args.concurrency]
        results[task]["throughput"] = dict(zip(map(str, args.concurrency), rates))
        print(f"| {task} | " + " | ".join(f"{r:.1f} ({r / rates[0]:.2f}×)" for r in rates) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "small": args.small, "results": results}, indent=2))


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    main()
