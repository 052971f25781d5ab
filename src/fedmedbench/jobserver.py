"""A warm start for many short training jobs on one machine (the demo, CI).

Every Snakemake job is a new process, and a training process spends ~6 s of CPU before its first
step: importing torch (~3 s) and ``torch._dynamo`` (~3 s, imported by every torch optimizer). For the
demo's ~80 tiny jobs that is most of the time. ``python -m fedmedbench with-jobserver <command>``
starts a server that imports all of that once, runs ``<command>`` (e.g. snakemake) with
``FEDMEDBENCH_JOBSERVER`` set, and stops the server afterwards. A ``fedmedbench`` command (``train``,
and the data, table and figure steps, whose Python start-up with pandas is most of their time) started
under it sends its arguments, working folder, environment and its stdin/stdout/stderr to the server,
which forks a child that runs the job exactly as the command line would (same code, same output
files, same exit status) and reports the exit status back.

- The server never runs a tensor operation or touches a GPU, so forking it is safe; each child
  initialises its own thread pools and devices.
- A job whose client goes away (stopped by Snakemake or by hand) stops too, as it would in-process: the
  child watches its connection and, when it closes, sends itself SIGTERM (so a step removes its
  temporary files on the way out), then SIGKILL after ``STOP_GRACE_S``. A child killed by a signal is
  reported as a death by that signal (exit status 128 + signal).
- Without a server (the variable unset, or nobody listening) ``train`` runs in-process as always.
- Only a job in the server's own scope is served (``scope``): the same Python environment and the
  same SLURM allocation. A ``--use-conda`` job runs in its rule's conda environment and a job that
  SLURM started runs inside its allocation (its cgroup: CPUs, memory, GPU), so both run in-process,
  cold, as they would without a server, never in the server's environment or outside their
  allocation. The warm start is for jobs that Snakemake runs locally in the active environment.

The server knows no command: the CLI hands it the function that runs one (``run``, its ``main``) and
the one that warms it up (``warm_up``), so this module imports nothing of the package above it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Callable

SOCKET_ENV = "FEDMEDBENCH_JOBSERVER"
SCOPE_ENV = "FEDMEDBENCH_JOBSERVER_SCOPE"
# Seconds a job whose client went away has, after its SIGTERM, to remove its temporaries and end.
STOP_GRACE_S = 10.0
STATUS = struct.Struct("!i")
# A request is its length (sent with the client's three file descriptors) and then its JSON. A Unix
# stream socket delivers a long message in several reads, and the read that carries the descriptors
# ends at the first chunk: without the length, a request of more than ~32 KB (a report job's argv)
# arrived cut short and the server failed to parse it.
LENGTH = struct.Struct("!Q")

log = logging.getLogger("fedmedbench.jobserver")


# A job: its argv in, its exit status out (the CLI's ``main``).
Run = Callable[[list[str]], int]


def _child(conn: socket.socket, request: dict, fds: list[int], run: Run) -> None:
    """Run one job in the forked child; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):  # the client's stdin, stdout, stderr (the job's log)
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({k: v for k, v in request["env"].items() if k != SOCKET_ENV})
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

        def watch() -> None:  # the client went away: so do we, first as a stopped job would, then for good
            conn.recv(1)
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait(STOP_GRACE_S)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()
        code = run(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # a bug: its traceback goes to the job's log, as in-process
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.sendall(STATUS.pack(code))
        finally:
            os._exit(code)


def die_with_parent(lifeline: int, path: str) -> None:
    """End the server when the process that started it ends, however it ends (``kill``, SIGKILL,
    a supervisor): that process holds the only write end of the ``lifeline`` pipe, so a read
    returns end-of-file exactly then. The socket and its folder go too (no ~700 MB server left
    blocked in ``accept`` forever, no folder left in /tmp)."""

    def watch() -> None:
        while os.read(lifeline, 1):
            pass
        Path(path).unlink(missing_ok=True)
        try:
            os.rmdir(Path(path).parent)
        except OSError:
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def serve(path: str, run: Run, warm_up: Callable[[], None], lifeline: int | None = None) -> None:
    if lifeline is not None:
        die_with_parent(lifeline, path)
    # Listen first, warm up second: the command starts at once (a Snakemake call with nothing to do
    # never waits for torch to import) and early jobs queue in the backlog until the server is warm.
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    warm_up()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        conn, _ = server.accept()
        try:
            request, fds = receive_request(conn)
        except (OSError, ValueError) as err:  # a client that went away or spoke garbage: not our end
            log.warning("job server: dropped a request (%s)", err)
            conn.close()
            continue
        if os.fork() == 0:
            server.close()
            if lifeline is not None:
                os.close(lifeline)  # a job outlives the server if it must
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _child(conn, request, fds, run)
        for fd in fds:
            os.close(fd)
        conn.close()


def send_request(conn: socket.socket, request: dict) -> None:
    """``request`` and this process's stdin, stdout and stderr, framed by its length (``LENGTH``)."""
    body = json.dumps(request).encode()
    socket.send_fds(conn, [LENGTH.pack(len(body))], [0, 1, 2])
    conn.sendall(body)


def receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """(the request, the client's three file descriptors), read whole however the socket splits it."""
    header, fds, _, _ = socket.recv_fds(conn, LENGTH.size, 3)
    while len(header) < LENGTH.size:
        chunk = conn.recv(LENGTH.size - len(header))
        if not chunk:
            raise ValueError("the client closed the connection before its request's length")
        header += chunk
    (size,) = LENGTH.unpack(header)
    body = bytearray()
    while len(body) < size:
        chunk = conn.recv(min(size - len(body), 1 << 20))
        if not chunk:
            for fd in fds:
                os.close(fd)
            raise ValueError(f"the client closed the connection after {len(body)} of {size} request bytes")
        body += chunk
    return json.loads(body), fds


def scope() -> str:
    """Where a served job would run, as the server advertises it and a job checks it: this Python
    environment (``sys.prefix``: a venv's or a conda env's folder) and this SLURM allocation (none
    outside SLURM)."""
    return json.dumps({"prefix": sys.prefix, "slurm_job": os.environ.get("SLURM_JOB_ID")}, sort_keys=True)


def run_remotely(argv: list[str]) -> int | None:
    """Hand ``argv`` to the job server if one is listening and the job is in its scope (``scope``);
    its exit status, else None (the job runs in-process)."""
    path = os.environ.get(SOCKET_ENV)
    if not path:
        return None
    if os.environ.get(SCOPE_ENV) != scope():
        log.debug("not served by the job server at %s: another Python environment or SLURM allocation", path)
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:
        return None
    send_request(conn, {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)})
    data = b""
    while len(data) < STATUS.size:
        chunk = conn.recv(STATUS.size - len(data))
        if not chunk:  # the child died without a word: killed
            return 128 + signal.SIGKILL
        data += chunk
    return STATUS.unpack(data)[0]


def with_jobserver(command: list[str], run: Run, warm_up: Callable[[], None]) -> int:
    """Run ``command`` with a job server for its training jobs: each job is ``run(argv)`` in a child
    forked from the server, which called ``warm_up()`` once."""
    folder = tempfile.mkdtemp(prefix="fedmedbench-jobserver-")
    path = str(Path(folder) / "socket")
    lifeline, keepalive = os.pipe()  # not inherited by `command` (non-inheritable fds)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(keepalive)
            serve(path, run, warm_up, lifeline)
        finally:
            os._exit(1)
    os.close(lifeline)
    # `kill <pid>` of this process: stop the command as well, then clean up below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        for _ in range(600):  # the socket appears within milliseconds
            if Path(path).exists():
                break
            if os.waitpid(pid, os.WNOHANG)[0]:
                log.warning("the job server did not start; jobs run without it")
                break
            threading.Event().wait(0.05)
        child = subprocess.Popen(command, env={**os.environ, SOCKET_ENV: path, SCOPE_ENV: scope()})
        try:
            return child.wait()
        except BaseException:
            child.terminate()  # Snakemake stops its jobs on SIGTERM
            child.wait()
            raise
    finally:
        os.close(keepalive)
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
        Path(path).unlink(missing_ok=True)
        if Path(folder).exists():
            os.rmdir(folder)
