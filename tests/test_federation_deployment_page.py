"""docs/federation.md's deployment, run as the page prints it: its blocks marked
``<!-- run-by: tests/test_federation_deployment_page.py -->`` are read from the page (never copied
here) and run by bash on 127.0.0.1, each in the folder of the machine that runs it:

- ``link/``: the trial certificates (``make_tls_files``), the SuperLink with TLS and SuperNode
  authentication and its database;
- ``operator/``: the ``flwr`` connection (``$FLWR_HOME/config.toml``), the key registrations, ``flwr
  run`` of the checkout's ``flower-app/`` and ``flwr ls``;
- ``site-BIDMC/``, ``site-HK/``: each site's key pair and SuperNode, with its own site's data only
  (its store folder and its split rows; nothing of the other site).

The site's blocks run once per site: the second site's are the page's with ``BIDMC`` replaced by
``HK``. What moves between the machines is what the page's table says: ``ca.crt`` to every site and
the operator, each site's ``keys/<site>.pub`` to the operator, the run config to the SuperLink's
machine (an engine run's ``run_config.json``, as step 1 says). The substitutions (``substitutions``)
are the page's example addresses and paths only; lines naming a placeholder (``NODE_ID``, a run id)
are not run. The run folder equals the engine's (``run_training`` = ``fedmedbench train``, one CPU
thread as the sites) byte for byte, as tests/federation_matrix.py compares. Every process the blocks
start carries the marker of ``federation.processes.process_guard``, which ends them however the test
ends (its watchdog too, should pytest itself be killed). The ClientApp and ServerApp processes are
Flower's own (cold), as in a deployment."""

from __future__ import annotations

import filecmp
import getpass
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedmedbench.federation.local import free_port, wait_for_port  # noqa: E402
from fedmedbench.federation.processes import marked_processes, process_guard, spawn  # noqa: E402
from fedmedbench.fl.data import data_digest  # noqa: E402
from fedmedbench.fl.engine import run_training  # noqa: E402
from tests.conftest import tiny_run_config, write_tiny_task  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "federation.md"
MARK = "<!-- run-by: tests/test_federation_deployment_page.py -->"
# A fenced block, indented as in a numbered list item; group "above": the line right above it.
BLOCK = re.compile(
    r"^(?P<above>[^\n]*)\n(?P<indent>[ ]*)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
SITES = ("BIDMC", "HK")  # BIDMC: the page's site; HK: the second one
OUTPUTS = ("final.json", "history.csv", "model_best.pt", "predictions.npz")
PLACEHOLDERS = (
    "NODE_ID",
    "1234567890",
)  # `flwr supernode unregister NODE_ID`, `flwr stop 1234567890`: examples, not run


def substitutions(tmp: Path, link_port: int, site: str, node_port: int) -> list[tuple[str, str]]:
    """What the page's commands name that a CI machine has not, in the order applied."""
    site_dir = tmp / f"site-{site}"
    return [
        (
            "link.example.org:9093",
            f"127.0.0.1:{link_port}",
        ),  # the address the sites and flwr dial (the certificate still names link.example.org)
        (
            "--host 0.0.0.0 --port 9093",
            f"--host 127.0.0.1 --port {link_port}",
        ),  # nothing leaves the machine; a free port
        ("--port 9094", f"--port {node_port}"),  # each SuperNode's local API: a free port
        ("sudo ", ""),  # no root here: the folder below is the test's own
        ("/var/lib/flwr", str(tmp / "link" / "var-lib-flwr")),
        ("/var/lib/fedmedbench", str(site_dir / "state")),
        ("/data/fedmedbench", str(site_dir / "data")),
        ("/srv/", f"{tmp / 'link' / 'srv'}/"),
        ("/etc/fedmedbench/", f"{tmp / 'operator' / 'etc'}/"),
        ("BIDMC", site),
    ]


def page_blocks() -> dict[str, tuple[str, str]]:
    """The marked blocks by role: {role: (lang, body)}, the body dedented; every role found once."""
    roles = {"make_tls_files": "certificates", "make_node_key": "site key", "flower-superlink": "superlink", "[superlink]": "connection",
             "flwr supernode register": "register", "federation supernode": "supernode", "flwr run": "run", "flwr ls": "ls"}  # fmt: skip
    found = {}
    for m in BLOCK.finditer(PAGE.read_text(encoding="utf-8")):
        if m.group("above").strip() != MARK:
            continue
        body = "".join(
            line[len(m.group("indent")) :] if line.startswith(m.group("indent")) else line
            for line in m.group("body").splitlines(True)
        )
        role = next(
            role for key, role in roles.items() if key in body
        )  # StopIteration: a marked block of no known role
        assert role not in found, f"{PAGE}: two marked blocks of role {role}"
        found[role] = (m.group("lang"), body)
    assert sorted(found) == sorted(roles.values()), f"{PAGE}: the marked blocks are {sorted(found)}"
    return found


def script(body: str, substitutions: list[tuple[str, str]]) -> str:
    """The block as bash runs it: continuation lines joined, placeholder lines dropped, substituted."""
    lines = [line for line in re.sub(r"\\\n\s*", " ", body).splitlines() if not any(p in line for p in PLACEHOLDERS)]
    text = "\n".join(lines) + "\n"
    for old, new in substitutions:
        text = text.replace(old, new)
    return text


def run(text: str, cwd: Path, env: dict, timeout: float = 300) -> str:
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", text], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, (
        f"in {cwd}:\n{text}\nexited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    )
    return result.stdout + result.stderr


def site_data(store: Path, split: Path, site: str, folder: Path) -> tuple[Path, Path]:
    """Site ``site``'s own data only: its store folder and its rows of the split."""
    import pandas as pd

    from fedmedbench.data.store import write_split_csv

    shutil.copytree(store / site, folder / "store" / site)
    rows = pd.read_csv(split)
    write_split_csv(rows[rows["client"] == site].reset_index(drop=True), folder / "split.csv")
    return folder / "store", folder / "split.csv"


def test_the_page_parses_into_its_roles_and_the_substitutions_leave_no_example_address_or_path(tmp_path):
    blocks = page_blocks()
    for role, (_lang, body) in blocks.items():
        text = script(body, substitutions(tmp_path, 1, "HK", 2))
        for example in (
            "link.example.org:",
            "/var/lib/",
            "/data/fedmedbench",
            '"/srv/',
            "/etc/fedmedbench",
            "sudo",
            "BIDMC",
            "9093",
            "9094",
        ):
            assert example not in text, f"{role}: {example} left in\n{text}"
    assert (
        "make_tls_files('certificates', hosts=['link.example.org'])" in blocks["certificates"][1]
    )  # the certificate as printed


@pytest.mark.slow
@pytest.mark.federation
def test_the_deployment_as_the_page_prints_it_equals_the_engine(tmp_path):
    blocks = page_blocks()
    store, split = write_tiny_task(tmp_path / "data", clients=SITES, n=(12, 10))
    cfg = tiny_run_config(store, split, "fedavg", clients=SITES, rounds=2)
    run_training(cfg, tmp_path / "engine", threads=1, progress=False)  # what `fedmedbench train` runs
    link, operator = tmp_path / "link", tmp_path / "operator"
    folders = {site: tmp_path / f"site-{site}" for site in SITES}
    for folder in (link, operator, operator / "etc", *folders.values()):
        folder.mkdir(parents=True)
    for site, folder in folders.items():
        site_data(store, split, site, folder / "data")
    shutil.copytree(REPO / "flower-app", operator / "flower-app")  # the operator's checkout
    bin_dir = str(Path(sys.executable).parent)
    base = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "USER": getpass.getuser(), "FLWR_TELEMETRY_ENABLED": "0",
            "COLUMNS": "250",  # Flower's tables (flwr ls) unabridged
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p)}  # fmt: skip
    link_port = free_port()
    with process_guard(base) as marker:

        def env(folder: Path) -> dict:
            return {**base, "FLWR_HOME": str(folder / "flwr-home")}  # each machine its own Flower home

        def subs(site: str = "BIDMC", node_port: int = 0) -> list[tuple[str, str]]:
            return substitutions(tmp_path, link_port, site, node_port)

        # On the SuperLink's machine: the trial certificates, then the SuperLink.
        run(script(blocks["certificates"][1], subs()), link, env(link))
        superlink = spawn(
            ["bash", "-euo", "pipefail", "-c", script(blocks["superlink"][1], subs())],
            env=env(link),
            cwd=link,
            log=link / "superlink.log",
        )
        # Meanwhile each site makes its key pair; ca.crt goes to every site and to the operator, each public key to the operator.
        (operator / "keys").mkdir()
        for site, folder in folders.items():
            run(script(blocks["site key"][1], subs(site)), folder, env(folder))
            shutil.copy(link / "certificates" / "ca.crt", folder / "ca.crt")
            shutil.copy(folder / "keys" / f"{site}.pub", operator / "keys" / f"{site}.pub")
        shutil.copy(link / "certificates" / "ca.crt", operator / "etc" / "ca.crt")
        wait_for_port(link_port, superlink, link / "superlink.log", timeout=300)
        # The operator: the connection, each site's key registered.
        connection = operator / "flwr-home" / "config.toml"
        connection.parent.mkdir()
        connection.write_text(script(blocks["connection"][1], subs()))
        for site in SITES:
            run(script(blocks["register"][1], subs(site)), operator, env(operator))
        # Each site's SuperNode, with its own data.
        nodes = {}
        for site, folder in folders.items():
            node_port = free_port()
            nodes[site] = spawn(["bash", "-euo", "pipefail", "-c", script(blocks["supernode"][1], subs(site, node_port))], env=env(folder), cwd=folder,
                                log=folder / "supernode.log")  # fmt: skip
            nodes[site].port = node_port
        for site, node in nodes.items():
            wait_for_port(node.port, node, folders[site] / "supernode.log", timeout=300)
        # The run config on the SuperLink's machine, as step 1 says: a run folder's run_config.json.
        out = link / "srv" / "results" / "prostate" / "fedavg" / "seed0"
        target = Path(re.search(r'run-config="([^"]+)"', script(blocks["run"][1], subs())).group(1))
        target.parent.mkdir(parents=True)
        shutil.copy(tmp_path / "engine" / "run_config.json", target)
        streamed = run(script(blocks["run"][1], subs()), operator, env(operator), timeout=1500)
        assert (out / "final.json").is_file(), f"{streamed[-4000:]}\n{(link / 'superlink.log').read_text()[-3000:]}"
        runs = run(script(blocks["ls"][1], subs()), operator, env(operator))
        assert "finished:completed" in runs, runs[-2000:]
    # Every process the blocks started has ended with the guard.
    assert marked_processes(marker) == []
    # The terminal showed a line per round, as `fedmedbench train` does.
    for round_index in (1, 2):
        assert re.search(rf"tiny/fedavg/seed0: {round_index}/2 round", streamed), streamed[-3000:]
    for name in OUTPUTS:
        assert filecmp.cmp(tmp_path / "engine" / name, out / name, shallow=False), f"{name} differs from the engine's"
    traffic = json.loads((out / "federation.json").read_text())
    assert traffic["sites"] == 2 and traffic["resumed_after"] == []
    # Each site read its own data only: the digests are of its own folder.
    for site, folder in folders.items():
        assert sorted(p.name for p in (folder / "data" / "store").iterdir()) == [site]
        assert traffic["data_digests"][site] == data_digest(
            folder / "data" / "store", folder / "data" / "split.csv", [site]
        )
