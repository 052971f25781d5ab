"""A method hook that never returns: SIGTERM or Ctrl-C print one line naming the method,
the hook, the round and the client that was running, and ``hook_timeout_s`` (off by default) ends
it with the same line. The stuck hook is a user's plug-in, defined here, that even swallows
exceptions (``except Exception``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedmedbench import cli
from fedmedbench.errors import HookStopped
from fedmedbench.fl import engine
from fedmedbench.fl.hookwatch import running, watching
from fedmedbench.registry import forget
from tests.conftest import install_lab_plugin, tiny_run_config

ROOT = Path(__file__).resolve().parents[1]
STUCKFED = '''
"""FedAvg whose client ``client`` never returns from train in round ``round`` (it writes ``marker`` first)."""
import time
from pathlib import Path

from fedmedbench.fl.client import Client as BaseClient
from fedmedbench.fl.server import Server as BaseServer

DEFAULTS = {"marker": "", "round": 2, "client": "B"}
PERSONALIZED = False


class Client(BaseClient):
    def train(self, epochs):
        if self.round_index == self.params["round"] and self.name == self.params["client"]:
            Path(self.params["marker"]).write_text("stuck")
            give_up = time.monotonic() + 240  # a test that fails does not hang for ever
            while time.monotonic() < give_up:
                try:
                    time.sleep(0.05)
                except Exception:  # a careless retry loop: swallows what it can
                    pass
            raise RuntimeError("nothing stopped this hook")
        return super().train(epochs)


class Server(BaseServer):
    pass
'''


@pytest.fixture()
def stuckfed(tmp_path, monkeypatch):
    yield install_lab_plugin(tmp_path / "plugins", monkeypatch, "stuckfed", STUCKFED)
    forget()


def stuck_config(tiny_task, marker: Path, round_index: int = 2, client: str = "B") -> dict:
    store, split = tiny_task
    params = {"marker": str(marker), "round": round_index, "client": client}
    return tiny_run_config(store, split, "stuckfed", method_module="my_lab.stuckfed", method_params=params, rounds=3)


LINE = "method 'stuckfed', Client.train, round 2, client 'B'"


@pytest.mark.slow  # a training process of its own: torch's import and two tiny rounds, 15-30 s on a busy machine
@pytest.mark.parametrize(
    ("sig", "said", "code"), [(signal.SIGTERM, "SIGTERM", 143), (signal.SIGINT, "Ctrl-C (SIGINT)", 130)]
)
def test_a_signal_while_a_hook_is_stuck_names_method_hook_round_and_client(
    tmp_path, tiny_task, stuckfed, sig, said, code
):
    marker = tmp_path / "stuck"
    cfg = stuck_config(tiny_task, marker)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(stuckfed), str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    argv = [
        sys.executable,
        "-m",
        "fedmedbench",
        "train",
        "--run-config",
        json.dumps(cfg),
        "--out",
        str(tmp_path / "run"),
        "--threads",
        "1",
        "--no-progress",
        "--device",
        "cpu",
    ]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), process.communicate(timeout=60)
        process.send_signal(sig)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    # was: SIGTERM ended it without a word (exit -15); Ctrl-C printed a traceback ending in time.sleep
    assert process.returncode == code, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.endswith(f"ERROR fedmedbench: {LINE}: stopped by {said} while this hook was running"), err[-3000:]
    assert "Traceback" not in err
    assert (tmp_path / "run" / "checkpoint.pt").exists() and not (
        tmp_path / "run" / "final.json"
    ).exists()  # the next run resumes


def test_sigterm_in_this_process_names_the_stuck_hook(tmp_path, tiny_task, stuckfed):
    marker = tmp_path / "stuck"
    cfg = stuck_config(tiny_task, marker, round_index=1, client="A")

    def terminate_when_stuck():
        while not marker.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_stuck, daemon=True).start()
    with pytest.raises(HookStopped) as caught, watching():
        engine.run_training(cfg, tmp_path / "run", threads=1, progress=False)
    assert (
        str(caught.value)
        == "method 'stuckfed', Client.train, round 1, client 'A': stopped by SIGTERM while this hook was running"
    )
    assert caught.value.code == 143 and running() is None


def test_hook_timeout_ends_a_stuck_hook_with_the_same_line(tmp_path, tiny_task, stuckfed):
    cfg = stuck_config(
        tiny_task, tmp_path / "stuck", round_index=1, client="A"
    )  # the first Client.train: stuck at once
    before = signal.getsignal(signal.SIGTERM)  # whatever this worker's earlier tests left (Ray installs one)
    started = time.monotonic()
    with pytest.raises(HookStopped) as caught, watching(timeout_s=2.5):
        engine.run_training(cfg, tmp_path / "run", threads=1, progress=False)
    assert str(caught.value) == (
        "method 'stuckfed', Client.train, round 1, client 'A': stopped after hook_timeout_s = 2.5 s: the hook had not returned "
        "(a loop that never ends, or a wait on something that never comes?)"
    )
    assert caught.value.code == 1 and time.monotonic() - started < 60
    assert running() is None and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back


def test_hook_timeout_is_off_by_default_and_a_bad_value_is_one_line(tmp_path, capsys):
    assert cli.build_parser().parse_args(["train", "--out", "x"]).hook_timeout_s is None
    for value in ("-1", "nan", "inf"):
        code = cli.main(["train", "--run-config", "{}", "--out", str(tmp_path / "run"), "--hook-timeout-s", value])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(lines) == 1, lines
        assert lines[0].endswith(
            f"ConfigError: --hook-timeout-s: expected a number of seconds > 0 (0: no limit), got {float(value)}"
        )


def test_the_tasks_hook_timeout_s_is_checked_and_reaches_the_training_job_as_a_resource(tmp_path):
    from fedmedbench.config import load_config
    from fedmedbench.errors import ConfigError
    from tests.tiny import CONFIGFILES

    (tmp_path / "bad.yaml").write_text("tasks:\n  prostate:\n    hook_timeout_s: -1\n")
    with pytest.raises(ConfigError, match=r"tasks\.prostate\.hook_timeout_s: expected number > 0 or null, got -1"):
        load_config(str(ROOT / "config" / "config.yaml"), str(tmp_path / "bad.yaml"))
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    (tmp_path / "limit.yaml").write_text("tasks:\n  prostate:\n    hook_timeout_s: 2.5\n")
    commands = {}
    for overlay in ([], [str(tmp_path / "limit.yaml")]):
        cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(ROOT / "workflow" / "Snakefile"), "--directory", str(tmp_path), "-n", "-p", "--cores", "1",
               "--configfile", *map(str, CONFIGFILES), *overlay]  # fmt: skip
        dry = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        assert dry.returncode == 0, dry.stderr[-2000:]
        commands[bool(overlay)] = [line for line in dry.stdout.splitlines() if "fedmedbench train " in line]
    assert commands[False] and all("--hook-timeout-s 0 " in c for c in commands[False])  # off by default
    assert all("--hook-timeout-s 2.5 " in c for c in commands[True])
    # a resource, not the run config: the jobs' run config (what their numbers depend on) is the same
    assert sorted(c.split("--out")[0] for c in commands[True]) == sorted(c.split("--out")[0] for c in commands[False])
