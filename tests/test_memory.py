"""A training job's private memory does not grow with the store it reads: the store is memory-mapped
(file-backed pages, shared through the page cache), never copied into the job. Grown 2x and 4x, the
job's peak private (anonymous) memory stays flat while its file-backed resident memory grows with the
store, which shows that the store was read, through the mapping."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedmedbench.data.store import write_split_csv
from fedmedbench.memory import memory_now
from tests.conftest import tiny_run_config

SRC = Path(__file__).resolve().parents[1] / "src"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps_rollup")

# Many bytes per sample for little compute: 96 px with 12 channels (110 KB a sample) into a tiny DenseNet.
SIZE, CHANNELS, CLIENTS = 96, 12, ("A", "B")
MODEL = {
    "name": "densenet",
    "in_channels": CHANNELS,
    "growth_rate": 2,
    "block_config": [1, 1, 1, 1],
    "num_init_features": 4,
    "num_classes": 2,
}


def write_store(root: Path, per_client: int) -> tuple[Path, Path, int]:
    """A store written in chunks straight into file-backed arrays, so that writing it leaves no
    freed heap in this process for the measured run to reuse unseen. Returns (store, split, bytes)."""
    rng, rows, total = np.random.default_rng(per_client), [], 0
    for name in CLIENTS:
        folder = root / "store" / name
        folder.mkdir(parents=True)
        images = np.lib.format.open_memmap(folder / "images.npy", "w+", np.uint8, (per_client, SIZE, SIZE, CHANNELS))
        for start in range(0, per_client, 16):
            images[start : start + 16] = rng.integers(0, 256, images[start : start + 16].shape, dtype=np.uint8)
        images.flush()
        total += images.nbytes
        del images
        np.save(folder / "labels.npy", np.arange(per_client, dtype=np.int64) % 2)
        ids = [f"{name}/{i}" for i in range(per_client)]
        pd.DataFrame({"id": ids, "group": ids, "source": "synthetic"}).to_csv(folder / "meta.csv", index=False)
        parts = ["train"] * (per_client * 3 // 5) + ["val"] * (per_client // 5)
        parts += ["test"] * (per_client - len(parts))
        rows += [{"client": name, "split": s, "row": i, "id": ids[i], "group": ids[i]} for i, s in enumerate(parts)]
    write_split_csv(pd.DataFrame(rows), root / "split.csv")
    return root / "store", root / "split.csv", total


# The measured runs go to a child process whose C allocator returns every large block to the system
# when it is freed (a fixed mmap threshold): its anonymous memory is then what is live, not what
# glibc kept from earlier runs, and a flat line means flat.
CHILD = """
import json, sys, torch
from pathlib import Path
from fedmedbench.fl.engine import run_training
from fedmedbench.memory import PeakMemory
torch.set_num_threads(1)
peaks = []
for cfg, out in json.loads(sys.argv[1]):
    with PeakMemory(interval=0.02) as memory:
        run_training(cfg, Path(out), device="cpu", threads=1, progress=False)
    peaks.append(memory.peak)
print(json.dumps(peaks))
"""


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_private_memory_stays_flat_as_the_store_grows_2x_and_4x(tmp_path):
    assert memory_now()["private_anon"] > 0 and memory_now()["file_resident"] > 0
    stores = {k: write_store(tmp_path / f"x{k}", 150 * k) for k in (1, 2, 4)}
    runs = [(1, "warm-up")] + [(k, f"run{k}") for k in (1, 2, 4)]  # the first run allocates kernels and pools
    configs = [
        (
            tiny_run_config(
                *stores[k][:2],
                "fedavg",
                clients=CLIENTS,
                kind="classification",
                model=MODEL,
                loss="ce",
                batch_size=4,
                augment="none",
                selection_metric="accuracy",
                rounds=1,
                qualitative_samples=0,
            ),
            str(tmp_path / name),
        )
        for k, name in runs
    ]
    env = {**os.environ, "PYTHONPATH": str(SRC), "MALLOC_MMAP_THRESHOLD_": "131072"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(configs)], capture_output=True, text=True, env=env, timeout=600
    )
    assert child.returncode == 0, child.stderr[-3000:]
    measured = dict(zip([1, 2, 4], json.loads(child.stdout)[1:]))
    for k in (2, 4):
        store_growth = stores[k][2] - stores[1][2]  # 33 and 100 MB more images
        anon = measured[k]["private_anon"] - measured[1]["private_anon"]
        # Flat, up to what the sampler may catch of one batch's transient copies (small batches: ~4 MB);
        # a copy of one client's images (half the store) would add half of its growth.
        assert anon < 0.2 * store_growth, (k, anon, store_growth)
    # ... while the store was read, page by page, through the mapping.
    assert measured[4]["file_resident"] - measured[1]["file_resident"] > 0.5 * (stores[4][2] - stores[1][2])
