"""Seeding of every random stream, and capture/restore of their states for checkpoints."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, device: torch.device | None = None) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if device is not None and device.type == "cuda":
        # Deterministic kernels where they exist; warn (not fail) where a GPU op has none. Only on
        # CUDA: the CPU kernels we use are deterministic for a fixed thread count, and the switch
        # imports torch._dynamo/_inductor, which costs ~3 s per job on a CPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)


def client_generator(seed: int, client_index: int) -> torch.Generator:
    """An independent stream per client (data order, augmentation), identical across methods, so
    two methods with the same seed see the same batches: the basis of the equivalence tests."""
    child = np.random.SeedSequence([seed, client_index]).generate_state(1)[0]
    generator = torch.Generator()
    generator.manual_seed(int(child))
    return generator


def global_rng_state() -> dict:
    # numpy's state holds an ndarray; store it as a tensor so checkpoints load with weights_only=True.
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    numpy_state = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)
    state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_global_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
