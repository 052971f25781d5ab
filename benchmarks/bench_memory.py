"""Memory of a Camelyon17 training job as its store grows: private (anonymous) vs file-backed resident.

Synthetic Camelyon17-shaped stores (5 hospitals in the real release's proportions, 96 x 96 x 3
patches, the 64/16/20 split of data/camelyon17/splits.py, training truncated to the smallest hospital as HarmoFL does) of
2k, 8k and 32k patches; one round of FedAvg on each, in a child process whose C allocator returns
large freed blocks to the system (so its anonymous memory is what is live). Per size it prints the
job's peak private memory and its peak file-backed resident memory (the memory-mapped store plus the
libraries), and extrapolates the store part to the real 455,954 patches.

    python benchmarks/bench_memory.py                   # tiny DenseNet: the data path only, ~1 min
    python benchmarks/bench_memory.py --paper-model     # DenseNet-121, batch 128 (slow on a CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedmedbench.data.store import write_split_csv  # noqa: E402

REAL = {"hospital1": 59436, "hospital2": 34904, "hospital3": 85054, "hospital4": 129838, "hospital5": 146722}
PATCH_BYTES = 96 * 96 * 3 + 8  # image + int64 label
TINY = {"name": "densenet", "growth_rate": 4, "block_config": [1, 1, 1, 1], "num_init_features": 8, "num_classes": 2}
PAPER = {
    "name": "densenet",
    "growth_rate": 32,
    "block_config": [6, 12, 24, 16],
    "num_init_features": 64,
    "num_classes": 2,
}
CHILD = """
import json, sys, torch
from pathlib import Path
from fedmedbench.fl.engine import run_training
from fedmedbench.memory import PeakMemory, memory_now
torch.set_num_threads(int(sys.argv[2]))
out = []
for cfg, folder in json.loads(sys.argv[1]):
    with PeakMemory(interval=0.02) as memory:
        run_training(cfg, Path(folder), device="cpu", threads=int(sys.argv[2]), progress=False)
    out.append(memory.peak)
print(json.dumps(out))
"""


def cut(n: int) -> tuple[int, int, int]:
    """Train, val and test sizes of a hospital of n patches (data/camelyon17/splits.py: test 20 %,
    val 20 % of the rest)."""
    n_test = int(n * 0.2)
    n_val = int((n - n_test) * 0.2)
    return n - n_test - n_val, n_val, n_test


def rows_read(sizes: list[int]) -> dict[str, int]:
    """Rows one round reads: every hospital's train split truncated to the smallest, all val and test."""
    parts = [cut(n) for n in sizes]
    return {
        "train": min(p[0] for p in parts) * len(sizes),
        "val": sum(p[1] for p in parts),
        "test": sum(p[2] for p in parts),
    }


def write_store(root: Path, patches: int) -> tuple[Path, Path, dict]:
    """The twin, written in chunks into file-backed arrays; returns (store, split, rows per split)."""
    rng, rows, total = np.random.default_rng(0), [], sum(REAL.values())
    sizes = {name: max(10, round(patches * count / total)) for name, count in REAL.items()}
    for name, n in sizes.items():
        folder = root / "store" / name
        folder.mkdir(parents=True)
        images = np.lib.format.open_memmap(folder / "images.npy", "w+", np.uint8, (n, 96, 96, 3))
        for start in range(0, n, 1024):
            images[start : start + 1024] = rng.integers(0, 256, images[start : start + 1024].shape, dtype=np.uint8)
        images.flush()
        del images
        np.save(folder / "labels.npy", np.arange(n, dtype=np.int64) % 2)
        ids = [f"{name}/patch{i}" for i in range(n)]
        groups = [f"{name}/slide{i % 10}" for i in range(n)]
        pd.DataFrame({"id": ids, "group": groups, "source": "bench"}).to_csv(folder / "meta.csv", index=False)
        order = rng.permutation(n)
        n_train, n_val, n_test = cut(n)
        parts = np.array(["train"] * n_train + ["val"] * n_val + ["test"] * n_test)
        rows += [
            {"client": name, "split": s, "row": int(r), "id": ids[r], "group": groups[r]} for r, s in zip(order, parts)
        ]
    used = rows_read(list(sizes.values()))
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv", {**used, "patches": sum(sizes.values())}


def run_config(store: Path, split: Path, model: dict, batch: int) -> dict:
    return {
        "task": "camelyon17", "method": "fedavg", "run": "fedavg", "seed": 0, "kind": "classification",
        "clients": list(REAL), "data": {"store": str(store), "split": str(split)}, "model": model, "loss": "ce",
        "optimizer": {"name": "sgd", "lr": 1e-3, "momentum": 0.9, "weight_decay": 1e-4}, "rounds": 1, "local_epochs": 1,
        "batch_size": batch, "augment": "none", "intensity_scale": 1 / 255, "truncate_to_smallest": True,
        "selection_metric": "accuracy", "qualitative_samples": 0, "curve_every": 1,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patches", type=int, nargs="+", default=[2000, 8000, 32000])
    parser.add_argument(
        "--paper-model", action="store_true", help="DenseNet-121 at batch 128 instead of a tiny DenseNet"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="skip the unmeasured first run (its peaks then include first-run allocations)",
    )
    args = parser.parse_args()
    model, batch = (PAPER, 128) if args.paper_model else (TINY, 128)
    with tempfile.TemporaryDirectory(prefix="fedmedbench-bench-memory-") as tmp:
        stores = {n: write_store(Path(tmp) / f"p{n}", n) for n in args.patches}
        first = args.patches[0]
        configs = (
            [] if args.no_warm_up else [(run_config(*stores[first][:2], model, batch), str(Path(tmp) / "warm-up"))]
        )
        configs += [(run_config(*stores[n][:2], model, batch), str(Path(tmp) / f"run{n}")) for n in args.patches]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MALLOC_MMAP_THRESHOLD_": "131072"}
        child = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(configs), str(args.threads)],
            capture_output=True,
            text=True,
            env=env,
        )
        if child.returncode:
            raise SystemExit(child.stderr[-3000:])
        peaks = json.loads(child.stdout)[0 if args.no_warm_up else 1 :]
    print(
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; model: {'DenseNet-121' if args.paper_model else 'tiny DenseNet'}, batch {batch}\n"
    )
    print(
        "| patches | store MB | rows read per round (train + val + test) | peak private MB | peak file-backed resident MB | file-backed above the smallest run, per row read (bytes) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    base_rows = None
    for n, peak in zip(args.patches, peaks):
        used = stores[n][2]
        read = used["train"] + used["val"] + used["test"]
        if base_rows is None:
            base_rows, base_file = read, peak["file_resident"]
            per_row = "-"
        else:
            per_row = f"{(peak['file_resident'] - base_file) / (read - base_rows):,.0f}"
        print(
            f"| {used['patches']:,} | {used['patches'] * PATCH_BYTES / 1e6:,.0f} | {read:,} | {peak['private_anon'] / 1e6:,.0f} | {peak['file_resident'] / 1e6:,.0f} | {per_row} |"
        )
    real = rows_read(list(REAL.values()))
    real_read = sum(real.values())
    print(
        f"\nThe real release: {sum(REAL.values()):,} patches, {sum(REAL.values()) * PATCH_BYTES / 1e9:.1f} GB of store; one round reads "
        f"{real_read:,} rows ({real['train']:,} train + {real['val']:,} val + {real['test']:,} test) = {real_read * PATCH_BYTES / 1e9:.1f} GB "
        "of patches through the mapping (more is resident: a page fault maps the pages around it too)."
    )


if __name__ == "__main__":
    main()
