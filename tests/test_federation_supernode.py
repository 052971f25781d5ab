"""A site's SuperNode as docs/federation.md starts it (``python -m fedmedbench federation supernode``,
``federation.supernode``): a wrong ``--superlink`` address is named and given up on after a bound, a
``--port`` another SuperNode holds is named with what to do, and otherwise Flower's
``flower-supernode`` runs with the options exactly as given. No Flower process is started (fast)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedmedbench.errors import ConfigError
from fedmedbench.federation import supernode

REPO = Path(__file__).resolve().parents[1]


def closed_port() -> int:
    """A port of 127.0.0.1 nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 (a SuperLink's port, or another SuperNode's local API): its port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_supernode_given_a_wrong_superlink_port_names_the_address_and_gives_up_after_max_wait_time():
    port = closed_port()
    argv = [sys.executable, "-m", "fedmedbench", "federation", "supernode", "--root-certificates", "ca.crt",
            "--superlink", f"127.0.0.1:{port}", "--port", str(closed_port()), "--max-wait-time", "3"]  # fmt: skip
    started = time.monotonic()
    result = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "src")}
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - started >= 3
    assert (
        f"no SuperLink answers at 127.0.0.1:{port} (--superlink) yet (Connection refused); trying every 2 s for up to 3 s"
        in result.stdout
    )
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert errors[0].endswith(
        f"ConfigError: flower-supernode: no SuperLink answered at 127.0.0.1:{port} (--superlink) within 3 s (Connection refused); "
        "check the host and the port (the SuperLink's --port) and that the SuperLink runs; gave up"
    )


def test_without_max_wait_time_it_waits_the_documented_bound(monkeypatch, listener):
    waited = []
    monkeypatch.setattr(
        supernode, "wait_for_superlink", lambda address, timeout, say: waited.append((address, timeout))
    )
    supernode.check(["--superlink", "link.example.org:9093", "--port", str(closed_port())])
    supernode.check(["--port", str(closed_port())])  # Flower's default address
    assert waited == [("link.example.org:9093", 600.0), ("127.0.0.1:8000", 600.0)] and supernode.DIAL_TIMEOUT == 600.0
    docs = (REPO / "docs" / "federation.md").read_text()
    assert "default 600" in docs and "--max-wait-time" in docs


def test_a_second_supernode_on_a_taken_port_says_so_and_how_to_choose_another(listener):
    with pytest.raises(ConfigError) as taken:
        supernode.check(["--superlink", f"127.0.0.1:{listener}", "--port", str(listener)])
    assert str(taken.value) == (
        f"flower-supernode: --port {listener} is taken on 127.0.0.1 (another process, often another SuperNode, listens there): "
        f"each SuperNode on one machine needs its own local API port; give this one another, e.g. --port {listener + 1}"
    )


def test_a_bad_superlink_address_is_named():
    with pytest.raises(
        ConfigError, match=r"^--superlink link.example.org: expected host:port, e.g. link.example.org:9093$"
    ):
        supernode.check(["--superlink", "link.example.org", "--port", str(closed_port())])


def test_otherwise_flower_supernode_runs_with_the_options_as_given(monkeypatch, listener):
    from fedmedbench.cli import build_parser

    ran = []
    monkeypatch.setattr(supernode.os, "execv", lambda path, argv: ran.append((Path(path).name, argv)))
    flower = ["--root-certificates", "ca.crt", "--auth-supernode-private-key", "keys/BIDMC", "--superlink", f"127.0.0.1:{listener}",
              "--port", str(closed_port()), "--max-wait-time", "600", "--node-config", 'store="/data/store" client="BIDMC"']  # fmt: skip
    args = build_parser().parse_args(["federation", "supernode", *flower])
    args.func(args)
    assert ran == [("flower-supernode", ["flower-supernode", *flower])]
