"""The deployment of docs/federation.md, its faults and what its terminal says, checked without Flower
processes (fast): one writer per run folder (the run lock of `train`, taken by `federation local` and
the ServerApp), a finished run folder left as it is, a lost node's error reply filed under its site,
the trial certificate naming the loopback the SuperLink's own SuperExec dials, a ServerApp that never
starts told with the SuperLink log's cause, Flower's Rich error box read as one line, a site refusing
data that is not the run's in its own log, and every run name the docs show resolving.
The page's commands themselves run in tests/test_federation_deployment_page.py (slow)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

flwr = pytest.importorskip("flwr")

from flwr.app import Error, Message  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedmedbench.fl import runlock  # noqa: E402
from tests.conftest import tiny_run_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
HOLDER = """
import sys, time
from fedmedbench.fl.runlock import run_folder_lock
with run_folder_lock(sys.argv[1], holder=sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""


@contextlib.contextmanager
def held(out: Path, holder: str):
    """``out``'s run lock held by another process (``holder`` written in it) for the block."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out), holder],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


# --- one run folder, one writer --------------------------------------------------------------------
def test_a_refused_writer_names_the_process_holding_the_folder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with held(out, "federation local prostate/fedavg/seed0") as holder:
        with pytest.raises(runlock.RunFolderBusy) as busy, runlock.run_folder_lock(out):
            pass
        assert str(busy.value) == (
            f"{out}: another training job is writing this run folder (process {holder.pid} (federation local prostate/fedavg/seed0) holds {out / runlock.LOCK_NAME}); "
            "wait for it to end or stop it, or give it another output folder"
        )
        # The ServerApp that `federation local` started writes under its lock (lock-owner), nobody else.
        with runlock.run_folder_lock(out, owner=holder.pid):
            pass
        assert (out / runlock.LOCK_NAME).is_file()  # still the holder's
    # The holder was SIGKILLed: its file still names it, but the kernel freed the lock: taken over.
    assert runlock.holder_of(out / runlock.LOCK_NAME) == (holder.pid, "federation local prostate/fedavg/seed0")
    with runlock.run_folder_lock(out, holder="train") as path:
        assert runlock.holder_of(path) == (os.getpid(), "train")
    assert not (out / runlock.LOCK_NAME).exists()


def local_args(tmp_path, **changes):
    import argparse

    values = {"config": ["config/config.yaml", "workflow/profiles/demo/demo.yaml"], "task": "prostate", "run": "fedavg", "seed": 0, "sites": 2, "rounds": 1,
              "results": str(tmp_path / "results"), "cold": False, "restart": False, **changes}  # fmt: skip
    return argparse.Namespace(**values)


def test_federation_local_refuses_a_second_command_for_the_same_run_before_it_starts_anything(tmp_path, monkeypatch):
    from fedmedbench.federation import local

    started = []
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(local, "prepare_data", lambda *args: started.append("data"))
    monkeypatch.setattr(local, "local_federation", lambda *args, **kwargs: started.append("federation"))
    out = tmp_path / "results" / "demo" / "federation" / "prostate" / "fedavg" / "seed0"
    out.mkdir(parents=True)
    with held(out, "federation local prostate/fedavg/seed0") as holder:
        with pytest.raises(
            runlock.RunFolderBusy,
            match=rf"^{out}: another training job is writing this run folder \(process {holder.pid} \(federation local prostate/fedavg/seed0\)",
        ):
            local._run_local(local_args(tmp_path))
    assert started == [] and not out.with_name("seed0-flower").exists()


def test_a_finished_run_says_where_its_results_are_and_does_nothing_unless_restarted(tmp_path, monkeypatch, capsys):
    from fedmedbench.federation import local

    started = []
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(local, "prepare_data", lambda *args: started.append("data"))

    class Federation:
        address = "127.0.0.1:1"

        def stream(self, settings, log, echo=None):
            started.append(settings)
            return 0

    monkeypatch.setattr(local, "local_federation", lambda *args, **kwargs: contextlib.nullcontext(Federation()))
    out = tmp_path / "results" / "demo" / "federation" / "prostate" / "fedavg" / "seed0"
    out.mkdir(parents=True)
    final = {
        "primary_metric": "dice_paper",
        "test": {"BIDMC": {"dice_paper": 0.5}, "HK": {"dice_paper": 0.7}},
        "selection": {"best_round": 1},
        "flags": {},
    }
    (out / "final.json").write_text(json.dumps(final))
    local._run_local(local_args(tmp_path))
    printed = capsys.readouterr().out
    assert (
        started == []
        and "prostate/fedavg/seed0: this run has finished already; nothing to do (--restart trains it again)" in printed
    )
    assert "mean test dice_paper 0.6000 over 2 sites" in printed and f"results: {out}/" in printed
    local._run_local(local_args(tmp_path, restart=True))
    assert (
        started[0] == "data"
        and started[1]["restart"] is True
        and started[1]["lock-owner"] == os.getpid()
        and started[1]["out"] == str(out.resolve())
    )


def test_the_serverapp_leaves_a_folder_another_run_finished_naming_both_run_ids(tmp_path):
    from fedmedbench.federation.serverapp import claim

    out = tmp_path / "run"
    out.mkdir()
    claim(out, 7, restart=False)  # an empty (or checkpointed) folder: this run's to write
    (out / "final.json").write_text("{}")
    (out / "federation.json").write_text(json.dumps({"run_id": 1234}))
    with pytest.raises(runlock.RunFolderBusy) as refused:
        claim(out, 5678, restart=False)
    assert str(refused.value) == (
        f"{out}: Flower run 1234 finished this run folder (final.json); Flower run 5678 leaves it as it is: "
        "give another out, or restart=true in --run-config to train it again"
    )
    (out / "model_best.pt").write_text("x")
    claim(out, 5678, restart=True)
    assert sorted(p.name for p in out.iterdir()) == []


# --- a lost node, named -----------------------------------------------------------------------------
class PushPullGrid:
    """A grid as Flower's: push gives each message an id; the SuperLink answers for a lost node with an
    error under its own node id (0), replying to the message it could not deliver."""

    def __init__(self, nodes):
        self.nodes, self.pending = nodes, []

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for index, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{index}-{message.metadata.dst_node_id}"
            ids.append(message.metadata.message_id)
            self.pending.append(message)
        return ids

    def pull_messages(self, ids):
        replies = []
        for message in self.pending:
            error = Message(
                Error(code=5, reason="Error: Node Unavailable - The destination node failed to report a heartbeat"),
                reply_to=message,
            )
            error.metadata.__dict__["_src_node_id"] = 0  # what Flower's SuperLink sets (SUPERLINK_NODE_ID)
            replies.append(error)
        self.pending = []
        return replies


def test_a_lost_nodes_error_reply_from_the_superlink_is_filed_under_its_site(tmp_path, tiny_task, monkeypatch):
    from fedmedbench.federation.serverapp import FlowerTransport, read_run_config
    from fedmedbench.fl.rounds import SiteError

    for key, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, key, value)
    store, split = tiny_task
    (tmp_path / "run.json").write_text(json.dumps(tiny_run_config(store, split, "fedavg", rounds=1)))
    run = read_run_config(str(tmp_path / "run.json"))
    transport = FlowerTransport.__new__(FlowerTransport)  # no hello: the sites' nodes are known
    transport.grid, transport.reply_timeout, transport.cohort_node, transport.node = (
        PushPullGrid([101, 102]),
        None,
        {},
        {"A": 101, "B": 102},
    )
    transport.fingerprint, transport.bytes_sent, transport.bytes_received, transport.messages_sent = (
        run.fingerprint(),
        0,
        0,
        0,
    )
    with pytest.raises(SiteError) as lost:
        transport._exchange("train", {101: None}, "round 2 train", round=2)
    assert str(lost.value).startswith(
        "round 2 train: site A: its SuperNode stopped sending heartbeats (killed, or cut off for over 2 heartbeat intervals); the run stops (Flower error 5: "
    )
    assert "None s" not in str(lost.value)


# --- TLS as the page makes it; a ServerApp that never starts ----------------------------------------
def test_the_trial_certificate_names_the_loopback_the_superlinks_own_superexec_dials(tmp_path):
    from cryptography import x509

    from fedmedbench.federation.credentials import make_tls_files

    files = make_tls_files(tmp_path / "certificates", hosts=["link.example.org"])  # the page's command
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["link.example.org", "localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def test_a_superlink_whose_superexec_fails_the_tls_handshake_is_told_with_its_cause(tmp_path):
    from fedmedbench.federation.local import superlink_cause

    log = tmp_path / "superlink.log"
    log.write_text(
        "INFO :      Starting Flower SuperExec\nERROR :     SSL/TLS handshake error detected.\nTraceback (most recent call last):\n"
        "httpcore.ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch, certificate is not valid for '127.0.0.1'. (_ssl.c:1006)\n"
    )
    cause = superlink_cause(log)
    assert cause.startswith(
        "its own SuperExec cannot connect to it over TLS (httpcore.ConnectError: [SSL: CERTIFICATE_VERIFY_FAILED]"
    )
    assert cause.endswith(
        "the server certificate must name 127.0.0.1 and localhost besides the address the sites dial (make_tls_files names them)"
    )


def test_flowers_error_box_is_quoted_by_its_message_not_its_border(tmp_path):
    from fedmedbench.federation.local import last_error

    log = tmp_path / "flwr-run.log"
    log.write_text(
        "INFO :      Starting logstream\n╭─ Error ─────────────────────────╮\n│ Connection to the SuperLink is  │\n│ unavailable.                    │\n╰─────────────────────────────────╯\n"
    )
    assert last_error(log) == "Error: Connection to the SuperLink is unavailable."


# --- the site's side ----------------------------------------------------------------------------------
def test_a_site_given_data_the_run_was_not_planned_on_says_so_in_its_own_log(tmp_path, tiny_task, monkeypatch, capfd):
    from flwr.app import Context, RecordDict

    from fedmedbench.federation import clientapp
    from fedmedbench.federation.messages import pack
    from fedmedbench.fl.data import data_digest

    for key, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 0)):
        monkeypatch.setattr(TaskIdentity, key, value)
    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedavg", rounds=1)
    context = Context(
        run_id=1,
        node_id=101,
        node_config={"client": "B", "store": str(store), "split": str(split), "state-dir": str(tmp_path / "B")},
        state=RecordDict(),
        run_config={},
    )
    hello = Message(pack(None, cfg=json.dumps(cfg), digests=json.dumps({"B": "0123456789abcdef"})), 101, "query.hello")
    reply = clientapp.hello(hello, context)
    digest = data_digest(store, split, ["B"])
    text = f"site B: its data digest is {digest}, the run expects 0123456789abcdef (another store or split than the run was planned on); refused"
    assert reply.content["error"]["text"] == text
    assert f"fedmedbench: refused: {text}" in capfd.readouterr().err  # the SuperNode's log
    # A site pointed at a store without its rows says so in its own log as well.
    other = {**context.node_config, "client": "D"}
    reply = clientapp.hello(
        Message(pack(None, cfg=json.dumps({**cfg, "clients": ["A", "B", "C", "D"]})), 101, "query.hello"),
        Context(run_id=1, node_id=101, node_config=other, state=RecordDict(), run_config={}),
    )
    assert "error" in reply.content and "fedmedbench: refused: site D:" in capfd.readouterr().err


# --- every run name the docs show exists ---------------------------------------------------------------
def shown_run_names() -> list[tuple[str, str, str, list[str]]]:
    """(page, task, run) for every `--run NAME` of the user's pages and every run name a `--run`
    option's text gives as an example (e.g. `fedavg-e2`). A line that names its config files
    (`--configfile A B`) is checked against them (checked in the test), others against config.yaml."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = []
    for page in pages:
        for line in page.read_text().splitlines():
            task = re.search(r"--task[ =]([a-z0-9_]+)", line)
            files = re.search(r"--configfile((?: [\w./-]+\.ya?ml)+)", line)
            for name in re.findall(r"--run[ =]([a-z][a-z0-9_.]*(?:-[a-z0-9_.]+)?)", line):
                found.append(
                    (page.name, task.group(1) if task else "prostate", name, files.group(1).split() if files else [])
                )
        # "`--run` (a method or method-variant, e.g. `fedavg-e2`)", across a line break
        for name in re.findall(
            r"`--run`[^`]*?e\.g\. `([a-z][a-z0-9_]*(?:-[a-z0-9_.]+)?)`", " ".join(page.read_text().split())
        ):
            found.append((page.name, "prostate", name, []))
    return found


def plugins_the_docs_write() -> set[str]:
    """Methods the docs create with `new-method NAME` (tests/test_extending.py runs them, installed)."""
    return {name for page in (REPO / "docs").glob("*.md") for name in re.findall(r"new-method (\w+)", page.read_text())}


def test_every_run_name_the_docs_show_exists():
    from fedmedbench import config as cfgmod

    config = cfgmod.load_config(REPO / "config" / "config.yaml")
    shown = shown_run_names()
    named = {(page, task, name) for page, task, name, _files in shown}
    assert {("federation.md", "prostate", "fedavg"), ("federation.md", "prostate", "fedavg-e2")} <= named
    assert ("federation.md", "mysites", "myfed") in named  # your data and your plug-in
    # The --run options' own help gives examples too.
    for source in (SRC / "fedmedbench" / "federation" / "local.py", SRC / "fedmedbench" / "cli.py"):
        for text in re.findall(r'"--run".*?help="([^"]*)"', source.read_text()):
            shown += [
                (source.name, "prostate", name, [])
                for name in re.findall(r"\b([a-z]+-[a-z0-9.]+)\b", text)
                if name != "method-variant"
            ]
    plugins = plugins_the_docs_write()
    for page, task, name, files in shown:
        if name.split("-")[0] in plugins:  # a method the docs write and install first
            continue
        try:
            cfgmod.resolve_run(cfgmod.load_config(*[REPO / f for f in files]) if files else config, task, name, 0)
        except Exception as err:
            pytest.fail(f"{page} shows --run {name}, which is not a run of config/config.yaml: {err}")
