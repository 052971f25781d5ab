"""``python -m fedmedbench federation supernode [flower-supernode's options]``: a site's SuperNode
(docs/federation.md), Flower's ``flower-supernode`` with every option passed on unchanged, after two
checks Flower 1.42 does not make in words:

- its local API port (``--host``/``--port``, default 127.0.0.1:9094) is free on this machine: a second
  SuperNode on the same port otherwise stops with uvicorn's traceback;
- the SuperLink answers at ``--superlink`` (default 127.0.0.1:8000): Flower's SuperNode otherwise
  retries ``Connection attempt failed`` forever (without ``--max-wait-time``) and, over TLS, never
  names the address it dials. This waits for it up to ``--max-wait-time`` seconds (default
  ``DIAL_TIMEOUT``) and then gives up in one line naming the address.

Then this process becomes ``flower-supernode`` (exec: the same pid, signals and exit code).
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from fedmedbench.errors import ConfigError

# Flower 1.42's defaults (flwr.supercore.constant): the address a SuperNode dials, its local API.
SUPERLINK_DEFAULT = "127.0.0.1:8000"
HOST_DEFAULT, PORT_DEFAULT = "127.0.0.1", 9094
# Seconds to wait for the SuperLink to answer when --max-wait-time is not given.
DIAL_TIMEOUT = 600.0
RETRY_EVERY = 2.0


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:9093`` for IPv6) as (host, port); a ConfigError naming it otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--superlink {address}: expected host:port, e.g. link.example.org:9093")
    return host.strip("[]"), int(port)


def port_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound (another process listens there), or None. SO_REUSEADDR as
    uvicorn binds: a port a stopped SuperNode left in TIME_WAIT is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            return os.strerror(err.errno) if err.errno else str(err)
    return None


def wait_for_superlink(address: str, timeout: float, say=print) -> None:
    """Return once a TCP connection to ``address`` succeeds; ConfigError naming it after ``timeout``
    seconds of refusals (a wrong host or port, or no SuperLink running there)."""
    host, port = split_address(address)
    deadline, told, last = time.monotonic() + timeout, False, ""
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(10.0, max(timeout, 0.1))):
                return
        except OSError as err:
            last = err.strerror or str(err) or type(err).__name__
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"flower-supernode: no SuperLink answered at {address} (--superlink) within {timeout:.0f} s ({last}); "
                "check the host and the port (the SuperLink's --port) and that the SuperLink runs; gave up"
            )
        if not told:
            say(
                f"fedmedbench: no SuperLink answers at {address} (--superlink) yet ({last}); trying every {RETRY_EVERY:.0f} s for up to {timeout:.0f} s (--max-wait-time)",
                flush=True,
            )
            told = True
        time.sleep(min(RETRY_EVERY, max(0.0, deadline - time.monotonic())))


def flower_supernode() -> str:
    """The ``flower-supernode`` of this Python environment (beside its interpreter), else on PATH."""
    beside = Path(sys.executable).with_name("flower-supernode")
    found = str(beside) if beside.is_file() else shutil.which("flower-supernode")
    if found is None:
        raise ConfigError(
            "federation supernode: flower-supernode is not installed; install the flower extra: pip install -e '.[flower]'"
        )
    return found


def check(flower_args: list[str], say=print) -> None:
    """The two checks (module docstring) on ``flower-supernode``'s own options."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--superlink", default=SUPERLINK_DEFAULT)
    options.add_argument("--host", default=HOST_DEFAULT)
    options.add_argument("--port", type=int, default=PORT_DEFAULT)
    options.add_argument("--max-wait-time", type=float, default=None)
    known, _ = options.parse_known_args(flower_args)
    taken = port_taken(known.host, known.port)
    if taken is not None:
        if taken == os.strerror(errno.EADDRINUSE):
            taken = "another process, often another SuperNode, listens there"
        raise ConfigError(
            f"flower-supernode: --port {known.port} is taken on {known.host} ({taken}): each SuperNode on one machine needs its own "
            f"local API port; give this one another, e.g. --port {known.port + 1}"
        )
    wait_for_superlink(known.superlink, DIAL_TIMEOUT if known.max_wait_time is None else known.max_wait_time, say)


def run_supernode(args) -> None:
    """The ``federation supernode`` command: the checks, then ``flower-supernode`` in this process."""
    flower_args = list(args.flower_args)
    if any(a in ("-h", "--help", "-V", "--version") for a in flower_args):
        os.execv(flower_supernode(), ["flower-supernode", *flower_args])
    command = flower_supernode()
    check(flower_args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(command, ["flower-supernode", *flower_args])
