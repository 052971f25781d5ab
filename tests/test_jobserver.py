"""Training jobs started under a warm job server: same outputs, same exit status, killed with their client."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_run_config

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
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
    result = subprocess.run(
        [sys.executable, "-m", "fedmedbench", "with-jobserver", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_the_server_dies_with_the_process_that_started_it(tmp_path, sig):
    """`kill PID` (or SIGKILL) of the top `with-jobserver` process: its forked server (~700 MB) must
    not stay blocked forever, and its /tmp folder goes with it."""
    import psutil

    script = "import os, sys, time; print(os.environ['FEDMEDBENCH_JOBSERVER'], flush=True); time.sleep(120)"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    top = subprocess.Popen(
        [sys.executable, "-m", "fedmedbench", "with-jobserver", sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    socket_path = Path(top.stdout.readline().strip())
    deadline = time.monotonic() + 120
    while not socket_path.exists() and time.monotonic() < deadline:  # the server is warm
        time.sleep(0.2)
    assert socket_path.exists()
    parent = psutil.Process(top.pid)
    children = parent.children()
    server = next(c for c in children if c.cmdline() == parent.cmdline())
    command = next(c for c in children if c.pid != server.pid)
    top.send_signal(sig)
    top.wait(timeout=30)
    gone, alive = psutil.wait_procs([server], timeout=30)
    assert not alive, "the job server outlived its parent"
    assert not socket_path.parent.exists()
    if sig == signal.SIGTERM:  # a plain `kill` also stops the command it ran (e.g. snakemake)
        psutil.wait_procs([command], timeout=30)
        assert not command.is_running() or command.status() == psutil.STATUS_ZOMBIE
    else:
        command.kill()


def test_only_jobs_in_the_servers_environment_and_allocation_are_served(tmp_path, monkeypatch):
    """A --use-conda job (another Python environment) and a job SLURM started (another allocation)
    run in-process, cold, never forked from a server in the wrong environment or outside their
    allocation's limits; a job in the server's scope is served."""
    import socket
    import threading

    from fedmedbench import jobserver

    path = str(tmp_path / "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(4)
    served = []

    def fake_server():  # answers every request with exit status 7, until the listener is closed
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            request, fds = jobserver.receive_request(conn)
            for fd in fds:
                os.close(fd)
            served.append(request["argv"])
            conn.sendall(jobserver.STATUS.pack(7))
            conn.close()

    server = threading.Thread(target=fake_server, daemon=True)
    server.start()
    monkeypatch.setenv(jobserver.SOCKET_ENV, path)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    server_scope = jobserver.scope()
    monkeypatch.setenv(jobserver.SCOPE_ENV, server_scope)
    assert jobserver.run_remotely(["methods"]) == 7 and served == [["methods"]]
    # A request far longer than one socket read (a report job's argv holds every experiment's notes:
    # 39 KB in the demo) arrives whole: it was cut at ~32 KB and the server died on the JSON.
    long_argv = ["report", "--experiments", json.dumps({"notes": ["é" * 1000] * 300})]
    assert jobserver.run_remotely(long_argv) == 7 and served[-1] == long_argv

    conda = json.dumps({**json.loads(server_scope), "prefix": "/opt/conda/envs/fedmedbench-torch"}, sort_keys=True)
    monkeypatch.setenv(jobserver.SCOPE_ENV, conda)  # the server runs another environment than this job
    assert jobserver.run_remotely(["methods"]) is None
    monkeypatch.setenv(jobserver.SCOPE_ENV, server_scope)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # this job runs inside a SLURM allocation, the server does not
    assert jobserver.run_remotely(["methods"]) is None
    monkeypatch.delenv(jobserver.SCOPE_ENV)  # a server that does not say its scope
    monkeypatch.delenv("SLURM_JOB_ID")
    assert jobserver.run_remotely(["methods"]) is None
    assert served == [["methods"], long_argv]  # only the first two jobs reached the server
    listener.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept(), which then ends
    listener.close()
    server.join(timeout=10)


# A served job whose client is stopped: the job's own SIGTERM handler runs (a data step removes its
# temporary folder there), as when the same command runs in-process.
STOPPED_CLIENT = """
import pathlib, signal, subprocess, sys, time
from fedmedbench import jobserver

started, cleaned = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])

def run(argv):
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        started.touch()
        time.sleep(60)
        return 0
    finally:
        cleaned.write_text("removed its temporaries")

client = "import sys; from fedmedbench import jobserver; sys.exit(jobserver.run_remotely(['job']))"
driver = f'''
import pathlib, signal, subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", {client!r}])
while not pathlib.Path({str(started)!r}).exists():
    time.sleep(0.05)
p.send_signal(signal.SIGTERM)
p.wait()
deadline = time.monotonic() + 30
while not pathlib.Path({str(cleaned)!r}).exists() and time.monotonic() < deadline:
    time.sleep(0.05)
'''
sys.exit(jobserver.with_jobserver([sys.executable, "-c", driver], run, lambda: None))
"""


def test_a_served_job_whose_client_is_stopped_ends_through_its_sigterm_handler(tmp_path):
    started, cleaned = tmp_path / "started", tmp_path / "cleaned"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDMEDBENCH_JOBSERVER")}
    env["PYTHONPATH"] = str(SRC)
    result = subprocess.run(
        [sys.executable, "-c", STOPPED_CLIENT, str(started), str(cleaned)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert cleaned.read_text() == "removed its temporaries"
