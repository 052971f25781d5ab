"""Fed-LWR's per-round CKA cost: ours (one pass, HSIC terms accumulated in forward hooks) vs the
official structure (5 passes over the validation data; per pass and minibatch both models run with
hooks that keep every layer's flattened activations, then the HSIC of every layer pair is formed;
nothing is kept between rounds).

Run: ``.venv/bin/python benchmarks/bench_cka.py [--size 384] [--samples 10] [--features 32]``
Prints seconds per client (one local model vs the anchor) for both, and the speed-up.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from fedmedbench.models.unet import UNet
from fedmedbench.ops.cka import HOOKED_TYPES, _hsic_official, cka_batches, hooked_layers, layerwise_similarity


def official_structure(model_a, model_b, data, batch_size: int, passes: int = 5) -> dict[str, float]:
    """The official CKACalculator: ``num_epochs=5`` passes; each minibatch: forward both models with
    hooks that store flattened float32 outputs of every hooked module, then for every layer the
    uncentred Grams and the three ε-scaled HSIC terms (only the diagonal pairs are used)."""
    eps = 1e-4
    layers = hooked_layers(model_a)
    sums = {name: torch.zeros(3) for name in layers}
    for _ in range(passes):
        for idx in cka_batches(len(data), batch_size):
            x = data[idx.start : idx.stop]
            feats = [{}, {}]
            handles = []
            for store, model in zip(feats, (model_a, model_b)):
                modules = dict(model.named_modules())
                for name in layers:
                    handles.append(
                        modules[name].register_forward_hook(
                            lambda m, i, o, name=name, store=store: store.__setitem__(name, o.flatten(1))
                        )
                    )
            with torch.no_grad():
                model_a(x)
                model_b(x)
            for h in handles:
                h.remove()
            for name in layers:
                a, b = feats[0][name], feats[1][name]
                K, L = a @ a.T, b @ b.T
                sums[name] += torch.stack([_hsic_official(K, L), _hsic_official(K, K), _hsic_official(L, L)]) * eps
    return {n: float(s[0] / torch.sqrt(torch.clamp(s[1] * s[2], min=eps) + eps)) for n, s in sums.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--samples", type=int, default=10, help="validation images (RIF Site1: 10)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--features", type=int, default=32, help="UNet init_features (paper: 32)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    anchor = UNet(3, 2, args.features).to(device).eval()
    local = copy.deepcopy(anchor)
    with torch.no_grad():
        for p in local.parameters():
            p.add_(0.05 * torch.randn_like(p))
    data = torch.rand(args.samples, 3, args.size, args.size, device=device)
    assert all(isinstance(m, HOOKED_TYPES) for n, m in anchor.named_modules() if n in hooked_layers(anchor))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def ours():
        batches = (data[r.start : r.stop] for r in cka_batches(len(data), args.batch_size))
        return layerwise_similarity(anchor, local, batches, "cka")[0]

    timings = {}
    for name, fn in (
        ("ours (1 pass, centred Grams in hooks)", ours),
        (
            "official structure (5 passes, activations kept)",
            lambda: official_structure(anchor, local, data, args.batch_size),
        ),
    ):
        fn()  # warm-up
        sync()
        start = time.perf_counter()
        result = fn()
        sync()
        timings[name] = time.perf_counter() - start
        bad = sum(1 for v in result.values() if not (0.0 <= v <= 1.0))
        print(f"{name}: {timings[name]:.2f} s per client, {len(result)} layers, {bad} outside [0, 1]")
    ours_t, official_t = timings.values()
    print(
        f"speed-up: {official_t / ours_t:.1f}x  (size {args.size}, {args.samples} images, batch {args.batch_size}, UNet f={args.features}, {args.threads} threads, {device})"
    )


if __name__ == "__main__":
    main()
