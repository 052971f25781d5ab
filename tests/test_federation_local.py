"""``python -m fedmedbench federation local``: the quick start of docs/federation.md, pasted as the docs
give it (on tiny settings), and every process it starts ended however it is stopped.

Every process of a run is found through /proc by a marker of the test's own in its environment
(``FMB_TEST_RUN=<uuid>``, inherited by everything the command starts, Flower's SuperExecs and app
processes included, in whatever session), never by name: other federations may run beside it.
The end-to-end runs share one results folder, so the task's data is prepared once (by the first run,
the quick start) and found up to date by the others; each run has its own seed, hence its own run
folder. Skipped where the ``flower`` extra is not installed."""

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from fedmedbench.federation.local import OUTPUTS  # noqa: E402
from fedmedbench.federation.processes import marked_processes  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "federation.md"
QUICKSTART = "## Quick start: a federation on this machine"
TEST_MARKER = "FMB_TEST_RUN"
# A stopped run is stopped in the middle: far more rounds than it gets through.
STOPPED_ROUNDS = 50
SUPEREXEC = (
    "flower-superexec"  # Flower's own processes in sessions of their own: one per SuperNode, one for the SuperLink
)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def left_after(marker: str, seconds: float = 90.0) -> list[str]:
    """The marked processes still alive once they had ``seconds`` to end (the watchdog's SIGTERM, its
    5 s of grace, its SIGKILL): [] is what every test expects."""
    deadline = time.monotonic() + seconds
    while marked_processes(marker, TEST_MARKER) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [f"{pid}: {cmdline(pid)[:200]}" for pid in marked_processes(marker, TEST_MARKER)]


def docs_command() -> list[str]:
    """The quick start's command, as docs/federation.md gives it: the one line of the section's first
    bash block that runs ``federation local`` (backslash continuations joined)."""
    text = DOCS.read_text()
    assert QUICKSTART in text, f"docs/federation.md has no section {QUICKSTART!r}"
    section = text.split(QUICKSTART, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    lines = [line for line in block.splitlines() if "federation local" in line]
    assert len(lines) == 1, block
    return shlex.split(lines[0])


def with_options(argv: list[str], **options) -> list[str]:
    """``argv`` with ``--name value`` set for each option (replacing the value the docs give)."""
    argv = list(argv)
    for name, value in options.items():
        flag = f"--{name}"
        if flag in argv:
            argv[argv.index(flag) + 1] = str(value)
        else:
            argv += [flag, str(value)]
    return argv


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("federation-local")


def start(argv: list[str], marker: str, **popen) -> subprocess.Popen:
    env = {**os.environ, TEST_MARKER: marker, "COLUMNS": "200"}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.slow
@pytest.mark.federation
def test_the_quick_start_as_the_docs_give_it_runs_and_leaves_its_files_and_no_process(results):
    argv = docs_command()
    assert argv[:5] == ["python", "-m", "fedmedbench", "federation", "local"], argv
    argv = with_options([sys.executable, *argv[1:]], rounds=1, sites=2, results=results)
    marker = uuid.uuid4().hex
    process = start(argv, marker)
    stdout, stderr = process.communicate(timeout=1500)
    assert process.returncode == 0, f"{shlex.join(argv)}\n{stdout[-3000:]}\n{stderr[-3000:]}"
    # It says where the results are, and they are there: the pipeline's run-folder files.
    out = Path(re.search(r"^results: (.*)/ \(", stdout, re.M).group(1))
    assert out.is_relative_to(results) and out.parts[-4:] == ("federation", "prostate", "fedavg", "seed0"), out
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
    final = json.loads((out / "final.json").read_text())
    assert (
        final["clients"] == ["BIDMC", "HK"]
        and final["selection"]["rounds"] == 1
        and sorted(final["test"]) == ["BIDMC", "HK"]
    )
    assert re.search(r"^prostate/fedavg/seed0: mean test dice_paper \d\.\d{4} over 2 sites", stdout, re.M), stdout
    logs = out.with_name("seed0-flower")
    for name in ("superlink.log", "supernode-BIDMC.log", "supernode-HK.log", "flwr-run.log", "snakemake.log"):
        assert (logs / name).is_file(), name
    # The docs promise these files (what the test just found).
    section = DOCS.read_text().split(QUICKSTART, 1)[1].split("\n## ", 1)[0]
    for name in (*OUTPUTS, "superlink.log", "supernode-<site>.log", "flwr-run.log"):
        assert f"`{name}`" in section, f"the quick start does not name {name}"
    # The data is where the pipeline keeps it, made by its rules.
    assert (results / "demo" / "data" / "prostate" / "harmofl" / "split.csv").is_file()
    assert left_after(marker, seconds=30) == []


def stopped_run(results: Path, seed: int, marker: str, wrap: list[str] = (), **popen) -> subprocess.Popen:
    """The quick start's command on a long run (seed ``seed``), returned once it is in the middle of
    its run: the ServerApp's process is up (so are the SuperExecs that Flower starts in sessions of
    their own)."""
    argv = with_options(
        [sys.executable, *docs_command()[1:]], rounds=STOPPED_ROUNDS, sites=2, results=results, seed=seed
    )
    process = start([*wrap, *argv], marker, **popen)
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        commands = [cmdline(pid) for pid in marked_processes(marker, TEST_MARKER)]
        if any("flwr-serverapp" in c for c in commands) and sum(SUPEREXEC in c for c in commands) >= 3:
            return process
        if process.poll() is not None:
            pytest.fail(
                f"the run ended before it was stopped ({process.returncode}):\n{process.stdout.read()[-2000:]}\n{process.stderr.read()[-3000:]}"
            )
        time.sleep(0.5)
    process.kill()
    pytest.fail("the run's ServerApp did not start within 900 s")


@pytest.mark.slow
@pytest.mark.federation
@pytest.mark.parametrize(
    "how, seed",
    [("ctrl-c", 1), ("sigterm", 2), ("timeout", 3), ("sigkill", 4)],
)
def test_however_the_command_is_stopped_no_process_of_it_is_left(results, how, seed):
    marker = uuid.uuid4().hex
    if how == "timeout":
        # GNU timeout's own expiry, brought forward: its timer is a SIGALRM (it then sends SIGTERM to
        # the command and to its process group, exactly as when the time is up, and exits 124).
        process = stopped_run(results, seed, marker, wrap=["timeout", "3600"])
        before = len(marked_processes(marker, TEST_MARKER))
        process.send_signal(signal.SIGALRM)
        expected = 124
    elif how == "ctrl-c":
        # A terminal's Ctrl-C: SIGINT to the foreground process group (the command's own).
        process = stopped_run(results, seed, marker, start_new_session=True)
        before = len(marked_processes(marker, TEST_MARKER))
        os.killpg(process.pid, signal.SIGINT)
        expected = 128 + signal.SIGINT
    elif how == "sigterm":
        process = stopped_run(results, seed, marker)
        before = len(marked_processes(marker, TEST_MARKER))
        process.terminate()
        expected = 128 + signal.SIGTERM
    else:  # its parent's cleanup never runs: the watchdog and the parent-death signal end the rest
        process = stopped_run(results, seed, marker)
        before = len(marked_processes(marker, TEST_MARKER))
        process.kill()
        expected = -signal.SIGKILL
    stdout, stderr = process.communicate(timeout=300)
    assert before >= 10, (
        before
    )  # command, watchdog, warm server, SuperLink, 2 SuperNodes, 3 SuperExecs, the ServerApp, flwr run
    assert process.returncode == expected, f"{process.returncode}\n{stderr[-3000:]}"
    if how != "sigkill":  # the command's own handler ran (timeout's SIGTERM reaches it too)
        name = "SIGINT" if how == "ctrl-c" else "SIGTERM"
        assert f"federation local: stopped by {name}; every process it started has ended" in stderr, stderr[-2000:]
    assert left_after(marker) == []


PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from fedmedbench.federation.processes import process_guard, spawn
    env = dict(os.environ)
    with process_guard(env):
        # A child in a session of its own whose own child starts yet another session: the shape of a
        # SuperLink, its SuperExec and the SuperExec's app process.
        spawn(["sh", "-c", "setsid sh -c 'sleep 1000 & wait' & wait"], env=env, cwd=os.getcwd())
        print("started", flush=True)
        time.sleep(1000)
    """
)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_guard_ends_grandchildren_in_other_sessions_when_its_process_is_killed(tmp_path):
    marker = uuid.uuid4().hex
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT],
        cwd=tmp_path,
        env={**os.environ, TEST_MARKER: marker},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 60
        while (
            not (sleepers := [pid for pid in marked_processes(marker, TEST_MARKER) if cmdline(pid) == "sleep 1000"])
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        # sleep -> its sh (a session of its own) -> the sh the guarded process spawned (another) -> the guarded process.
        shell = parent_of(parent_of(sleepers[0]))
        assert parent_of(shell) == parent.pid
        assert len({os.getsid(sleepers[0]), os.getsid(shell), os.getsid(parent.pid)}) == 3
    finally:
        parent.kill()  # however the checks above went: the guard's cleanup is what is tested
        parent.wait()
    assert left_after(marker, seconds=30) == []


@pytest.mark.parametrize(
    "options, message",
    [
        (["--sites", "9"], "--sites 9: task prostate has 6 sites (BIDMC, HK, I2CVB, ISBI, ISBI_1.5, UCL); give 1 to 6"),
        (["--rounds", "0"], "--rounds: expected a whole number >= 1, got 0"),
        (["--task", "prostat"], "unknown task 'prostat'"),
    ],
)
def test_bad_options_are_refused_in_one_line_before_anything_starts(tmp_path, options, message):
    argv = [sys.executable, "-m", "fedmedbench", "federation", "local", "--configfile", "config/config.yaml", "workflow/profiles/demo/demo.yaml",
            "--task", "prostate", "--run", "fedavg", "--results", str(tmp_path)]  # fmt: skip
    argv = with_options(argv, **{o[2:]: v for o, v in zip(options[::2], options[1::2])})
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing prepared, nothing started


def test_a_run_folder_keeps_its_run_config_which_flwr_run_reads_as_the_same_run(tmp_path, tiny_task):
    """run_config.json (every run folder: the engine's, Snakemake's jobs, a federation's) is final.json's
    config, and the ServerApp reads it as the run that was trained: the same fingerprint."""
    from fedmedbench.federation.serverapp import read_run_config
    from fedmedbench.fl.engine import run_training
    from fedmedbench.runconfig import RunConfig
    from tests.conftest import tiny_run_config

    store, split = tiny_task
    cfg = tiny_run_config(store, split, "fedprox", rounds=1)  # a method with a default the config leaves out (mu)
    cfg["method_params"] = {}
    final = run_training(cfg, tmp_path / "run", threads=1, progress=False)
    saved = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert (
        saved == final["config"] and saved["method_params"] == {"mu": 1e-2} and saved["rounds"] == 1
    )  # the default filled in
    assert (
        read_run_config(str(tmp_path / "run" / "run_config.json")).fingerprint()
        == RunConfig.from_dict(final["config"]).fingerprint()
    )


def local_args(tmp_path, **changes):
    import argparse

    values = {"config": ["config/config.yaml", "workflow/profiles/demo/demo.yaml"], "task": "prostate", "run": "fedavg", "seed": 0, "sites": 2, "rounds": 1,
              "results": str(tmp_path / "results"), "cold": False, **changes}  # fmt: skip
    return argparse.Namespace(**values)


def test_a_run_that_fails_is_told_in_one_line_with_the_servers_last_error(tmp_path, monkeypatch):
    """No final.json at the end: the line the ServerApp ended with (from the run's log) and where the logs are."""
    from fedmedbench.errors import FedmedbenchError
    from fedmedbench.federation import local

    class Federation:
        address = "127.0.0.1:1"

        def stream(self, run_config, log, echo=None):
            log.write_text(
                "INFO : Start `flwr-serverapp` process\nfedmedbench.fl.rounds.SiteError: round 1 train: site HK: its ClientApp raised an exception\nINFO : done\n"
            )
            return 0

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(local, "prepare_data", lambda *args: None)
    monkeypatch.setattr(local, "local_federation", lambda *args, **kwargs: contextlib.nullcontext(Federation()))
    with pytest.raises(FedmedbenchError) as failed:
        local._run_local(local_args(tmp_path))
    workdir = tmp_path / "results" / "demo" / "federation" / "prostate" / "fedavg" / "seed0-flower"
    assert str(failed.value) == (
        f"federation local: the run ended without {workdir.with_name('seed0')}/final.json: "
        f"fedmedbench.fl.rounds.SiteError: round 1 train: site HK: its ClientApp raised an exception; logs: {workdir}"
    )
    # What it ran: the run config it wrote, two sites, one round.
    written = json.loads((workdir.with_name("seed0") / "run_config.json").read_text())
    assert written["clients"] == ["BIDMC", "HK"] and written["rounds"] == 1 and written["client_labels"] == ["A", "B"]


def test_a_data_step_that_fails_is_told_in_one_line_with_snakemakes_error(tmp_path, monkeypatch):
    from fedmedbench.errors import FedmedbenchError
    from fedmedbench.federation import local

    def failing_snakemake(command, *, env, cwd, log=None, **popen):
        assert command[1:3] == ["--snakefile", str(REPO / "workflow" / "Snakefile")] and command[-1].endswith(
            "data/prostate/harmofl/split.csv"
        )
        return subprocess.Popen(
            [
                "sh",
                "-c",
                "echo 'Building DAG of jobs...'; echo 'Error in rule preprocess:'; echo 'Shutting down'; exit 1",
            ],
            stdout=log.open("w"),
            env=env,
        )

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(local, "spawn", failing_snakemake)
    with pytest.raises(FedmedbenchError) as failed:
        local._run_local(local_args(tmp_path))
    log = tmp_path / "results" / "demo" / "federation" / "prostate" / "fedavg" / "seed0-flower" / "snakemake.log"
    assert (
        str(failed.value)
        == f"federation local: preparing the data failed (Snakemake exited with 1): Error in rule preprocess:; its log: {log}"
    )


def test_without_flower_or_outside_the_checkout_it_says_what_to_do(tmp_path, monkeypatch):
    import importlib.util

    from fedmedbench.errors import ConfigError
    from fedmedbench.federation import local

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flwr" else real_find_spec(name, *a)
    )
    monkeypatch.chdir(REPO)
    with pytest.raises(
        ConfigError,
        match=r"^federation local: Flower is not installed; install the flower extra: pip install -e '\.\[flower\]'$",
    ):
        local._run_local(local_args(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError,
        match=r"^federation local: run it from the fedmedbench checkout \(.*\): it prepares the data with the pipeline's workflow and config/config.yaml$",
    ):
        local._run_local(local_args(tmp_path, config=[str(REPO / "config" / "config.yaml")]))
    assert not (tmp_path / "results").exists()
