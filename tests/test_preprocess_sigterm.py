"""SIGTERM during preprocessing (Snakemake stopping its jobs, `kill`, SLURM before its SIGKILL)
removes the step's temporary folder on the way out, instead of leaving it until the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fedmedbench.data import fundus as F
from fedmedbench.data.archive import safe_extract

SRC = Path(__file__).resolve().parents[1] / "src"

# The real command line, paused where a store client folder is half written (images saved, labels
# not yet): the marker file says it got there; the test then sends SIGTERM from outside.
PAUSED_PREPROCESS = """
import sys, time
from fedmedbench import cli, faults

def pause(point):
    if point == "store_write":
        open(sys.argv[1], "w").close()
        time.sleep(120)

faults.reached = pause
sys.exit(cli.main(sys.argv[2:]))
"""


def test_sigterm_during_preprocessing_leaves_no_temporary_folder(tmp_path):
    [archive] = [spec.filename for spec in F.DOWNLOADS]
    F.write_synthetic(tmp_path / "zip", seed=0, train_per_domain=2, test_per_domain=1, size=16)
    raw = safe_extract(tmp_path / "zip" / archive, tmp_path / "raw")
    out, marker = tmp_path / "run", tmp_path / "half-written"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDMEDBENCH_JOBSERVER")}
    env["PYTHONPATH"] = str(SRC)
    cmd = [
        sys.executable,
        "-c",
        PAUSED_PREPROCESS,
        str(marker),
        "preprocess",
        "fundus",
        "--protocol",
        "fedlwr",
        "--raw",
        f"{archive}={raw}",
        "--out",
        str(out / "store"),
        "--size",
        "16",
    ]
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "preprocessing never reached the store write"
            time.sleep(0.05)
        assert any(p.name.startswith(".store.tmp-") for p in out.iterdir())  # the temporary folder being written
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    left = sorted(p.name for p in out.iterdir()) if out.exists() else []
    assert left == [], left  # no .store.tmp-XXXXXXXX, no store
    assert "preprocess: stopped by SIGTERM; its temporary files and folders were removed" in stderr
