"""Which GPU a training job runs on, when several jobs share a machine.

Snakemake only counts: ``--resources gpu=S`` lets at most S training jobs (``gpu=1`` each) run at
once, but every job would pick ``cuda`` = device 0. Here each job, at start, claims one of
``jobs_per_gpu`` slots of the least-loaded visible GPU and keeps it until it exits. A slot is an
exclusive ``flock`` on a small file named after the GPU's UUID, so

- the claim is released by the kernel whenever the process ends, SIGKILL and OOM included;
- jobs that see the same GPU under different indices (``CUDA_VISIBLE_DEVICES``, SLURM) agree on it;
- never more than ``jobs_per_gpu`` jobs use one GPU; a job that finds every slot taken waits.

On a box with G GPUs and k jobs per GPU: ``--resources gpu=G*k`` and ``FEDMEDBENCH_JOBS_PER_GPU=k``
(an environment variable, so changing it re-runs nothing). Under SLURM each job gets its own GPU(s)
from the scheduler and claims a slot there the same way.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fedmedbench.errors import ConfigError
from fedmedbench.files import try_flock as _try_lock

JOBS_PER_GPU_ENV = "FEDMEDBENCH_JOBS_PER_GPU"
LOCK_DIR_ENV = "FEDMEDBENCH_GPU_LOCK_DIR"

log = logging.getLogger("fedmedbench.placement")


@dataclass
class Claim:
    device_index: int  # index among the visible devices (cuda:<index>)
    device_id: str
    slot: int
    handle: object  # the open lock file; closing it (or exiting) frees the slot

    def release(self) -> None:
        self.handle.close()


def jobs_per_gpu() -> int:
    value = os.environ.get(JOBS_PER_GPU_ENV, "1")
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{JOBS_PER_GPU_ENV}={value!r}: expected a positive integer")
    return int(value)


def lock_dir() -> Path:
    default = Path("/tmp") / f"fedmedbench-gpu-slots-{os.getuid()}"
    return Path(os.environ.get(LOCK_DIR_ENV, default))


def free_slots(device_id: str, per_gpu: int, directory: Path) -> list[int]:
    """Slots of ``device_id`` nobody holds now (probed by locking and unlocking each)."""
    free = []
    for slot in range(per_gpu):
        handle = _try_lock(directory / f"{device_id}.slot{slot}.lock")
        if handle is not None:
            handle.close()
            free.append(slot)
    return free


def try_claim(device_ids: list[str], per_gpu: int, directory: Path) -> Claim | None:
    """One free slot on the device with the most free slots (ties: the lowest index), or None."""
    directory.mkdir(parents=True, exist_ok=True)
    load = [(len(free_slots(d, per_gpu, directory)), -i) for i, d in enumerate(device_ids)]
    for _, neg_index in sorted(load, reverse=True):
        index = -neg_index
        for slot in range(per_gpu):  # another job may take a slot between the probe and here
            handle = _try_lock(directory / f"{device_ids[index]}.slot{slot}.lock")
            if handle is not None:
                return Claim(index, device_ids[index], slot, handle)
    return None


def claim(device_ids: list[str], per_gpu: int, directory: Path, poll_seconds: float = 5.0) -> Claim:
    """Wait until a slot is free, then hold it."""
    waited = False
    while True:
        result = try_claim(device_ids, per_gpu, directory)
        if result is not None:
            return result
        if not waited:
            log.info("all %d GPU slot(s) are busy (%d per GPU); waiting for one", len(device_ids) * per_gpu, per_gpu)
            waited = True
        time.sleep(poll_seconds)


def visible_gpu_ids() -> list[str]:
    """A stable identity per visible CUDA device: its UUID (index-independent)."""
    ids = []
    for index in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        ids.append(f"gpu-{uuid}" if uuid is not None else f"gpu-index{index}")
    return ids


def pick_device(name: str = "auto"):
    """(torch device, claim or None) for a job: ``auto`` claims a GPU slot for the life of the job,
    else the CPU; an explicit device (``cuda:1``, ``cpu``) is used as given, without a claim. The
    engine and Flower's simulation route (federation/simulation.py) both choose their device here."""
    if name == "auto" and torch.cuda.is_available():
        slot = claim(visible_gpu_ids(), jobs_per_gpu(), lock_dir())
        log.info("placed on cuda:%d (%s, slot %d)", slot.device_index, slot.device_id, slot.slot)
        return torch.device(f"cuda:{slot.device_index}"), slot
    return torch.device("cpu" if name == "auto" else name), None
