"""How fast the data reader feeds a device: samples/s of the host side of a GPU job's batches, per
number of reader threads (``--data-workers``), at the papers' image and batch sizes.

For each task a synthetic store (one client, random uint8 images at the task's size) is written to
a temporary folder and read in shuffled batches as a training epoch reads them:
- ``cpu path (today)``: what a CPU job does per batch: gather + convert to float on the CPU;
- ``workers 0``: what a GPU job's host does per batch without reader threads: the gather only
  (conversion and augmentation run on the GPU);
- ``workers k``: the same batches gathered by ``fl.data.BatchReader(k)``, in order.
Each is timed with the store in the page cache (``warm``) and, with ``--cold``, after dropping the
store's pages (``posix_fadvise(DONTNEED)``, so the reads go to the disk).

A GPU consumes what it computes: ``--gpu-rate`` (samples/s, e.g. batch / step time from
``benchmarks/bench_engine.py`` on that GPU) prints how many reader threads keep it busy; without it,
a bound from the model's FLOPs per sample is printed (see docs/cost.md).

    python benchmarks/bench_reader.py [--tasks camelyon17 prostate] [--workers 0 1 2 4] [--cold]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedmedbench.data.store import open_client, write_client  # noqa: E402
from fedmedbench.fl.data import BatchReader, SplitData, gather, to_float  # noqa: E402

# name: (image size, channels, segmentation, train batch, eval batch, model) -- config.yaml's paper settings
UNET32 = {"name": "unet", "init_features": 32, "in_channels": 3, "num_classes": 2}
TASKS = {
    "camelyon17": (96, 3, False, 128, 128, {"name": "densenet", "num_classes": 2}),
    "prostate": (384, 3, True, 16, 16, UNET32),
    "nuclei": (256, 3, True, 8, 8, UNET32),
    "skin": (128, 3, False, 16, 64, {"name": "vgg16_bn", "in_channels": 3, "num_classes": 3}),
    "fundus": (384, 3, True, 8, 8, {**UNET32, "num_classes": 3}),
}
# An H100 SXM's dense TF32 tensor-core peak (PyTorch runs fp32 convolutions in TF32 by default):
# a GPU can never consume samples faster than this bound; real training reaches a fraction of it.
H100_TF32_FLOPS = 494.7e12


def write_store(root: Path, task: str, samples: int) -> Path:
    size, channels, segmentation, *_ = TASKS[task]
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (samples, size, size, channels), dtype=np.uint8)
    labels = (
        rng.integers(0, 2, (samples, size, size), dtype=np.uint8)
        if segmentation
        else rng.integers(0, 2, samples).astype(np.int64)
    )
    meta = pd.DataFrame(
        {"id": [f"s{i}" for i in range(samples)], "group": [f"g{i}" for i in range(samples)], "source": "bench"}
    )
    write_client(root, "c0", images, labels, meta)
    for name in ("images.npy", "labels.npy"):  # written back, so that dropping the pages really drops them
        with open(root / "c0" / name, "rb+") as handle:
            os.fsync(handle.fileno())
    return root


def open_split(store: Path, cache: str) -> SplitData:
    """The store's one client as a split in shuffled row order, its pages in the page cache
    (``warm``) or dropped from it (``cold``; only unmapped pages can be dropped, so before opening)."""
    for name in ("images.npy", "labels.npy"):
        fd = os.open(store / "c0" / name, os.O_RDONLY)
        try:
            if cache == "cold":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            else:
                while os.read(fd, 1 << 24):  # reads every page into the cache
                    pass
        finally:
            os.close(fd)
    arrays = open_client(store, "c0")
    return SplitData(
        arrays.images, arrays.labels, np.random.default_rng(0).permutation(len(arrays)), np.array(["g"] * len(arrays))
    )


def epoch_chunks(split: SplitData, batch: int, seed: int) -> list[np.ndarray]:
    order = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed)).numpy()
    return [order[i : i + batch] for i in range(0, len(order), batch)]


def samples_per_second(split: SplitData, batch: int, mode: str | int, seed: int) -> float:
    chunks = epoch_chunks(split, batch, seed)
    started = time.perf_counter()
    if mode == "cpu":
        for chunk in chunks:
            x, _ = gather(split, chunk)
            to_float(x, 1 / 255)
    elif mode == 0:
        for chunk in chunks:
            gather(split, chunk)
    else:
        reader = BatchReader(mode)
        for _ in reader.read(split, chunks):
            pass
        reader.close()
    return len(split) / (time.perf_counter() - started)


def forward_flops_per_sample(task: str) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    from fedmedbench.models import build_model

    size, channels, *_, model_cfg = TASKS[task]
    model = build_model(model_cfg).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, channels, size, size))
    return float(counter.get_total_flops())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["camelyon17", "prostate"], choices=list(TASKS))
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--megabytes", type=float, default=256, help="size of each synthetic store (default 256 MB)")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many epochs per row")
    parser.add_argument(
        "--cold", action="store_true", help="also time reads with the store's pages dropped from the cache"
    )
    parser.add_argument(
        "--gpu",
        nargs="*",
        default=[],
        metavar="TASK=SAMPLES_PER_S",
        help="a GPU's measured training rate per task: prints the reader threads it needs",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the cpu-path conversion)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gpu_rates = {k: float(v) for k, v in (item.split("=", 1) for item in args.gpu)}
    print(
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}; best of {args.repeat} epochs\n"
    )
    print(
        "| task (image, batch) | MB/sample | cache | cpu path (today) | "
        + " | ".join(f"workers {w}" for w in args.workers)
        + " | per worker (best k >= 1) |"
    )
    print("|---|---:|---|---:|" + "---:|" * len(args.workers) + "---:|")
    per_worker = {}
    for task in args.tasks:
        size, channels, segmentation, batch, *_ = TASKS[task]
        sample_bytes = size * size * channels + (size * size if segmentation else 8)
        samples = max(4 * batch, int(args.megabytes * 1e6 / sample_bytes))
        with tempfile.TemporaryDirectory(prefix="fedmedbench-bench-reader-") as tmp:
            store = write_store(Path(tmp), task, samples)
            for cache in ["warm", "cold"] if args.cold else ["warm"]:
                rates = {}
                for mode in ["cpu", *args.workers]:
                    best = 0.0
                    for r in range(args.repeat):
                        split = open_split(store, cache)
                        best = max(best, samples_per_second(split, batch, mode, seed=r))
                        del split  # unmapped, so that the next cold read finds its pages dropped
                    rates[mode] = best
                threaded = {w: rates[w] / w for w in args.workers if w >= 1}
                best_per_worker = max(threaded.values()) if threaded else float("nan")
                per_worker[(task, cache)] = best_per_worker
                cells = " | ".join(f"{rates[w]:,.0f}" for w in args.workers)
                print(
                    f"| {task} ({size} px, {batch}) | {sample_bytes / 1e6:.3f} | {cache} | {rates['cpu']:,.0f} | {cells} | {best_per_worker:,.0f} |"
                )
    print("\nReader threads a GPU needs = its samples/s / the per-worker rate above (warm cache):\n")
    print(
        "| task | forward GFLOP/sample | bound at the H100's TF32 peak: training / evaluation samples/s | threads for the bound (training / evaluation) | measured GPU rate | threads for it |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for task in args.tasks:
        flops = forward_flops_per_sample(task)
        train_bound, eval_bound = (
            H100_TF32_FLOPS / (3 * flops),
            H100_TF32_FLOPS / flops,
        )  # forward + backward ~ 3 forwards
        rate = per_worker[(task, "warm")]
        measured = gpu_rates.get(task)
        need = f"{math.ceil(measured / rate)}" if measured else "-"
        print(
            f"| {task} | {flops / 1e9:.2f} | {train_bound:,.0f} / {eval_bound:,.0f} | {math.ceil(train_bound / rate)} / {math.ceil(eval_bound / rate)} | {measured or '-'} | {need} |"
        )


if __name__ == "__main__":
    main()
