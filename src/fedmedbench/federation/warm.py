"""Warm app processes for a local federation: Flower's ``flwr-clientapp`` / ``flwr-serverapp``
forked from one interpreter that has already imported torch, Flower and every method.

Flower's SuperNode (and SuperLink) runs each message's ClientApp (each run's ServerApp) as a fresh
process, launched by its SuperExec as the command ``flwr-clientapp`` (``flwr-serverapp``) found on
``PATH``. A fresh process spends about 2 s of CPU importing torch before it reads the message, which
on the tiny test store is most of a round. ``local_federation(..., warm=True)`` puts two small
launchers of these names first on the processes' ``PATH``; each hands its arguments, working folder
and environment to this module's server (a Unix socket), which forks, and the child runs Flower's
own entry point (``flwr.supernode.cli.flwr_clientapp`` / ``flwr.superlink.cli.flwr_serverapp``)
with them: the same token handshake with the SuperNode's Runtime API, the same FAB install, the
same ClientApp; only the interpreter start is shared. The launcher waits for the child and exits
with its code, so the SuperExec sees an ordinary process. For tests and local trials only: a
deployment keeps Flower's own process isolation.

    python -m fedmedbench.federation.warm <socket>      # the server (local_federation starts it)
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedmedbench.errors import FedmedbenchError
from fedmedbench.federation.processes import spawn

COMMANDS = ("flwr-clientapp", "flwr-serverapp")

# The launcher: no site imports (-S), only the socket; exit code = the forked app's.
LAUNCHER = """#!{python} -S
import json, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect({socket!r})
s.sendall(json.dumps({{"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode() + b"\\n")
data = b""
while len(data) < 4:
    chunk = s.recv(4 - len(data))
    if not chunk:
        sys.exit("warm app server: the app process ended without an exit code (killed?)")
    data += chunk
sys.exit(struct.unpack("!i", data)[0])
"""


def write_launchers(folder: Path, socket_path: Path) -> Path:
    """``folder`` with the two launchers (put it first on the federation's ``PATH``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for command in COMMANDS:
        path = folder / command
        path.write_text(LAUNCHER.format(python=sys.executable, socket=str(socket_path)))
        path.chmod(0o755)
    return folder


def start(workdir: Path, env: dict) -> tuple[subprocess.Popen, Path]:
    """Start the server for a federation whose processes get ``env``: (its process, the launchers'
    folder to put first on their ``PATH``). The caller ends the process (its group)."""
    socket_path = workdir / "warm.sock"
    if len(str(socket_path)) > 100:  # a Unix socket path holds at most 107 bytes
        socket_path = Path(tempfile.mkdtemp(prefix="fmb-warm-")) / "s"
    # A socket left by a federation that was killed in this folder would read as "ready" below, and
    # the launchers would knock on a closed door.
    socket_path.unlink(missing_ok=True)
    log = workdir / "warm.log"
    process = spawn(
        [sys.executable, "-m", "fedmedbench.federation.warm", str(socket_path)], env=env, cwd=workdir, log=log
    )
    deadline = time.monotonic() + 600  # the imports take seconds; minutes on a crowded machine
    while not socket_path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise FedmedbenchError(
                f"the warm app server did not start (exit {process.poll()}); its log: {log}\n{log.read_text()[-2000:]}"
            )
        time.sleep(0.1)
    process.socket_path = socket_path  # removed once the federation has ended (local._federation)
    return process, write_launchers(workdir / "warm-bin", socket_path)


def remove_socket(process) -> None:
    """The server's socket (and its temporary folder, for a long work folder's path) once it has ended:
    nothing of a stopped federation stays in its folder."""
    path = getattr(process, "socket_path", None)
    if path is not None:
        path.unlink(missing_ok=True)
        if path.parent.name.startswith("fmb-warm-"):
            with contextlib.suppress(OSError):
                path.parent.rmdir()


def preload() -> None:
    """What every app process would import first (the expensive part of its start). Imported here
    (noqa: PLC0415), in the warm server before it forks, never by `federation local`, which imports
    this module and must start without torch or Flower (the optional [flower] extra)."""
    import httpcore  # noqa: F401, PLC0415  (Flower's Runtime API client imports it on first use)
    import pandas  # noqa: F401, PLC0415
    import torch  # noqa: PLC0415
    from flwr.superlink.cli import flwr_serverapp  # noqa: F401, PLC0415
    from flwr.supernode.cli import flwr_clientapp  # noqa: F401, PLC0415

    import fedmedbench.federation.clientapp  # noqa: F401, PLC0415
    import fedmedbench.federation.serverapp  # noqa: F401, PLC0415
    import fedmedbench.models  # noqa: F401, PLC0415  (the sites and serve() import these on first use)
    import fedmedbench.progress  # noqa: F401, PLC0415
    from fedmedbench.registry import available_methods, load_method  # noqa: PLC0415

    for name in available_methods():  # built in and registered plug-ins
        load_method(name)
    # torch's optimizers import torch._dynamo (and sympy) when the first one is built: 1.5 s of CPU
    # per message otherwise. Built on a dummy tensor, no computation: no thread pool to fork.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def run_child(connection: socket.socket, request: dict) -> None:
    """In the forked child: become the requested app process, report its exit code, exit."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's handler (serve) is not the app's
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # PYTHONPATH is read at interpreter start only: a plug-in's folder joins sys.path here.
        for entry in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        sys.argv = request["argv"]
        command = Path(sys.argv[0]).name
        if command == "flwr-clientapp":
            from flwr.supernode.cli import flwr_clientapp as entry_point  # noqa: PLC0415  (Flower: only the forked app process runs it)
        elif command == "flwr-serverapp":
            from flwr.superlink.cli import flwr_serverapp as entry_point  # noqa: PLC0415  (Flower: only the forked app process runs it)
        else:
            raise SystemExit(f"warm app server: unknown command {command!r}")
        try:
            entry_point()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, int) and done.code is not None:
                print(done.code, file=sys.stderr)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            connection.sendall(struct.pack("!i", code))
        finally:
            os._exit(code)


def serve(socket_path: Path) -> None:
    """Accept launcher requests forever; one forked child per request (reaped by the kernel)."""
    preload()
    gc.freeze()  # the preloaded objects stay out of the children's collections: their pages stay shared
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # no zombies: nobody waits for the children here
    listener = socket.socket(socket.AF_UNIX)
    if socket_path.exists():
        socket_path.unlink()
    listener.bind(str(socket_path))

    def end(signum, frame):  # SIGTERM (the federation's end, or its watchdog's): no socket left behind
        socket_path.unlink(missing_ok=True)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end)
    listener.listen(64)
    print(f"warm app server ready on {socket_path}", flush=True)
    while True:
        connection, _ = listener.accept()
        with connection.makefile("rb") as stream:
            line = stream.readline()
        if not line:
            connection.close()
            continue
        if os.fork() == 0:
            listener.close()
            run_child(connection, json.loads(line))
        connection.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m fedmedbench.federation.warm <socket>")
    serve(Path(sys.argv[1]))
