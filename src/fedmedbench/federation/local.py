"""A real federation on this machine: one ``flower-superlink`` and one ``flower-supernode`` per site,
on free ports of 127.0.0.1, insecure (no TLS: local testing only, see docs/federation.md for a
deployment), then ``flwr run`` of the app in ``flower-app/``. Every process it starts is ended
(its whole process group) however the block ends. Used by the tests and for trying a run locally.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedmedbench.errors import FedmedbenchError

APP_DIR = Path(__file__).resolve().parents[3] / "flower-app"
CONNECTION = "fedmedbench-local"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise FedmedbenchError(f"{process.args[0]} exited with {process.returncode} before listening on port {port}; its log: {log}\n{log.read_text()[-2000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise FedmedbenchError(f"{process.args[0]} did not listen on port {port} within {timeout:.0f} s; its log: {log}")


def toml_value(value) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class LocalFederation:
    workdir: Path
    port: int
    env: dict
    processes: list = field(default_factory=list)

    def run(self, run_config: dict, app_dir: Path = APP_DIR, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """``flwr run`` of the app with ``run_config`` (e.g. {"run-config": "...", "out": "..."});
        returns when the run has ended (``--stream`` follows its log to the end)."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
        command = [str(Path(sys.executable).with_name("flwr")), "run", str(app_dir), CONNECTION, "--run-config", overrides, "--stream"]
        return subprocess.run(command, env=self.env, cwd=self.workdir, capture_output=True, text=True, timeout=timeout)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the process group (the node and the app processes it spawned), then SIGKILL."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # any app process left in the group
    process.wait()


@contextlib.contextmanager
def local_federation(sites: dict[str, dict], workdir: Path):
    """``sites``: {client name: node config (store, split, ...)}; ``client`` and ``state-dir`` are
    added. Yields a ``LocalFederation`` once the SuperLink listens and every SuperNode has started."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "FLWR_HOME": str(workdir / "flwr-home"), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    port = free_port()
    (workdir / "flwr-home").mkdir(exist_ok=True)
    (workdir / "flwr-home" / "config.toml").write_text(f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "127.0.0.1:{port}"\ninsecure = true\n')
    federation = LocalFederation(workdir, port, env)
    try:
        log = workdir / "superlink.log"
        superlink = subprocess.Popen(
            [str(bin_dir / "flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation"],
            env=env, cwd=workdir, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        federation.processes.append(superlink)
        wait_for_port(port, superlink, log)
        for name, node_config in sites.items():
            folder = workdir / f"site-{name}"
            folder.mkdir(exist_ok=True)
            settings = {**node_config, "client": name, "state-dir": str(folder / "state")}
            node_port = free_port()
            log = workdir / f"supernode-{name}.log"
            node = subprocess.Popen(
                [str(bin_dir / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{port}", "--port", str(node_port),
                 "--node-config", " ".join(f"{k}={toml_value(v)}" for k, v in settings.items())],
                env=env, cwd=folder, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            federation.processes.append(node)
            wait_for_port(node_port, node, log)
        yield federation
    finally:
        for process in reversed(federation.processes):
            _stop(process)
