"""Checkpoints at the papers' model sizes (fl/checkpoint.py): bytes against the unique state, write time
against a plain ``torch.save`` of the same tensors to the same disk.

    python benchmarks/bench_checkpoint.py                       # prostate, camelyon17, skin (paper sizes)
    python benchmarks/bench_checkpoint.py --tasks prostate --reps 7
    python benchmarks/bench_checkpoint.py --small               # the demo's model sizes: seconds
    python benchmarks/bench_checkpoint.py --csv benchmarks/results/<date>-checkpoint.csv   # a record's table
    python benchmarks/bench_checkpoint.py --device cuda         # the state in GPU memory, as a GPU job's

The state is the engine's own at the end of a round: config.yaml's task (model, optimizer, clients)
with FedAvg, the real ``Server``/``Client`` objects (each client took one optimizer step, so Adam or
momentum buffers exist as in a run, then received the global model), and the selection of that round.
``checkpoint_object`` is what ``runfolder.save_state`` writes.

Numbers:
- *state*: bytes of every tensor storage the checkpoint holds (what a ``torch.save`` of it writes);
  *unique*: each distinct content once, found independently of the checkpoint code (SHA-256 of the
  bytes of every storage); *file*: the checkpoint's size on disk. Target: file <= 1.1 x unique.
- write times, medians over ``--reps`` interleaved repetitions (after two untimed rounds, so each write
  replaces the one before, as in a run): ``checkpoint.save``, against a plain ``torch.save`` to a file
  on the same disk, then fsynced (as durable as a checkpoint), of the same state (every tensor of it,
  copies included: what ``torch.save(state)`` writes; target: checkpoint <= 1.5 x it), and of the
  distinct tensors alone (one of each content: the bytes a checkpoint must write at least, with nothing
  of its work: the deduplication's compares, the checksum, the renames); the latter also without the
  fsync. Every write starts after an untimed ``sync``, so none pays for the writeback of the one before.
  The ratios are also given as the median of each repetition's own ratio (steadier when other
  processes come and go).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedmedbench import config as cfgmod  # noqa: E402
from fedmedbench.fl import checkpoint  # noqa: E402
from fedmedbench.fl.seeding import client_generator, global_rng_state  # noqa: E402
from fedmedbench.fl.selection import Selection  # noqa: E402
from fedmedbench.models import build_model  # noqa: E402
from fedmedbench.registry import load_method  # noqa: E402
from fedmedbench.runconfig import RunConfig  # noqa: E402

TASKS = ("prostate", "camelyon17", "skin")
SMALL_MODELS = {  # the demo's models (workflow/profiles/demo/demo.yaml)
    "prostate": {"init_features": 8},
    "camelyon17": {"growth_rate": 8, "block_config": [2, 2, 2, 2], "num_init_features": 16},
    "skin": {"name": "vgg_slim", "init_features": 4},
}


def run_config(task: str, small: bool) -> RunConfig:
    config = cfgmod.load_config(ROOT / "config" / "config.yaml")
    cfg = cfgmod.resolve_run(config, task, "fedavg", 0)
    if small:
        cfg["model"] = {**cfg["model"], **SMALL_MODELS[task]}
    return RunConfig.from_dict(cfg)


def build_state(task: str, small: bool, device: str = "cpu"):
    """The engine's objects at the end of round 1 of FedAvg on ``task``: server, clients (optimizer
    state present unless the task rebuilds optimizers each round), selection (every client's
    evaluated model selected at this round)."""
    torch.manual_seed(0)
    cfg = run_config(task, small)
    method = load_method(cfg.method, cfg.method_module)
    model = build_model(cfg.model).to(device)
    server = method.Server(cfg, model, len(cfg.clients))
    clients = []
    for i, name in enumerate(cfg.clients):
        data = SimpleNamespace(name=name, train=range(8))
        client = method.Client(cfg, i, data, copy.deepcopy(model), client_generator(0, i), torch.device(device))
        client.round_index = 1
        # One optimizer step on a cheap loss: the optimizer state (Adam moments, momentum) exists
        # with its real shapes and distinct values per client, as after local training.
        client.optimizer.zero_grad(set_to_none=True)
        sum((p * (1.0 + i)).sum() for p in client.model.parameters()).backward()
        client.optimizer.step()
        client.optimizer.zero_grad(set_to_none=True)
        clients.append(client)
    for client in clients:
        client.receive(server.package(client.index, 1))
    per_client = {"auto": method.PERSONALIZED, "per_client": True, "pooled": False}[cfg.selection_scope]
    selection = Selection(list(cfg.clients), cfg.selection_metric, per_client=per_client)
    val = {n: {cfg.selection_metric: 0.5} for n in cfg.clients}
    for key, covered in selection.improved(val, 1).items():
        models = {
            n: {k: v.detach().cpu().clone() for k, v in clients[cfg.clients.index(n)].eval_model().state_dict().items()}
            for n in covered
        }
        selection.record(key, 1, val, models, {n: {} for n in covered})
    return cfg, server, clients, selection


def checkpoint_object(server, clients, selection) -> dict:
    """What ``runfolder.save_state`` checkpoints (the history rows live in their own log)."""
    return {
        "config_hash": "x",
        "data_digest": "y",
        "round": 1,
        "server": server.state_dict(),
        "clients": [c.state_dict() for c in clients],
        "selection": selection.state_dict(),
        "rng": global_rng_state(),
        "history_log": {"bytes": 0, "crc32": 0, "rows": 0},
    }


def tensors_of(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tensors_of(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from tensors_of(v)


def distinct(tree) -> tuple[int, list[torch.Tensor]]:
    """(bytes of all distinct storages, one tensor per distinct content): contents by SHA-256."""
    storages, contents = {}, {}
    for t in tensors_of(tree):
        s = t.untyped_storage()
        if (s.device, s.data_ptr(), s.nbytes()) not in storages:
            storages[(s.device, s.data_ptr(), s.nbytes())] = s
            data = torch.empty(0, dtype=torch.uint8, device=s.device).set_(s).cpu().numpy()
            contents.setdefault(
                hashlib.sha256(data).digest(), torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)
            )
    return sum(s.nbytes() for s in storages.values()), list(contents.values())


def torch_save_fsync(obj, path: Path) -> None:
    """A plain torch.save, then fsync: as durable as a checkpoint, with nothing else of its work."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def timed(fn, *args) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: all threads, user + system)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def bench_task(task: str, small: bool, reps: int, tmp: Path, device: str) -> dict:
    cfg, server, clients, selection = build_state(task, small, device)
    obj, heavy = checkpoint_object(server, clients, selection), selection.heavy_state()
    state_bytes, unique = distinct(obj)
    unique_bytes = sum(t.numel() for t in unique)
    plain = {i: t for i, t in enumerate(unique)}  # the same distinct tensors, for torch.save
    checkpoint.save(heavy, tmp / "selection.pt")
    sel_state, sel_unique = distinct(heavy)
    sizes = {
        "selection_state": sel_state,
        "selection_unique": sum(t.numel() for t in sel_unique),
        "selection_file": (tmp / "selection.pt").stat().st_size,
    }
    variants = {
        "checkpoint": (checkpoint.save, obj, tmp / "checkpoint.pt"),
        "state_fsync": (torch_save_fsync, obj, tmp / "state.pt"),
        "distinct_fsync": (torch_save_fsync, plain, tmp / "distinct-fsync.pt"),
        "distinct": (torch.save, plain, tmp / "distinct.pt"),
    }
    times = {key: [] for key in variants} | {f"{key}_cpu": [] for key in variants}
    loads = [os.getloadavg()[0]]
    for rep in range(reps + 2):
        for key, (fn, *args) in variants.items():
            os.sync()  # untimed: the writeback of the write before (the fsync-less one's) is not charged to this one
            wall, cpu = timed(fn, *args)
            if rep >= 2:  # two untimed rounds first: the files of a run's steady state
                times[key].append(wall)
                times[f"{key}_cpu"].append(cpu)
    loads.append(os.getloadavg()[0])
    back = checkpoint.load(tmp / "checkpoint.pt")
    assert all(torch.equal(a.cpu(), b) for a, b in zip(tensors_of(obj), tensors_of(back))), (
        "the checkpoint read back differs"
    )
    file_bytes, state_file_bytes = (tmp / "checkpoint.pt").stat().st_size, (tmp / "state.pt").stat().st_size
    for path in tmp.iterdir():
        path.unlink()
    median = {k: statistics.median(v) for k, v in times.items()}
    per_rep = {
        f"checkpoint_per_{k}": statistics.median(a / b for a, b in zip(times["checkpoint"], times[k]))
        for k in ("state_fsync", "distinct_fsync", "distinct")
    }
    model_bytes = sum(v.numel() * v.element_size() for v in clients[0].model.state_dict().values())
    return {
        "task": task,
        "model": cfg.model.name,
        "clients": len(cfg.clients),
        "optimizer": cfg.optimizer.name,
        "device": device,
        "model_bytes": model_bytes,
        "state_bytes": state_bytes,
        "unique_bytes": unique_bytes,
        "file_bytes": file_bytes,
        "state_file_bytes": state_file_bytes,
        **sizes,
        "times": median | per_rep,
        "load": loads,
    }


def mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def csv_row(r: dict) -> dict:
    """One task's numbers as the record shows them (rounded here, once: the record copies them)."""
    t = r["times"]
    row = {
        "task": r["task"],
        "model": r["model"],
        "clients": r["clients"],
        "optimizer": r["optimizer"],
        "device": r["device"],
        "model_mb": mb(r["model_bytes"]),
        "state_mb": mb(r["state_bytes"]),
        "unique_mb": mb(r["unique_bytes"]),
        "file_mb": mb(r["file_bytes"]),
        "file_over_unique": f"{r['file_bytes'] / r['unique_bytes']:.3f}",
        "torch_save_state_file_mb": mb(r["state_file_bytes"]),
        "selection_state_mb": mb(r["selection_state"]),
        "selection_unique_mb": mb(r["selection_unique"]),
        "selection_file_mb": mb(r["selection_file"]),
        "selection_file_over_unique": f"{r['selection_file'] / r['selection_unique']:.3f}",
        "load_start": f"{r['load'][0]:.1f}",
        "load_end": f"{r['load'][1]:.1f}",
    }
    for key in ("checkpoint", "state_fsync", "distinct_fsync", "distinct"):
        row[f"{key}_s"] = f"{t[key]:.3f}"
        row[f"{key}_cpu_s"] = f"{t[f'{key}_cpu']:.3f}"
    for key in ("state_fsync", "distinct_fsync", "distinct"):
        row[f"checkpoint_over_{key}"] = f"{t['checkpoint'] / t[key]:.2f}"
        row[f"checkpoint_over_{key}_per_rep"] = f"{t[f'checkpoint_per_{key}']:.2f}"
    return row


def write_csv(results: list[dict], path: Path | None) -> None:
    rows = [csv_row(r) for r in results]
    with open(path, "w", newline="", encoding="utf-8") if path else contextlib.nullcontext(sys.stdout) as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--small", action="store_true", help="tiny models (a smoke run)")
    parser.add_argument("--device", default="cpu", help="where the state lives (cpu, cuda)")
    parser.add_argument("--dir", default=None, help="where to write (default: the system's temporary folder)")
    parser.add_argument("--csv", type=Path, help="write the table here (default: standard output)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}; state on {args.device}; sizes: {'the demo' if args.small else 'paper'}\n",
        file=sys.stderr,
    )
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results = [bench_task(task, args.small, args.reps, Path(tmp), args.device) for task in args.tasks]
    write_csv(results, args.csv)


if __name__ == "__main__":
    main()
