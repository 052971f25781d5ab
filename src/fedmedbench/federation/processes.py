"""Processes that end with the one who started them, however it ends (a normal end, an exception,
Ctrl-C, SIGTERM, ``timeout``, SIGKILL): the local federation's (``federation.local``) and its warm
app server's (``federation.warm``).

- Each process started here (``spawn``) gets a session of its own, so a signal meant for its parent
  does not reach it half-way, and on Linux a parent-death signal (``PR_SET_PDEATHSIG``).
- Every process of a guarded group, including all those they start in turn, carries one marker in
  its environment (``MARKER_ENV=<id>``): environments are inherited by every process Flower spawns, in
  whatever session, and by the warm server's forks. Flower's SuperLink starts its SuperExec in a
  session of its own and the app processes are grandchildren, so no process group and no
  parent-death signal (not inherited across fork) reaches them all; the marker does.
- ``process_guard``'s end ends every marked process (SIGTERM, then SIGKILL); a small watchdog process,
  which notices the parent's end by the closing of a pipe only the parent holds, does the same when
  the parent dies without running its cleanup (SIGKILL).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

# Every process of one guarded group carries MARKER_ENV=<its id> in its environment (module docstring).
MARKER_ENV = "FEDMEDBENCH_FEDERATION"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def marked_processes(value: str, name: str = MARKER_ENV) -> list[int]:
    """Live processes whose environment holds ``name=value`` (read from /proc: found whatever their
    session or parent). A zombie's environment reads empty: it is dead already and is not listed."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:  # ended meanwhile, or another user's
            continue
    return found


def end_marked(value: str, grace: float = 5.0) -> None:
    """End every process marked ``value``: SIGTERM (a SuperNode leaves the SuperLink cleanly, Snakemake
    removes its locks), up to ``grace`` seconds for them to exit, then SIGKILL until none is left."""
    for pid in marked_processes(value):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while marked_processes(value) and time.monotonic() < deadline:
        time.sleep(0.1)
    for _ in range(100):  # a process forked between two looks is found by the next
        left = marked_processes(value)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def watchdog(fd: int, value: str) -> None:
    """The watchdog process: block on the pipe until every write end is closed, which happens when the
    parent ends however it ends (it alone holds one: non-inheritable), then end the marked processes."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C or a closed terminal is the parent's to handle
    while True:
        try:
            if not os.read(fd, 64):
                break
        except InterruptedError:
            continue
    end_marked(value)


def _watchdog_code(fd: int, value: str) -> str:
    """The watchdog's program: these functions' own source and the standard library only (``-S``),
    so it starts in milliseconds and does not depend on the package importing cleanly."""
    functions = "\n\n".join(inspect.getsource(f) for f in (marked_processes, end_marked, watchdog))
    return f"import contextlib, os, signal, time\nMARKER_ENV = {MARKER_ENV!r}\n\n{functions}\n\nwatchdog({fd}, {value!r})\n"


def _die_with_parent():
    """A ``preexec_fn`` that asks Linux to send the child SIGTERM when its parent dies (SIGKILL
    included), or None. Only from the main thread: the signal follows the thread that forked, and a
    worker thread that ends would take a live federation with it."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes  # noqa: PLC0415  (ctypes: ~2 ms, for Linux's parent-death signal only; the CLI imports this module for --help)

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


def spawn(command: list[str], *, env: dict, cwd: Path, log: Path | None = None, **popen) -> subprocess.Popen:
    """A process of the federation: its own session, the parent-death signal, its output to ``log``
    (or as ``popen`` says)."""
    if log is None:
        return subprocess.Popen(
            command, env=env, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent(), **popen
        )
    with log.open("w") as output:  # the child holds its own copy
        return subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
            **popen,
        )


@contextlib.contextmanager
def process_guard(env: dict):
    """Mark ``env`` (``MARKER_ENV``: a fresh id) and start the watchdog; yields the id. At the end, and
    through the watchdog if this process dies first, every process started with ``env`` (and all
    they spawn) is ended."""
    value = uuid.uuid4().hex
    env[MARKER_ENV] = value
    read_end, write_end = os.pipe()  # non-inheritable: only the watchdog gets the read end, nobody else a write end
    guard = subprocess.Popen([sys.executable, "-S", "-c", _watchdog_code(read_end, value)], pass_fds=(read_end,), start_new_session=True,
                             env={k: v for k, v in env.items() if k != MARKER_ENV}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)  # fmt: skip
    os.close(read_end)
    try:
        yield value
    finally:
        try:
            end_marked(value)
        finally:
            os.close(write_end)  # the watchdog looks once more (nothing left) and exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                guard.wait(30)
