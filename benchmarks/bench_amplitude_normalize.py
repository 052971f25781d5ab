"""Benchmark: batched ``amplitude_normalize`` (torch.fft) vs a per-image numpy loop (the official code's structure).

The reference loop mirrors HarmoFL's ``utils/amp_utils.pyx`` ``process``: move the batch to the host,
per image ``np.fft.fft2`` -> amplitude (for the batch mean) and again ``fft2`` -> amplitude/phase ->
swap -> ``ifft2`` -> real part, then back to a tensor. It is written here in plain numpy with the
full-spectrum swap (the paper's ``mode="full"``). Both paths get the same work: the batch mean
amplitude (Eq. 3) plus the normalization (Eq. 4).

    .venv/bin/python benchmarks/bench_amplitude_normalize.py [--device cpu|cuda] [--repeats 5]

Not part of pytest. Prints one table row per shape and mode, with the ratio numpy-time / torch-time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from fedmedbench.ops.fourier import amplitude_normalize, batch_mean_amplitude

SHAPES = [(16, 3, 384, 384), (128, 3, 96, 96)]


def numpy_loop(x: torch.Tensor, running: np.ndarray | None) -> torch.Tensor:
    device = x.device
    batch = x.detach().cpu().numpy()
    amp_mean = np.mean([np.abs(np.fft.fft2(image, axes=(-2, -1))) for image in batch], axis=0)
    target = amp_mean if running is None else 0.9 * running + 0.1 * amp_mean
    out = np.empty_like(batch)
    for i, image in enumerate(batch):
        spectrum = np.fft.fft2(image, axes=(-2, -1))
        out[i] = np.real(np.fft.ifft2(target * np.exp(1j * np.angle(spectrum)), axes=(-2, -1)))
    return torch.from_numpy(out).to(device)


def torch_batched(x: torch.Tensor, mode: str) -> torch.Tensor:
    return amplitude_normalize(x, batch_mean_amplitude(x, mode), mode)


def timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (plans, allocations)
    if device.type == "cuda":
        torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    print(
        f"device={device} torch={torch.__version__} threads={torch.get_num_threads()} repeats={args.repeats} (best of)"
    )
    print(
        f"{'batch shape':<18} {'numpy loop (s)':>15} {'torch full (s)':>15} {'ratio':>8} {'torch dc (s)':>13} {'ratio':>8}  max|diff| full"
    )
    for shape in SHAPES:
        x = torch.rand(shape, generator=generator).to(device)
        reference = numpy_loop(x, None)
        diff = (torch_batched(x, "full") - reference).abs().max().item()
        t_np = timed(lambda x=x: numpy_loop(x, None), device, args.repeats)
        t_full = timed(lambda x=x: torch_batched(x, "full"), device, args.repeats)
        t_dc = timed(lambda x=x: torch_batched(x, "dc"), device, args.repeats)
        label = "x".join(map(str, shape))
        print(
            f"{label:<18} {t_np:>15.4f} {t_full:>15.4f} {t_np / t_full:>7.1f}x {t_dc:>13.5f} {t_np / t_dc:>7.0f}x  {diff:.1e}"
        )


if __name__ == "__main__":
    main()
