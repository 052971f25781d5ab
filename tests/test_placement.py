"""GPU placement of concurrent training jobs, with a simulated device list (no GPU needed)."""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from fedmedbench.errors import ConfigError
from fedmedbench.fl import placement

SRC = Path(__file__).resolve().parents[1] / "src"


def test_two_gpus_two_jobs_each_spread_and_capped(tmp_path):
    devices = ["gpu-aaa", "gpu-bbb"]
    claims = [placement.try_claim(devices, 2, tmp_path) for _ in range(4)]
    assert all(c is not None for c in claims)
    # The first two jobs go to different GPUs; in all, two per GPU.
    assert {claims[0].device_index, claims[1].device_index} == {0, 1}
    assert Counter(c.device_id for c in claims) == {"gpu-aaa": 2, "gpu-bbb": 2}
    assert placement.try_claim(devices, 2, tmp_path) is None  # never a third job on one GPU
    claims[2].release()
    again = placement.try_claim(devices, 2, tmp_path)
    assert again is not None and again.device_id == claims[2].device_id


def test_a_killed_job_frees_its_slot(tmp_path):
    """A slot is an flock: the kernel drops it when the holder dies, SIGKILL included."""
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[2]);"
        "from pathlib import Path; from fedmedbench.fl import placement;"
        "c = placement.try_claim(['gpu-x'], 1, Path(sys.argv[1])); print(c.slot, flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(SRC)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "0"
        assert placement.try_claim(["gpu-x"], 1, tmp_path) is None
    finally:
        holder.kill()
        holder.wait()
    assert placement.try_claim(["gpu-x"], 1, tmp_path) is not None


def test_jobs_per_gpu_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(placement.JOBS_PER_GPU_ENV, "3")
    assert placement.jobs_per_gpu() == 3
    monkeypatch.delenv(placement.JOBS_PER_GPU_ENV)
    assert placement.jobs_per_gpu() == 1
    assert os.environ.get(placement.JOBS_PER_GPU_ENV) is None
    monkeypatch.setenv(placement.JOBS_PER_GPU_ENV, "two")
    with pytest.raises(ConfigError, match="FEDMEDBENCH_JOBS_PER_GPU='two'"):
        placement.jobs_per_gpu()
