"""A real federation on this machine: one ``flower-superlink`` and one ``flower-supernode`` per site,
on free ports of 127.0.0.1, then ``flwr run`` of the app in ``flower-app/``. Used by the tests, the
benchmarks and the quick start (``python -m fedmedbench federation local``).

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

Every process of a federation ends with it, however the block or the command ends (a normal end, an
exception, Ctrl-C, SIGTERM, ``timeout``, the parent SIGKILLed): ``federation.processes``.

``python -m fedmedbench federation local`` (``add_subcommand``): the one-machine quick start: the
task's data prepared by the pipeline's own Snakemake rules (or reused), the run config written,
one SuperLink and one SuperNode per site started, the run, and where its results are.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedmedbench import config as cfgmod
from fedmedbench.errors import ConfigError, FedmedbenchError
from fedmedbench.federation.processes import process_guard, spawn
from fedmedbench.runconfig import RunConfig

# The CLI imports this module to build its parser, for `--help` too: as in cli.py, each subcommand
# imports what it runs inside its own function (ruff's PLC0415 is off for this module): the warm app
# server and the SuperNode's code, the TLS credentials (cryptography, ~40 ms), the registry
# (~15-30 ms), the run folder's writer (torch, ~1.5 s).

APP_DIR = Path(__file__).resolve().parents[3] / "flower-app"
CONNECTION = "fedmedbench-local"
# What the ServerApp's log says first (Flower 1.42's flwr-serverapp), and how long `flwr run` may go
# without it: a SuperLink whose own SuperExec cannot reach it (a server certificate that does not name
# 127.0.0.1) queues the run and starts nothing, and Flower's CLI waits without a word.
SERVERAPP_STARTED = "flwr-serverapp"
SERVERAPP_START_TIMEOUT = 180.0


def superlink_cause(log: Path) -> str:
    """Why a SuperLink started no ServerApp, from its log: its SuperExec's failed TLS handshake in
    words, else the log's last error line."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    for line in reversed(text.splitlines()):
        if "CERTIFICATE_VERIFY_FAILED" in line:
            return (f"its own SuperExec cannot connect to it over TLS ({line.strip()[-200:]}): the server certificate must name 127.0.0.1 and localhost "
                    "besides the address the sites dial (make_tls_files names them)")  # fmt: skip
    return last_error(log)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise FedmedbenchError(
                f"{process.args[0]} exited with {process.returncode} before listening on port {port}; its log: {log}\n{log.read_text()[-2000:]}"
            )
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise FedmedbenchError(f"{process.args[0]} did not listen on port {port} within {timeout:.0f} s; its log: {log}")


def toml_value(value) -> str:
    return (
        json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    )


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
        return subprocess.run(
            command, env=env or self.env, cwd=self.workdir, capture_output=True, text=True, timeout=timeout
        )

    def run(self, run_config: dict, app_dir: Path = APP_DIR, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """``flwr run`` of the app with ``run_config`` (e.g. {"run-config": "...", "out": "..."});
        returns when the run has ended (``--stream`` follows its log to the end): the CLI's output in
        ``stdout``. ``subprocess.TimeoutExpired`` after ``timeout`` seconds; ``FedmedbenchError`` when
        the SuperLink starts no ServerApp within ``SERVERAPP_START_TIMEOUT``."""
        log = self.workdir / "flwr-run.log"
        code, output = self._follow(run_config, log, None, app_dir, timeout)
        return subprocess.CompletedProcess(["flwr", "run"], code, stdout=output, stderr="")

    def stream(self, run_config: dict, log: Path, echo=None, app_dir: Path = APP_DIR) -> int:
        """``flwr run --stream`` of the app, its output (the ServerApp's log) written to ``log`` and,
        line by line as it comes, to ``echo`` (a text stream); returns the CLI's exit status."""
        return self._follow(run_config, log, echo, app_dir, None)[0]

    def _follow(self, run_config: dict, log: Path, echo, app_dir: Path, timeout: float | None) -> tuple[int, str]:
        """The CLI's run, its lines to ``log`` (and ``echo``) as they come: (exit status, output).
        A run whose ServerApp has not started ``SERVERAPP_START_TIMEOUT`` seconds after the CLI
        started is ended with one line naming the SuperLink's log and what it says (Flower's CLI
        would wait forever: a SuperLink whose own SuperExec cannot reach it starts no ServerApp)."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
        command = [
            str(Path(sys.executable).with_name("flwr")),
            "run",
            str(app_dir),
            CONNECTION,
            "--run-config",
            overrides,
            "--stream",
        ]
        started, fired, expired, lines = threading.Event(), threading.Event(), threading.Event(), []
        with log.open("w") as sink:
            process = spawn(
                command, env=self.env, cwd=self.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )

            def give_up(event: threading.Event) -> None:
                if not started.is_set() or event is expired:
                    event.set()
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()

            timers = [threading.Timer(SERVERAPP_START_TIMEOUT, give_up, (fired,))]
            if timeout is not None:
                timers.append(threading.Timer(timeout, give_up, (expired,)))
            for timer in timers:
                timer.daemon = True
                timer.start()
            try:
                for line in process.stdout:
                    if SERVERAPP_STARTED in line:
                        started.set()
                    lines.append(line)
                    sink.write(line)
                    if echo is not None:
                        echo.write(line)
                        echo.flush()
                code = process.wait()
            except BaseException:  # a signal's exception: the CLI goes first (the guard ends the rest)
                process.kill()
                process.wait()
                raise
            finally:
                for timer in timers:
                    timer.cancel()
                process.stdout.close()
        if expired.is_set():
            raise subprocess.TimeoutExpired(command, timeout, output="".join(lines))
        if fired.is_set():
            superlink_log = self.workdir / "superlink.log"
            raise FedmedbenchError(
                f"the SuperLink started no ServerApp within {SERVERAPP_START_TIMEOUT:.0f} s of flwr run: {superlink_cause(superlink_log)}; its log: {superlink_log}"
            )
        return code, "".join(lines)

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
                failed.append(
                    f"flwr supernode register of site {name} ({keys[name]}) failed with {call.returncode}: {output.strip()[-1500:]}"
                )
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
        node = spawn(
            [str(bin_dir / "flower-supernode"), *security, "--superlink", self.address, "--port", str(node_port),
             "--node-config", " ".join(f"{k}={toml_value(v)}" for k, v in settings.items())],
            env=self.env, cwd=folder, log=log,
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
    security = (
        f"root-certificates = {json.dumps(str(Path(tls.ca_cert).resolve()))}\n"
        if tls
        else "insecure = true  # local testing only\n"
    )
    return (
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "127.0.0.1:{port}"\n{security}'
    )


@contextlib.contextmanager
def local_federation(
    sites: dict[str, dict], workdir: Path, *, tls: bool = False, supernode_auth: bool = False, warm: bool = True
):
    """``sites``: {client name: node config (store, split, ...)}; ``client`` and ``state-dir`` are
    added. Yields a ``LocalFederation`` once the SuperLink listens and every SuperNode has started.
    ``tls``/``supernode_auth``: see the module docstring; the default (both False) is insecure and
    for local testing only. ``warm`` (default): the ClientApp and ServerApp processes are forked from
    one interpreter that has imported torch and the methods (``federation.warm``), not started
    afresh for every message: the same Flower entry points and the same outputs byte for byte,
    seconds less per message; ``warm=False``: Flower's own fresh process per message.
    Every process it starts (and every process those start) has ended when the block has ended."""
    if supernode_auth and not tls:
        # Flower refuses it too (flower-superlink exits), but later and less clearly.
        raise ConfigError(
            "local_federation: supernode_auth=True needs tls=True (Flower authenticates SuperNodes only over TLS)"
        )
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "FLWR_HOME": str(workdir / "flwr-home"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # A SuperNode's SuperExec looks for a message to run once a second by default (Flower 1.42,
    # flwr/supercore/superexec/run_superexec.py); a tenth of a second takes ~0.45 s off each step of
    # a round (benchmarks/bench_federation.py). A deployment sets the same variable on its SuperNodes.
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # a local trial reports nothing to Flower's servers
    with process_guard(env):
        yield from _federation(sites, workdir, env, tls, supernode_auth, warm)


def _federation(sites: dict[str, dict], workdir: Path, env: dict, tls: bool, supernode_auth: bool, warm: bool):
    """``local_federation``'s body, inside its process guard (``env`` carries the marker)."""
    bin_dir = Path(sys.executable).parent
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
            security = [
                "--ssl-ca-certfile",
                str(tls_files.ca_cert),
                "--ssl-certfile",
                str(tls_files.server_cert),
                "--ssl-keyfile",
                str(tls_files.server_key),
            ]
            if supernode_auth:
                security.append("--enable-supernode-auth")
        superlink = spawn(
            [str(bin_dir / "flower-superlink"), *security, "--host", "127.0.0.1", "--port", str(port), "--disable-runtime-dependency-installation"],
            env=env, cwd=workdir, log=log,
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
        if warm:
            warm_apps.remove_socket(federation.processes[0] if federation.processes else None)


# --- `python -m fedmedbench federation local`: the one-machine quick start ---------------------------
REPO = APP_DIR.parent
OUTPUTS = ("final.json", "history.csv", "model_best.pt", "predictions.npz", "federation.json", "run_config.json")


class Stopped(BaseException):
    """The command was asked to stop (SIGINT, SIGTERM, SIGHUP). A BaseException, as KeyboardInterrupt:
    no ``except Exception`` on the way may swallow it before the processes are ended."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stopped_by_signals():
    """SIGINT, SIGTERM and SIGHUP raise ``Stopped`` (once: a second signal while the processes are being
    ended is ignored, so the ending runs to its end); the handlers are restored afterwards."""
    stopping: list[int] = []

    def handler(signum, frame):
        if not stopping:
            stopping.append(signum)
            raise Stopped(signum)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def add_subcommand(subparsers) -> None:
    """``fedmedbench federation local`` (registered by ``cli.build_parser``)."""
    text = "run a method on Flower's deployment runtime"
    federation = subparsers.add_parser("federation", help=text, description=text + " (docs/federation.md)")
    actions = federation.add_subparsers(dest="federation_command", required=True, metavar="ACTION", title="actions")
    text = (
        "a federation on this machine: prepare (or reuse) the task's data with the pipeline's rules, write the run config, "
        "start a SuperLink and one SuperNode per site on 127.0.0.1, run, and print where the results are (Ctrl-C stops it all)"
    )
    p = actions.add_parser("local", help=text, description=text)
    # dest "config": the CLI checks each file exists before the command runs, as for its other commands.
    p.add_argument("--configfile", "--config", dest="config", nargs="+", default=[str(Path("config") / "config.yaml")], metavar="FILE",
                   help="config/config.yaml [overlay.yaml ...], as for snakemake --configfile (default: %(default)s)")  # fmt: skip
    p.add_argument("--task", required=True, help="the task, a key of the config's tasks, e.g. prostate")
    p.add_argument("--run", required=True, help="method or method-variant, e.g. fedavg or fedavg-e2")
    p.add_argument("--seed", type=int, default=0, help="the seed (default: %(default)s)")
    p.add_argument(
        "--sites", type=int, default=None, metavar="N", help="train on the task's first N sites (default: all of them)"
    )
    p.add_argument(
        "--rounds", type=int, default=None, metavar="N", help="rounds instead of the task's (a quick try: 2 or 3)"
    )
    p.add_argument("--results", default=None, metavar="DIR",
                   help="results folder, as the config's results_dir (default: the config's, else results): the data goes to "
                        "DIR/<run_name>/data/ as the pipeline's, the run to DIR/<run_name>/federation/<task>/<run>/seed<k>/")  # fmt: skip
    p.add_argument(
        "--cold",
        action="store_true",
        help="start a fresh Python process for every message, as Flower does by default (seconds slower per message)",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="train a finished run again from round 1 (its results are replaced); without it a finished run only says where its results are",
    )
    p.set_defaults(func=run_local)
    text = ("a site's SuperNode: flower-supernode with the options given, once its --port is free here and the SuperLink answers "
            "at --superlink (waiting up to --max-wait-time s, default 600; then one line naming the address)")  # fmt: skip
    # Flower's options pass through as they are: '+' is no option prefix of theirs (argparse would refuse '--port').
    p = actions.add_parser("supernode", help=text, description=text, prefix_chars="+", add_help=False)
    p.add_argument("flower_args", nargs=argparse.REMAINDER, metavar="flower-supernode options")
    p.set_defaults(func=run_supernode)


def run_supernode(args) -> None:
    """The ``federation supernode`` command (``federation.supernode``: imported only when it runs)."""
    from fedmedbench.federation import supernode

    supernode.run_supernode(args)


def run_local(args) -> None:
    """The ``federation local`` command; on a signal, every process it started has ended before it
    exits with 128 + the signal's number."""
    try:
        with stopped_by_signals():
            _run_local(args)
    except Stopped as stop:
        print(
            f"federation local: stopped by {stop}; every process it started has ended (the same command continues from the run's last checkpoint)",
            file=sys.stderr,
            flush=True,
        )
        raise SystemExit(128 + stop.signum) from None


def _run_local(args) -> None:
    from fedmedbench.fl.runlock import run_folder_lock
    from fedmedbench.registry import merge_params

    if importlib.util.find_spec("flwr") is None:
        raise ConfigError(
            "federation local: Flower is not installed; install the flower extra: pip install -e '.[flower]'"
        )
    if not (REPO / "workflow" / "Snakefile").is_file() or not cfgmod.DEFAULT_CONFIG.is_file():
        raise ConfigError(
            f"federation local: run it from the fedmedbench checkout ({REPO}): it prepares the data with the pipeline's workflow and config/config.yaml"
        )
    for name in ("sites", "rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"--{name}: expected a whole number >= 1, got {getattr(args, name)}")
    config = cfgmod.load_config(*args.config)
    if args.results is not None:
        config["results_dir"] = args.results
        cfgmod.check_results_dir(config, "--results")
    resolved = cfgmod.resolve_run(config, args.task, args.run, args.seed)
    clients = resolved["clients"]
    sites = args.sites or len(clients)
    if sites > len(clients):
        raise ConfigError(
            f"--sites {sites}: task {args.task} has {len(clients)} sites ({', '.join(clients)}); give 1 to {len(clients)}"
        )
    resolved["clients"] = clients[:sites]
    if resolved.get("client_labels"):
        resolved["client_labels"] = resolved["client_labels"][:sites]
    if args.rounds is not None:
        resolved["rounds"] = args.rounds
    run = RunConfig.from_dict(resolved, where=f"tasks.{args.task} (run {args.run})")
    # The form a run folder's run_config.json has (runfolder.write_run_config): the method's defaults filled in.
    run = run.replace(
        method_params=merge_params(run.method, run.method_params, f"run {args.run}: method_params", run.method_module)
    )
    root = cfgmod.results_root(config)
    out = root / "federation" / args.task / args.run / f"seed{args.seed}"
    workdir = out.with_name(out.name + "-flower")  # Flower's side: logs, the sites' state, the CLI's connection
    out.mkdir(parents=True, exist_ok=True)
    # One writer per run folder, as for `train`: a second command for this run stops here, naming the
    # process that holds it, before it touches the data, the logs or the sites' state.
    with run_folder_lock(out, holder=f"federation local {args.task}/{args.run}/seed{args.seed}"):
        if (out / "final.json").is_file() and not getattr(args, "restart", False):
            print(
                f"{args.task}/{args.run}/seed{args.seed}: this run has finished already; nothing to do (--restart trains it again)"
            )
            summary(args, out, workdir)
            return
        workdir.mkdir(parents=True, exist_ok=True)
        federate(args, run, out, workdir, config)
    summary(args, out, workdir)


def federate(args, run, out: Path, workdir: Path, config: dict) -> None:
    """The data prepared, the run config written, the federation started and the run streamed; under
    the run folder's lock, which the ServerApp writes under (``lock-owner``)."""
    from fedmedbench.fl.runfolder import write_run_config

    store, split = Path(run.data.store), Path(run.data.split)
    print(f"data: {split.parent} (the pipeline's rules prepare it, or find it up to date)", flush=True)
    prepare_data(args.config, config.get("results_dir", "results"), [split], workdir / "snakemake.log")
    write_run_config(run, out)
    members = [*run.clients, *run.ood_clients]  # a test-only cohort is a SuperNode of its own
    node_configs = {name: {"store": str(store.resolve()), "split": str(split.resolve())} for name in members}
    mode = "cold: a fresh process per message" if args.cold else "warm app processes"
    print(
        f"starting a SuperLink and {len(members)} SuperNodes ({', '.join(members)}) on 127.0.0.1, insecure, this machine only ({mode})",
        flush=True,
    )
    with local_federation(node_configs, workdir, warm=not args.cold) as federation:
        print(
            f"SuperLink on {federation.address}: {args.task}/{args.run}/seed{args.seed}, {run.rounds} round(s)",
            flush=True,
        )
        settings = {
            "run-config": str((out / "run_config.json").resolve()),
            "out": str(out.resolve()),
            "lock-owner": os.getpid(),
            "restart": bool(getattr(args, "restart", False)),
        }
        federation.stream(settings, workdir / "flwr-run.log", echo=sys.stdout)


def summary(args, out: Path, workdir: Path) -> None:
    """The run's mean test score and where its files are; one line if it did not finish."""
    final_path = out / "final.json"
    if not final_path.is_file():
        raise FedmedbenchError(
            f"federation local: the run ended without {final_path}: {last_error(workdir / 'flwr-run.log')}; logs: {workdir}"
        )
    final = json.loads(final_path.read_text())
    metric = final["primary_metric"]
    mean = sum(v[metric] for v in final["test"].values()) / len(final["test"])
    from fedmedbench.report.flags import print_score_summary

    # a flagged score is never printed bare: its mark, and a WARNING line per run, site and seed
    print_score_summary(
        final,
        f"{args.task}/{args.run}/seed{args.seed}: mean test {metric} {mean:.4f} over {len(final['test'])} sites (selected on val: {final['selection']['best_round']})",
    )
    print(f"results: {out}/ ({', '.join(name for name in OUTPUTS if (out / name).is_file())})")
    print(f"logs and the sites' state: {workdir}/ (superlink.log, supernode-<site>.log, flwr-run.log, site-<site>/)")


def prepare_data(configfiles: list[str], results_dir: str, targets: list[Path], log: Path) -> None:
    """The task's store and split made by the pipeline's own rules (synthesize or download, extract,
    preprocess, split), or found up to date: Snakemake on ``targets`` with the same config files.
    Its processes are marked like a federation's, so a signal or a kill ends them too."""
    snakemake = Path(sys.executable).with_name("snakemake")
    command = [str(snakemake) if snakemake.is_file() else "snakemake", "--snakefile", str(REPO / "workflow" / "Snakefile"), "--configfile", *configfiles,
               "--config", f"results_dir={results_dir}", "--cores", "2", "--rerun-incomplete", *map(str, targets)]  # fmt: skip
    env = dict(os.environ)
    with process_guard(env):
        try:
            process = spawn(command, env=env, cwd=Path.cwd(), log=log)
        except FileNotFoundError:
            raise ConfigError(
                "federation local: snakemake is not installed (pip install -e '.[dev]'); it prepares the task's data"
            ) from None
        code = process.wait()
    if code != 0:
        raise FedmedbenchError(
            f"federation local: preparing the data failed (Snakemake exited with {code}): {last_error(log)}; its log: {log}"
        )


def last_error(log: Path) -> str:
    """The line of ``log`` that says what went wrong: the last naming an error, else its last line.
    A Rich box (Flower's CLI frames its errors: ``╭─ Error ─╮``, ``│ text │``, ``╰──╯``) counts as
    one line, its title and its text, never its border."""
    lines = (
        [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.is_file() else []
    )
    flat, box = [], None
    for line in lines:
        if line.startswith("╭"):
            box = [line.strip("╭╮─ ")]
        elif box is not None and line.startswith("│"):
            box.append(line.strip("│ "))
        elif box is not None and line.startswith("╰"):
            title, text = box[0], " ".join(part for part in box[1:] if part)
            flat.append(f"{title}: {text}" if title else text)
            box = None
        else:
            flat.append(line)
    errors = [line for line in flat if "Error" in line or "error" in line]
    return (errors or flat or ["(no output)"])[-1][:500]
