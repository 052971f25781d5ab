"""benchmarks/flower_short_waits (benchmark only): the sleeps it shortens, only while its switch file
exists, only for the callers it names; and those callers still exist in the installed Flower."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "benchmarks" / "flower_short_waits"

# Runs in a fresh interpreter with the folder on PYTHONPATH: two functions compiled as if they lived
# in Flower's SuperNode module (one of the patched waits, one not), one in a module of ours.
PROBE = r"""
import json, sys, time
flower = {"__name__": "flwr.supernode.start_client_internal", "time": time}
exec("def start_client_internal(s):\n    time.sleep(s)\ndef other(s):\n    time.sleep(s)\n", flower)
import threading
pulls = {"__name__": "flwr.supercore.inflatable.inflatable_utils", "threading": threading}
exec("def pull_with_retries(s):\n    threading.Event().wait(s)\n", pulls)
ours = {"__name__": "fedmedbench.federation.serverapp", "time": time}
exec("def start_client_internal(s):\n    time.sleep(s)\n", ours)
out = {"patched": time.sleep.__module__ == "sitecustomize"}
# What each call asked the real sleep for, not a stopwatch (a loaded machine wakes a sleeper late):
# the real sleep and Event.wait below the patch (or in its place, unpatched) record and return.
import sitecustomize
asked = []
sitecustomize._real_sleep = lambda s: asked.append(s)
sitecustomize._real_event_wait = lambda self, timeout=None: asked.append(timeout)
if not out["patched"]:
    time.sleep, threading.Event.wait = sitecustomize._real_sleep, sitecustomize._real_event_wait
for name, call in (("flower_loop", flower["start_client_internal"]), ("flower_loop_again", flower["start_client_internal"]),
                   ("flower_other", flower["other"]), ("ours", ours["start_client_internal"]), ("backoff", pulls["pull_with_retries"]),
                   ("other_event", lambda s: threading.Event().wait(s)), ("tiny", lambda s: flower["start_client_internal"](0.001))):
    asked.clear(); call(0.4); out[name] = sum(asked)
print(json.dumps(out))
"""


def probe(tmp_path, switch_on: bool, with_switch_env: bool = True) -> tuple[dict, list[str]]:
    switch, log = tmp_path / "switch", tmp_path / "waits.log"
    if switch_on:
        switch.touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FMB_FLOWER_SHORT_WAITS")}
    env["PYTHONPATH"] = os.pathsep.join([str(FOLDER), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if with_switch_env:
        env.update(
            FMB_FLOWER_SHORT_WAITS_SWITCH=str(switch),
            FMB_FLOWER_SHORT_WAITS_S="0.01",
            FMB_FLOWER_SHORT_WAITS_LOG=str(log),
        )
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout), (log.read_text().splitlines() if log.exists() else [])


def test_short_only_for_the_named_flower_wait_while_the_switch_exists(tmp_path):
    times, log = probe(tmp_path, switch_on=True)
    assert times["patched"]
    assert times["flower_loop"] == 0.01 and times["flower_loop_again"] == 0.01  # 0.4 s -> 0.01 s
    assert times["flower_other"] == 0.4 and times["ours"] == 0.4  # same module, other function; ours
    assert times["tiny"] == 0.001  # the lambda calls the named function with 0.001 s: not lengthened
    assert times["backoff"] == 0.01 and times["other_event"] == 0.4  # Event.wait: Flower's object-pull backoff only
    # One line per process and wait, however often it is shortened.
    assert len(log) == 2 and "flwr.supernode.start_client_internal:start_client_internal 0.4 s -> 0.01 s" in log[0]
    assert "flwr.supercore.inflatable.inflatable_utils:pull_with_retries 0.4 s -> 0.01 s" in log[1]


def test_switch_file_absent_is_stock_and_no_env_is_no_patch(tmp_path):
    times, log = probe(tmp_path, switch_on=False)
    assert times["patched"] and times["flower_loop"] == 0.4 and times["backoff"] == 0.4 and log == []
    times, log = probe(tmp_path, switch_on=True, with_switch_env=False)
    assert not times["patched"] and times["flower_loop"] == 0.4 and log == []


def own_nodes(function):
    """The nodes of a function's body, not those of the functions defined inside it."""
    stack = list(function.body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def test_every_named_wait_is_a_sleep_in_the_installed_flower():
    """A Flower upgrade that renames or moves a wait would make the short leg silently stock."""
    if importlib.util.find_spec("flwr") is None:
        pytest.skip("flwr not installed (the flower extra)")
    spec = importlib.util.spec_from_file_location("flower_short_waits_probe", FOLDER / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # no switch in this process's environment: defines WAITS, patches nothing
    assert module.time.sleep is module._real_sleep
    for module_name, function in module.WAITS:
        source = Path(importlib.util.find_spec(module_name).origin).read_text()
        defs = [
            n
            for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function
        ]
        assert defs, f"{module_name} has no function {function}"
        # The sleep is called in the function's own body (not only in a nested def, which has its own name).
        waits = ("early_stop.wait",) if function == "pull_with_retries" else ("time.sleep", "sleep")
        own = [c for d in defs for c in own_nodes(d) if isinstance(c, ast.Call) and ast.unparse(c.func) in waits]
        assert own, f"{module_name}:{function} calls none of {waits}"


def test_step_profile_splits_a_message_into_its_segments(tmp_path):
    """One step, one site, one message, hand-made times (s): each segment is a difference of them."""
    if importlib.util.find_spec("flwr") is None:
        pytest.skip("flwr not installed (the flower extra)")
    spec = importlib.util.spec_from_file_location("bench_federation", FOLDER.parent / "bench_federation.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ev = lambda pid, where, what, t0, t1: {"pid": pid, "where": where, "what": what, "t0": t0, "t1": t1}  # noqa: E731
    events = [
        ev(1, "federation", "fedmedbench.federation.serverapp:send_and_receive", 100.0, 103.0),
        ev(2, "site-A", "flwr.supernode.start_client_internal:_pull_and_store_message", 100.1, 100.3),
        ev(2, "site-A", "flwr.supernode.start_client_internal:_push_messages", 100.3, 102.6),
        ev(3, "site-A", "flwr.supercore.superexec.plugin.base_exec_plugin:BaseExecPlugin.launch_task", 100.5, 100.55),
        ev(4, "site-A", "flwr.supernode.runtime.run_clientapp:pull_task_input", 100.8, 101.0),
        {**ev(4, "site-A", "flwr.clientapp.client_app:ClientApp.__call__", 101.1, 102.1), "kind": "train"},
        ev(4, "site-A", "fedmedbench.federation.clientapp:load_site", 101.2, 101.4),
        ev(4, "site-A", "flwr.supernode.runtime.run_clientapp:push_message", 102.1, 102.3),
        ev(4, "site-A", "flwr.supernode.runtime.run_clientapp:run_clientapp", 100.7, 104.0),
        # The run's hello (once per run, not a round's): counted as a message, not in the segments.
        ev(1, "federation", "fedmedbench.federation.serverapp:send_and_receive", 90.0, 95.0),
        ev(2, "site-A", "flwr.supernode.start_client_internal:_pull_and_store_message", 90.1, 90.2),
        ev(2, "site-A", "flwr.supernode.start_client_internal:_push_messages", 90.2, 94.0),
        ev(3, "site-A", "flwr.supercore.superexec.plugin.base_exec_plugin:BaseExecPlugin.launch_task", 90.2, 90.3),
        ev(5, "site-A", "flwr.supernode.runtime.run_clientapp:run_clientapp", 90.4, 94.5),
        {**ev(5, "site-A", "flwr.clientapp.client_app:ClientApp.__call__", 91.0, 93.0), "kind": "query.hello"},
        ev(
            9, "site-A", "flwr.supernode.runtime.run_clientapp:run_clientapp", 200.0, 201.0
        ),  # another run: outside the window
    ]
    log = tmp_path / "profile.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = bench.step_profile(log, 89.0, 150.0)
    ms = {label: round(v[0]) for label, v in out["segments"].items()}
    expected = [100, 400, 200, 300, 100, 1000, 200, 300, 1700]  # SEGMENTS in order, ms
    assert [ms[label] for label, *_ in bench.SEGMENTS] == expected
    assert (
        ms["last reply at the SuperLink -> ServerApp has all replies (its pull)"] == 700
    )  # (400 + 1000) / 2: every step
    assert (
        out["messages"] == 2
        and out["round_messages"] == 1
        and out["server_steps"] == 2
        and round(out["server_step_ms"]) == 4000
    )
    assert out["inside"] == {"load_site": (pytest.approx(200.0), 1)}


def test_the_patch_check_asks_for_the_superexec_only_where_its_poll_is_longer_than_the_short_wait(
    tmp_path, monkeypatch
):
    """A SuperExec polling every 0.1 s has nothing to cut at --short-wait-ms 100: the check must not
    refuse that run; at 20 ms it must refuse a log without the SuperExecs' lines."""
    if importlib.util.find_spec("flwr") is None:
        pytest.skip("flwr not installed (the flower extra)")
    spec = importlib.util.spec_from_file_location("bench_federation", FOLDER.parent / "bench_federation.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)  # local_federation's 0.1 s
    log = tmp_path / "waits.log"
    key = "flwr.supernode.start_client_internal:start_client_internal"
    log.write_text(
        "".join(f"flower_short_waits: pid {pid} (flower-supernode) {key} 3 s -> 0.1 s (x)\n" for pid in (11, 12))
    )
    assert bench.short_waits_applied(log, sites=2, short_s=0.1) == {key: 2}
    with pytest.raises(SystemExit, match=r"run_superexec \(0 of >= 2 processes\)"):
        bench.short_waits_applied(log, sites=2, short_s=0.02)
    with pytest.raises(SystemExit, match=r"start_client_internal \(2 of >= 3 processes\)"):
        bench.short_waits_applied(log, sites=3, short_s=0.1)
