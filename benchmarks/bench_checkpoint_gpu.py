"""The checkpoint writer's device path on a real GPU (fl/state.py: states in GPU memory are compared
on the device and copied to the host in pieces): the file it writes must be byte for byte the one
the host path writes for the same state moved to the CPU, and load back equal. Also its time beside
the host path's and a raw write of as many bytes. Needs CUDA; the CPU tests force the same code path
on CPU tensors (tests/test_checkpoint_dedup.py).

    python benchmarks/bench_checkpoint_gpu.py                 # DenseNet121 (Camelyon17), 5 clients
    python benchmarks/bench_checkpoint_gpu.py --model unet    # UNet32 (prostate), 6 clients
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bench_checkpoint import raw_write  # noqa: E402  (the CPU benchmark's floor: write, fsync, rename, .prev)
from fedmedbench.fl import state  # noqa: E402
from fedmedbench.models import build_model  # noqa: E402

MODELS = {
    "densenet": ({"name": "densenet", "num_classes": 2}, 5),
    "unet": ({"name": "unet", "init_features": 32, "in_channels": 3, "num_classes": 2}, 6),
}


def engine_like_state(model: torch.nn.Module, clients: int) -> dict:
    """The global model, each client's copy of it after the broadcast (equal bytes, own storage), one
    client that trained a step (different bytes), and each client's Adam state as torch keeps it
    (the step count a CPU tensor between two GPU moments: host and device storages interleaved), the
    host RNG state and a large host tensor: what a FedAvg checkpoint of a GPU job holds."""
    glob = {k: v.detach().clone() for k, v in model.state_dict().items()}
    copies = [{k: v.clone() for k, v in glob.items()} for _ in range(clients)]
    for v in copies[0].values():
        if v.is_floating_point():
            v.add_(1e-3)
    adam = [{i: {"step": torch.tensor(3.0), "exp_avg": p.detach().clone() * 0.1, "exp_avg_sq": p.detach().clone() ** 2} for i, p in enumerate(model.parameters())} for _ in range(clients)]
    host = {"rng": torch.get_rng_state(), "curve": torch.arange(100_000, dtype=torch.float32)}
    return {"global": glob, "clients": copies, "optimizers": adam, "host": host, "round": 3}


def same_tree(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b))
    return a == b


def timed_raw_write(path: Path, data: bytes) -> float:
    started = time.perf_counter()
    raw_write(memoryview(data), path)
    return time.perf_counter() - started


def timed_save(obj, path: Path) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    state.save_checkpoint(obj, path)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(MODELS), default="densenet")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_checkpoint_gpu.py: no CUDA device here (the CPU tests cover this path's logic)")
    spec, clients = MODELS[args.model]
    gpu_state = engine_like_state(build_model(spec).cuda(), clients)
    host_state = state.to_device(gpu_state, torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        gpu_file, host_file, raw_file = tmp / "gpu.pt", tmp / "host.pt", tmp / "raw.bin"
        times = {"gpu": [], "host": [], "raw": []}
        for _ in range(args.reps):  # interleaved; each write replaces the one before (kept as .prev)
            times["gpu"].append(timed_save(gpu_state, gpu_file))
            times["host"].append(timed_save(host_state, host_file))
            times["raw"].append(timed_raw_write(raw_file, bytes(gpu_file.stat().st_size)))
        same = gpu_file.read_bytes() == host_file.read_bytes()
        back = state.load_checkpoint(gpu_file)
        equal = same_tree(back, host_state)
        size = gpu_file.stat().st_size
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; {args.model}, {clients} clients + global; file {size / 1e6:.1f} MB")
    print(f"device path file == host path file: {same}; loads back equal: {equal}")
    print("| write | median s | × raw |")
    print("|---|---:|---:|")
    for k in ("gpu", "host", "raw"):
        print(f"| {k} | {med[k]:.3f} | {med[k] / med['raw']:.2f} |")
    if not (same and equal):
        sys.exit(1)


if __name__ == "__main__":
    main()
