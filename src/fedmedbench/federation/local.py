"""A real federation on this machine: one ``flower-superlink`` and one ``flower-supernode`` per site,
on free ports of 127.0.0.1, then ``flwr run`` of the app in ``flower-app/``. Every process it starts
is ended (its whole process group) however the block ends. Used by the tests and for trying a run
locally.

Two modes:
- insecure (the default, ``tls=False``): plain HTTP between the processes. LOCAL TESTING ONLY: every
  process binds 127.0.0.1 and nothing leaves the machine; never use ``--insecure`` across a network.
- ``tls=True`` (and ``supernode_auth=True``): what a deployment runs (docs/federation.md). A CA and a
  server certificate for 127.0.0.1/localhost are made on the fly in ``<workdir>/certificates``; the
  SuperLink serves TLS with them, the SuperNodes and ``flwr`` trust only that CA. With SuperNode
  authentication the SuperLink starts with ``--enable-supernode-auth``, each site gets its own
  ECDSA P-384 key pair (``<workdir>/keys``), its public key is registered with ``flwr supernode
  register`` before its SuperNode starts with ``--auth-supernode-private-key``; an unregistered key
  is refused by the SuperLink.
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

from fedmedbench.errors import ConfigError, FedmedbenchError

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
    # TLS files (credentials.TlsFiles) when started with tls=True; None: insecure, local only.
    tls: object = None
    supernode_auth: bool = False
    # {site: credentials.NodeKey} of the registered SuperNodes (supernode_auth only).
    node_keys: dict = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def flwr(self, *args: str, timeout: float = 120.0, env: dict | None = None) -> subprocess.CompletedProcess:
        """The ``flwr`` CLI with this federation's ``$FLWR_HOME`` (its connection ``fedmedbench-local``)."""
        command = [str(Path(sys.executable).with_name("flwr")), *args]
        return subprocess.run(command, env=env or self.env, cwd=self.workdir, capture_output=True, text=True, timeout=timeout)

    def run(self, run_config: dict, app_dir: Path = APP_DIR, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """``flwr run`` of the app with ``run_config`` (e.g. {"run-config": "...", "out": "..."});
        returns when the run has ended (``--stream`` follows its log to the end)."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
        return self.flwr("run", str(app_dir), CONNECTION, "--run-config", overrides, "--stream", timeout=timeout)

    def register(self, keys: dict[str, Path]) -> None:
        """``flwr supernode register`` of each site's public key ({site: public key file}): with
        ``--enable-supernode-auth`` only registered keys may connect (Flower 1.42 keeps them in the
        SuperLink's state, added through its Control API by the CLI). The CLI calls run side by side:
        each spends seconds importing Flower."""
        command = [str(Path(sys.executable).with_name("flwr")), "supernode", "register"]
        calls = {name: subprocess.Popen([*command, str(key), CONNECTION, "--name", name], env=self.env, cwd=self.workdir,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
                 for name, key in keys.items()}  # fmt: skip
        failed = []
        for name, call in calls.items():
            output, _ = call.communicate(timeout=180)
            if call.returncode != 0:
                failed.append(f"flwr supernode register of site {name} ({keys[name]}) failed with {call.returncode}: {output.strip()[-1500:]}")
        if failed:
            raise FedmedbenchError("\n".join(failed))

    def supernode(self, name: str) -> subprocess.Popen:
        """The SuperNode process last started for site ``name``."""
        return [p for p in self.processes if getattr(p, "site", None) == name][-1]

    def start_supernode(self, name: str, node_config: dict, *, private_key: Path | None = None, root_certificates: Path | None | bool = True,
                        wait: bool = True) -> subprocess.Popen:  # fmt: skip
        """A ``flower-supernode`` for site ``name`` (its log: ``<workdir>/supernode-<name>.log``).
        ``private_key``: its authentication key (default: the registered one, with supernode_auth);
        ``root_certificates``: True for the federation's CA, a path for another, None for none at all
        (the system's trust store, which does not hold the local CA). ``wait=False`` returns at once
        (for a node expected to be refused); else once its local API listens."""
        bin_dir = Path(sys.executable).parent
        folder = self.workdir / f"site-{name}"
        folder.mkdir(exist_ok=True)
        settings = {**node_config, "client": name, "state-dir": str(folder / "state")}
        node_port = free_port()
        log = self.workdir / f"supernode-{name}.log"
        if self.tls is None:
            security = ["--insecure"]  # local testing only (module docstring)
        else:
            cert = self.tls.ca_cert if root_certificates is True else root_certificates
            security = ["--root-certificates", str(cert)] if cert else []
            if private_key is None and name in self.node_keys:
                private_key = self.node_keys[name].private
            if private_key is not None:
                security += ["--auth-supernode-private-key", str(private_key)]
        node = subprocess.Popen(
            [str(bin_dir / "flower-supernode"), *security, "--superlink", self.address, "--port", str(node_port),
             "--node-config", " ".join(f"{k}={toml_value(v)}" for k, v in settings.items())],
            env=self.env, cwd=folder, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.processes.append(node)
        node.runtime_port, node.log, node.site = node_port, log, name  # for waiting on it later (local_federation)
        if wait:
            wait_for_port(node_port, node, log)
        return node


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


def _stop_all(processes: list) -> None:
    """``_stop`` of every process, side by side: SIGTERM to every group first (a SuperNode takes
    seconds to say goodbye to the SuperLink; one after another that added up), then each waited for
    up to 10 s and its group SIGKILLed."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # any app process left in the group
        process.wait()


def _connection_toml(port: int, tls) -> str:
    """The ``flwr`` CLI's connection (Flower 1.42 reads ``$FLWR_HOME/config.toml``, not pyproject
    federations): ``root-certificates`` must be an absolute path; ``insecure`` only without TLS."""
    security = f"root-certificates = {json.dumps(str(Path(tls.ca_cert).resolve()))}\n" if tls else "insecure = true  # local testing only\n"
    return f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "127.0.0.1:{port}"\n{security}'


@contextlib.contextmanager
def local_federation(sites: dict[str, dict], workdir: Path, *, tls: bool = False, supernode_auth: bool = False, warm: bool = False):
    """``sites``: {client name: node config (store, split, ...)}; ``client`` and ``state-dir`` are
    added. Yields a ``LocalFederation`` once the SuperLink listens and every SuperNode has started.
    ``tls``/``supernode_auth``: see the module docstring; the default (both False) is insecure and
    for local testing only. ``warm``: the ClientApp and ServerApp processes are forked from one
    interpreter that has imported torch and the methods (``federation.warm``), not started afresh
    for every message: the same Flower entry points, seconds less per message (tests)."""
    if supernode_auth and not tls:
        # Flower refuses it too (flower-superlink exits), but later and less clearly.
        raise ConfigError("local_federation: supernode_auth=True needs tls=True (Flower authenticates SuperNodes only over TLS)")
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "FLWR_HOME": str(workdir / "flwr-home"), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    # A SuperNode's SuperExec looks for a message to run once a second by default (Flower 1.42,
    # flwr/supercore/superexec/run_superexec.py); a tenth of a second takes ~0.45 s off each step of
    # a round (benchmarks/bench_federation.py). A deployment sets the same variable on its SuperNodes.
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
    port = free_port()
    tls_files = None
    if tls:
        from fedmedbench.federation.credentials import make_tls_files

        tls_files = make_tls_files(workdir / "certificates", hosts=("127.0.0.1", "localhost"))
    (workdir / "flwr-home").mkdir(exist_ok=True)
    (workdir / "flwr-home" / "config.toml").write_text(_connection_toml(port, tls_files))
    federation = LocalFederation(workdir, port, env, tls=tls_files, supernode_auth=supernode_auth)
    try:
        if warm:
            from fedmedbench.federation import warm as warm_apps

            server, launchers = warm_apps.start(workdir, env)
            federation.processes.append(server)
            env["PATH"] = f"{launchers}{os.pathsep}{env['PATH']}"
        log = workdir / "superlink.log"
        if tls_files is None:
            security = ["--insecure"]  # local testing only (module docstring)
        else:
            security = ["--ssl-ca-certfile", str(tls_files.ca_cert), "--ssl-certfile", str(tls_files.server_cert), "--ssl-keyfile", str(tls_files.server_key)]
            if supernode_auth:
                security.append("--enable-supernode-auth")
        superlink = subprocess.Popen(
            [str(bin_dir / "flower-superlink"), *security, "--host", "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation"],
            env=env, cwd=workdir, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        federation.processes.append(superlink)
        wait_for_port(port, superlink, log)
        if supernode_auth:
            from fedmedbench.federation.credentials import make_node_key

            federation.node_keys = {name: make_node_key(workdir / "keys", name) for name in sites}
            federation.register({name: key.public for name, key in federation.node_keys.items()})
        # Started side by side (each spends seconds importing Flower), then each waited for.
        nodes = [federation.start_supernode(name, node_config, wait=False) for name, node_config in sites.items()]
        for node in nodes:
            wait_for_port(node.runtime_port, node, node.log)
        yield federation
    finally:
        _stop_all(list(reversed(federation.processes)))
