"""Training jobs started under a warm job server: same outputs, same exit status, killed with their client."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import tiny_run_config

SRC = Path(__file__).resolve().parents[1] / "src"


def test_jobs_through_the_server_behave_like_jobs_in_process(tmp_path, tiny_task):
    store, split = tiny_task
    good = json.dumps(tiny_run_config(store, split, "fedavg", rounds=2))
    diverging = json.dumps(tiny_run_config(store, split, "fedavg", rounds=2, optimizer={"name": "sgd", "lr": 1e30}))
    slow = json.dumps(tiny_run_config(store, split, "fedavg", rounds=200))
    train = [sys.executable, "-m", "fedmedbench", "train", "--threads", "1", "--run-config"]
    script = f"""
import subprocess, sys, time, signal
train = {train!r}
def run(cfg, out):
    return subprocess.run(train + [cfg, "--out", out], capture_output=True, text=True)
r = run({good!r}, {str(tmp_path / "served")!r}); print("good", r.returncode)
r = run({diverging!r}, {str(tmp_path / "diverged")!r}); print("diverged", r.returncode, r.stderr.strip().splitlines()[-1])
p = subprocess.Popen(train + [{slow!r}, "--out", {str(tmp_path / "killed")!r}], stderr=subprocess.PIPE, text=True)
for line in p.stderr:  # wait until it trains
    if "1/200 round" in line:
        break
p.send_signal(signal.SIGKILL); p.wait()
print("killed", p.returncode)
"""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run([sys.executable, "-m", "fedmedbench", "with-jobserver", sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.strip().splitlines())
    assert lines["good"] == "0"
    assert lines["diverged"].startswith("1 ") and "DivergenceError: round 1, client A" in lines["diverged"]
    assert lines["killed"] == str(-signal.SIGKILL)

    # The served job wrote exactly what an in-process job writes.
    direct = subprocess.run(train + [good, "--out", str(tmp_path / "direct")], capture_output=True, text=True, env=env)
    assert direct.returncode == 0, direct.stderr
    for name in ("final.json", "history.csv"):
        assert (tmp_path / "served" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes(), name
    # The killed job's forked child died with its client: its checkpoint stops changing.
    checkpoint = tmp_path / "killed" / "checkpoint.pt"
    time.sleep(1.0)
    before = checkpoint.stat().st_mtime_ns if checkpoint.exists() else None
    time.sleep(2.0)
    after = checkpoint.stat().st_mtime_ns if checkpoint.exists() else None
    assert before == after
