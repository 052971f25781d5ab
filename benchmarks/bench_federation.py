"""A real Flower federation vs the engine on the same work: wall time per round and bytes per round.

    python benchmarks/bench_federation.py                       # FedAvg, PRR-FL, Fed-LWR; tiny store
    python benchmarks/bench_federation.py --methods fedavg ditto --rounds 2 --repeats 3
    python benchmarks/bench_federation.py --methods fedavg --rounds 2 --repeats 3 --flower-waits both --profile --ab
    python benchmarks/bench_federation.py --store paper-shaped --task prostate --scale 0.1 --sites 2 --methods fedavg \
        --rounds 1 --repeats 2 --flower-waits both --ab --no-paper-models --markdown benchmarks/results/DATE-federation-rounds.md

The app processes are warm (``local_federation``'s default: forked from one interpreter that has
imported torch and the methods); ``--cold`` starts Flower's fresh process per message.

``--store paper-shaped``: instead of the tiny store, the paper's store of ``--task`` made by
``benchmarks/paper_shaped_stores.py`` (the real image size, channels and per-site counts times
``--scale``; random pixels, so the run is marked synthetic) with the paper config's run of each
method on its first ``--sites`` sites: a round with the paper's model and image size.

The federation is the one ``tests/test_federation.py`` runs: one ``flower-superlink`` and one
``flower-supernode`` per site on 127.0.0.1 (``fedmedbench.federation.local``), ``flwr run`` of
``flower-app/``; the engine is ``fedmedbench.fl.engine.run_training`` with one CPU thread (what a
site uses). Both run the tiny three-site store of the tests with the tests' run config.

Per-round time: each side runs R and 2R rounds, interleaved (engine R, engine 2R, federation R,
federation 2R, per repetition, per method, on one federation start), and a round costs
``(t(2R) - t(R)) / R``: start-up (process starts, imports, the FAB, set-up messages, the final
test) cancels out. The median over repetitions is printed, with the ratio federation / engine.

With ``--ab fedavg`` (the default) the federation also runs that method with Flower's own
``Grid.send_and_receive`` (a 3 s wait between pulls of replies) in place of the ServerApp's
(``serverapp.send_and_receive``: 50 ms growing to 0.1 s), on the same federation, interleaved: an
app folder beside ``flower-app/`` whose ServerApp swaps the function back.

With ``--flower-waits short`` (or ``both``: stock and short interleaved on the same federation) the
federation also runs with Flower 1.42's hard-coded waits on a message's path cut to
``--short-wait-ms`` (the SuperNode's 3 s after an empty pull and 0.5 s steps waiting for a reply,
the SuperExec's task poll interval, Flower's ``Grid.send_and_receive``'s 3 s): a BENCHMARK-ONLY
patch, ``benchmarks/flower_short_waits/sitecustomize.py`` on the ``PYTHONPATH`` of the federation's
processes, switched on and off between runs by a file; and once more with our ServerApp's own wait
between pulls of replies (50 ms growing to 0.1 s) cut the same (``short_all``: an app folder beside
``flower-app/``, like the ``--ab`` one). It tells what of a round is Flower's waiting and what is
ours; it is never on by default and no product code imports it. The outputs must stay
byte-identical to the engine's with it too (checked on every run). With ``--profile`` (same folder,
``fmb_flower_profile.py``) every process logs the steps of each message, and each federated
2R-round run's time is split per message: SuperNode pull, SuperExec launch, fork of the warm app,
Flower's ClientApp runtime, our app (site state load/save, unpack, the work, pack), the reply's way
back, the ServerApp's steps and the time between them (``step_profile``).

Bytes per round (server -> sites and back), three figures against the floor:
- **floor**: one model each way per client (2 K x the model's state bytes), plus what the method
  adds, measured as the raw bytes (tensor bytes, 8 per number) of every payload the method exchanges
  in a round through the in-process transport (train replies, queries and answers, evaluation
  packages and scores);
- **encoded**: the same payloads as ``federation.messages.pack`` encodes them, counted as Flower
  sends them (the deflated bytes of every object of the message's object tree);
- **federation**: the real run's ``federation.json`` (each record's ``count_bytes``), differenced
  between R and 2R rounds.
Prints Markdown; numbers go to a dated file under benchmarks/results/ with the machine, commit and
command (``--markdown FILE`` writes them there, the output under that header). Refuses in one line
where the ``flower`` extra (flwr) is not installed.

**Flower's floor.** With ``--flower-waits both`` the summary splits the federation's round: Flower
1.42's fixed waits (its SuperNode sleeps 3 s after a pull that found no message and waits for its
ClientApp's reply in 0.5 s steps, ``flwr/supernode/start_client_internal.py``; a round is ``steps``
such exchanges per site, so up to ``steps`` x 3.5 s), measured as the stock round minus the round
with those waits cut to ``--short-wait-ms``; and ours, that cut round, beside the engine's.
"""

from __future__ import annotations

import argparse
import contextlib
import filecmp
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHORT_WAITS = ROOT / "benchmarks" / "flower_short_waits"  # the benchmark-only sitecustomize
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

try:
    import flwr  # noqa: F401
except ImportError:
    sys.exit("bench_federation.py: flwr is not installed; install the flower extra (pip install -e '.[flower]')")

import torch  # noqa: E402

from fedmedbench.federation.messages import pack  # noqa: E402
from fedmedbench.fl.engine import run_training  # noqa: E402
from fedmedbench.fl.rounds import InProcessTransport, serve  # noqa: E402
from fedmedbench.models import build_model  # noqa: E402
from fedmedbench.registry import merge_params  # noqa: E402
from fedmedbench.runconfig import RunConfig  # noqa: E402
from tests.conftest import tiny_run_config, write_tiny_task  # noqa: E402
from tests.in_process import in_process_sites  # noqa: E402  (the sites as the engine builds them)

PAPER_MODELS = {  # the papers' model sizes, for the codec's overhead where the model is not tiny
    "UNet32 (prostate, nuclei)": {"name": "unet", "init_features": 32, "in_channels": 3, "num_classes": 2},
    "DenseNet121 (Camelyon17)": {"name": "densenet", "num_classes": 2},
}


def raw_bytes(value) -> int:
    """What a payload holds, nothing else: tensor bytes, 8 per number, the length of a string."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(raw_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(raw_bytes(v) for v in value)
    if isinstance(value, (int, float)):
        return 8
    if isinstance(value, (str, bytes)):
        return len(value)
    return 0


def wire_bytes(value, **config) -> int:
    """The bytes Flower sends for ``pack(value, **config)``: every object of its tree, deflated."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(pack(value, **config)).values())


def state_bytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class CountingTransport(InProcessTransport):
    """The in-process transport, counting per round what the method's payloads hold (raw) and what
    Flower would carry for them (encoded), each way. ``keep`` is not counted: over Flower the kept
    models stay on the sites until the final message."""

    def __init__(self, sites):
        super().__init__(sites)
        self.rounds: dict[int, dict[str, int]] = {}

    def _add(self, round_index, way, raw, encoded):
        row = self.rounds.setdefault(round_index, {"down_raw": 0, "down_enc": 0, "up_raw": 0, "up_enc": 0})
        row[f"{way}_raw"] += raw
        row[f"{way}_enc"] += encoded

    def train(self, round_index):
        out = super().train(round_index)
        for reply, loss, rows in out:
            self._add(round_index, "down", 0, wire_bytes(None, round=round_index))
            self._add(round_index, "up", raw_bytes(reply), wire_bytes(reply, loss=loss, rows=json.dumps(rows)))
        return out

    def answer(self, round_index, queries):
        out = super().answer(round_index, queries)
        for query, answer in zip(queries, out):
            self._add(round_index, "down", raw_bytes(query), wire_bytes(query, round=round_index))
            self._add(round_index, "up", raw_bytes(answer), wire_bytes(answer))
        return out

    def evaluate(self, round_index, packages, with_test):
        out = super().evaluate(round_index, packages, with_test)
        for package, (val, test) in zip(packages, out):
            self._add(
                round_index, "down", raw_bytes(package), wire_bytes(package, round=round_index, with_test=with_test)
            )
            self._add(round_index, "up", raw_bytes({"val": val, "test": test}), wire_bytes({"val": val, "test": test}))
        return out


FLOWER_POLL_APP = """# The ServerApp of fedmedbench with Flower's own Grid.send_and_receive (its 3 s wait between pulls).
from fedmedbench.federation import serverapp


def _flower_default(grid, messages, timeout):
    return list(grid.send_and_receive(messages, timeout=timeout))


serverapp.send_and_receive = _flower_default
app = serverapp.app
"""


SHORT_POLL_APP = """# BENCHMARK ONLY: the ServerApp of fedmedbench with its own wait between pulls of replies
# (serverapp.send_and_receive: 50 ms growing to 0.1 s) cut to {short} s, for --flower-waits short|both.
import functools

from fedmedbench.federation import serverapp

serverapp.send_and_receive = functools.partial(serverapp.send_and_receive, first_wait={short}, longest_wait={short})
app = serverapp.app
"""


def flower_poll_app(folder: Path, module: str = "flowerpoll", code: str = FLOWER_POLL_APP) -> Path:
    """``flower-app/`` with the ServerApp ``code`` as ``module`` (the FAB carries the module)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "flower-app" / "pyproject.toml").read_text()
    if 'serverapp = "fedmedbench.federation.serverapp:app"' not in text:
        sys.exit(
            "bench_federation.py: flower-app/pyproject.toml no longer names fedmedbench.federation.serverapp:app; update the --ab app"
        )
    (folder / "pyproject.toml").write_text(text.replace("fedmedbench.federation.serverapp:app", f"{module}:app"))
    (folder / f"{module}.py").write_text(code)
    return folder


def short_poll_app(folder: Path, short_s: float) -> Path:
    """``flower-app/`` whose ServerApp pulls replies every ``short_s`` (the ``short_all`` variant)."""
    import inspect

    from fedmedbench.federation import serverapp

    params = inspect.signature(serverapp.send_and_receive).parameters
    if not {"first_wait", "longest_wait"} <= set(params):
        sys.exit(
            "bench_federation.py: fedmedbench.federation.serverapp.send_and_receive no longer takes first_wait/longest_wait; update SHORT_POLL_APP"
        )
    return flower_poll_app(folder, "shortpoll", SHORT_POLL_APP.format(short=short_s))


@contextlib.contextmanager
def short_waits_env(folder: Path, short_s: float, profile: bool = False):
    """``os.environ`` for a federation whose processes load the short-waits patch (stock until the
    switch file exists): ``local_federation`` copies ``os.environ`` into every process it starts.
    With ``profile``, the processes also log the steps of each message (fmb_flower_profile) to
    ``<folder>/profile.jsonl``. Yields (switch file, log file); the environment is restored after."""
    switch, log = folder / "short-waits-on", folder / "short-waits.log"
    saved = {
        k: os.environ.get(k)
        for k in (
            "PYTHONPATH",
            "FMB_FLOWER_SHORT_WAITS_SWITCH",
            "FMB_FLOWER_SHORT_WAITS_S",
            "FMB_FLOWER_SHORT_WAITS_LOG",
            "FMB_FLOWER_PROFILE_LOG",
        )
    }
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHORT_WAITS), saved["PYTHONPATH"]) if p)
    os.environ.update(
        FMB_FLOWER_SHORT_WAITS_SWITCH=str(switch),
        FMB_FLOWER_SHORT_WAITS_S=str(short_s),
        FMB_FLOWER_SHORT_WAITS_LOG=str(log),
    )
    if profile:
        os.environ["FMB_FLOWER_PROFILE_LOG"] = str(folder / "profile.jsonl")
    try:
        yield switch, log
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def set_short_waits(switch: Path | None, on: bool) -> None:
    """Flip the patch; after switching on, wait out a 3 s sleep begun under stock waits (else the
    first short run would pay it and the R-round run alone: a bias of up to 3 s / R per round)."""
    if switch is None or switch.exists() == on:
        return
    if on:
        switch.touch()
        time.sleep(3.2)
    else:
        switch.unlink()


def cell(x: float, spec: str) -> str:
    """``x`` formatted, or a dash for nan (the payloads are counted on the tiny store only)."""
    return "—" if x != x else format(x, spec)


def short_waits_applied(log: Path, sites: int, short_s: float) -> dict[str, int]:
    """{wait: processes that shortened it} from the patch's log; exits where it did not reach every
    SuperNode and SuperExec (the short row would be stock Flower under another name). A SuperExec's
    poll interval (0.1 s as ``local_federation`` sets it) at or below ``short_s`` needs no cutting."""
    pids: dict[str, set] = {}
    for line in log.read_text().splitlines() if log.is_file() else []:
        words = line.split()
        pids.setdefault(words[4], set()).add(words[2])
    applied = {key: len(p) for key, p in sorted(pids.items())}
    needed = {"flwr.supernode.start_client_internal:start_client_internal": sites}
    if float(os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.1")) > short_s:
        needed["flwr.supercore.superexec.run_superexec:run_superexec"] = sites
    missing = [
        f"{key} ({applied.get(key, 0)} of >= {n} processes)" for key, n in needed.items() if applied.get(key, 0) < n
    ]
    if missing:
        sys.exit(
            f"bench_federation.py: the short-waits patch did not reach the federation's processes: {', '.join(missing)}; its log: {log}"
        )
    return applied


# The segments of one message's way, in order: (label, later event, its end, earlier event, its end), for
# the events of one site (see step_profile). All but the last are on the message's critical path.
SEGMENTS = (
    ("ServerApp push -> the SuperNode's pull that gets it starts (its poll wait)", "pull", "t0", "step", "t0"),
    (
        "pull starts -> the SuperExec launches the app (pull, task made, the SuperExec's poll)",
        "launch",
        "t0",
        "pull",
        "t0",
    ),
    ("launch -> app process runs (launcher, fork of the warm app, Flower's entry point)", "run", "t0", "launch", "t0"),
    ("app start -> message pulled from the SuperNode (Flower's Runtime API)", "pti", "t1", "run", "t0"),
    ("message pulled -> app called (Flower: FAB install, load the ClientApp)", "call", "t0", "pti", "t1"),
    ("the app: ClientApp.__call__ (ours: load state, the step, save state, pack)", "call", "t1", "call", "t0"),
    ("app done -> reply pushed to the SuperNode (Flower's Runtime API)", "pm", "t1", "call", "t1"),
    ("reply at the SuperNode -> pushed to the SuperLink", "push", "t1", "pm", "t1"),
    ("(off the path) reply pushed -> app process exited (Flower's exit handlers)", "run", "t1", "pm", "t1"),
)
PROFILED = {  # event name (fmb_flower_profile's "what") -> short name
    "flwr.supernode.start_client_internal:_pull_and_store_message": "pull",
    "flwr.supercore.superexec.plugin.base_exec_plugin:BaseExecPlugin.launch_task": "launch",
    "flwr.supernode.runtime.run_clientapp:run_clientapp": "run",
    "flwr.supernode.runtime.run_clientapp:pull_task_input": "pti",
    "flwr.clientapp.client_app:ClientApp.__call__": "call",
    "flwr.supernode.runtime.run_clientapp:push_message": "pm",
    "flwr.supernode.start_client_internal:_push_messages": "push",
    "fedmedbench.federation.serverapp:send_and_receive": "step",
}
START_AND_END = ("hello", "setup", "resume", "final")  # messages once per run, not per round: not in the segments
INSIDE = (
    "pull_with_retries(backoff)",
    "install_from_fab",
    "load_site",
    "build_site",
    "unpack",
    "take_snapshot",
    "handle",
    "save_site",
    "reply",
)


def step_profile(log: Path, start: float, end: float) -> dict:
    """Where one federated run's time went, from the profile hooks' log (events within [start, end]):
    per message of a round (train, evaluate, keep, answer: not the once-per-run hello, setup,
    resume, final; mean ms over all sites' such messages) each segment of SEGMENTS, Flower's and our
    functions inside the app process, and the ServerApp's steps (push to last reply) and the time
    between them (its own work: aggregation, evaluation bookkeeping, files)."""
    events = (
        [e for e in map(json.loads, log.read_text().splitlines()) if start <= e["t0"] and e["t1"] <= end]
        if log.is_file()
        else []
    )
    by_site: dict[str, dict[str, list]] = {}
    inside: dict[str, list[float]] = {}
    for e in sorted(events, key=lambda e: e["t0"]):
        short = PROFILED.get(e["what"])
        if short:
            by_site.setdefault(e["where"], {}).setdefault(short, []).append(e)
        name = e["what"].rpartition(":")[2]
        if name in INSIDE:
            inside.setdefault(name, []).append(e["t1"] - e["t0"])
    steps = [e for site in by_site.values() for e in site.get("step", [])]
    out = {
        "messages": 0,
        "round_messages": 0,
        "segments": {},
        "inside": {k: (1000 * statistics.mean(v), len(v)) for k, v in inside.items()},
    }
    segments: dict[str, list[float]] = {}
    steps.sort(key=lambda e: e["t0"])
    last_reply: list[float] = []  # per step: the ServerApp's return after the last reply reached the SuperLink
    for step in steps:
        pushed = [
            e["t1"] for site in by_site.values() for e in site.get("push", []) if step["t0"] <= e["t1"] <= step["t1"]
        ]
        if pushed:
            last_reply.append(step["t1"] - max(pushed))
    for where, kinds in by_site.items():
        if not where.startswith("site-"):
            continue
        runs = kinds.get("run", [])
        out["messages"] += len(runs)
        # A SuperNode handles one message at a time: its k-th pull, SuperExec launch, app process and
        # push are the k-th message's (they overlap: the SuperExec may launch the app while the
        # SuperNode still stores the message's objects). A site whose counts differ is left out.
        if any(len(kinds.get(kind, [])) != len(runs) for kind in ("pull", "launch", "push")):
            out.setdefault("sites_left_out", []).append(where)
            continue
        for k, run in enumerate(runs):
            chain = {"run": run, "pull": kinds["pull"][k], "launch": kinds["launch"][k], "push": kinds["push"][k]}
            for kind in ("pti", "call", "pm"):  # in the app process itself
                chain[kind] = next((e for e in kinds.get(kind, []) if e["pid"] == run["pid"]), None)
            if chain["call"] and str(chain["call"].get("kind")).rpartition(".")[2] in START_AND_END:
                continue
            out["round_messages"] += 1
            chain["step"] = max(
                (e for e in steps if e["t0"] <= chain["pull"]["t0"]), key=lambda e: e["t0"], default=None
            )
            for label, late, late_at, early, early_at in SEGMENTS:
                if chain.get(late) and chain.get(early):
                    segments.setdefault(label, []).append(chain[late][late_at] - chain[early][early_at])
    if last_reply:
        segments["last reply at the SuperLink -> ServerApp has all replies (its pull)"] = last_reply
    out["segments"] = {label: (1000 * statistics.mean(v), len(v)) for label, v in segments.items()}
    steps.sort(key=lambda e: e["t0"])
    if steps:
        out["server_step_ms"] = 1000 * statistics.mean(e["t1"] - e["t0"] for e in steps)
        out["server_steps"] = len(steps)
        gaps = [b["t0"] - a["t1"] for a, b in zip(steps, steps[1:])]
        out["server_between_steps_ms"] = 1000 * statistics.mean(gaps) if gaps else 0.0
    return out


def print_profile(profiles: dict, rounds: int) -> None:
    """The mean of step_profile over repetitions, per variant, for the 2R-round runs."""
    print(
        f"\n### Where a message's time goes ({2 * rounds}-round runs; segments: mean ms per message of a round (not hello, setup, final) over all sites, "
        "then over repetitions; timed functions and ServerApp: all messages and steps of the run)\n"
    )
    variants = list(profiles)
    print("| segment | " + " | ".join(variants) + " |")
    print("|---|" + "---:|" * len(variants))
    labels = [label for label, *_ in SEGMENTS] + ["last reply at the SuperLink -> ServerApp has all replies (its pull)"]
    for label in labels:
        print(f"| {label} | " + " | ".join(f"{statistics.mean(p['segments'][label][0] for p in profiles[v] if label in p['segments']):.0f}"
                                            if any(label in p["segments"] for p in profiles[v]) else "—" for v in variants) + " |")  # fmt: skip
    for name in INSIDE:
        print(f"| timed: {name} (×calls in the run) | " + " | ".join(f"{statistics.mean(p['inside'][name][0] for p in profiles[v] if name in p['inside']):.0f} "
                                                                     f"(×{statistics.mean(p['inside'][name][1] for p in profiles[v] if name in p['inside']):.0f})"
                                                                     if any(name in p["inside"] for p in profiles[v]) else "—" for v in variants) + " |")  # fmt: skip
    for key, label in (
        ("server_step_ms", "ServerApp: one step, push -> last reply"),
        ("server_between_steps_ms", "ServerApp: between steps (its own work)"),
        ("server_steps", "ServerApp: steps in the run"),
    ):
        print(
            f"| {label} | "
            + " | ".join(
                f"{statistics.mean(p[key] for p in profiles[v] if key in p):.0f}"
                if any(key in p for p in profiles[v])
                else "—"
                for v in variants
            )
            + " |"
        )
    print(
        "| app processes (messages) in the run, of which in rounds | "
        + " | ".join(
            f"{statistics.mean(p['messages'] for p in profiles[v]):.0f}, {statistics.mean(p['round_messages'] for p in profiles[v]):.0f}"
            for v in variants
        )
        + " |"
    )


def idle_cpu(federation, seconds: float = 5.0) -> float:
    """CPU seconds per wall second that the federation's processes (SuperLink, SuperNodes, their
    SuperExecs, the warm app server) spend while no run is in progress: the cost of their polling."""
    import psutil

    def cpu() -> float:
        total = 0.0
        for process in federation.processes:
            try:
                root = psutil.Process(process.pid)
                for p in [root, *root.children(recursive=True)]:
                    times = p.cpu_times()
                    total += times.user + times.system
            except psutil.NoSuchProcess:
                continue
        return total

    before, t0 = cpu(), time.perf_counter()
    time.sleep(seconds)
    return (cpu() - before) / (time.perf_counter() - t0)


def merged(cfg: dict) -> RunConfig:
    run = RunConfig.from_dict(cfg)
    return run.replace(method_params=merge_params(run.method, run.method_params, "bench", run.method_module))


def payload_per_round(cfg: dict, out: Path) -> dict[str, float]:
    """Mean over rounds of the in-process payload bytes (raw and encoded), down and up."""
    run = merged(cfg)
    torch.set_num_threads(1)
    transport = CountingTransport(in_process_sites(run))
    serve(run, out, transport, progress=False)
    rows = list(transport.rounds.values())
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def median(values):
    return statistics.median(values) if values else float("nan")


def codec_overhead(models: dict) -> list[tuple[str, int, int, int]]:
    """(model, tensors, state bytes, encoded bytes of a FedAvg reply carrying it)."""
    rows = []
    for name, spec in models.items():
        torch.manual_seed(0)  # trained-like weights: at initialisation equal tensors (BN's ones) share one object
        state = {
            k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
            for k, v in build_model(spec).state_dict().items()
        }
        reply = {"state": state, "num_samples": 100}
        rows.append((name, len(state), state_bytes(state), wire_bytes(reply, loss=0.5, rows="[]")))
    return rows


def time_runs(
    args, federation, configs, timed, results, tmp, ab_app, short_app, switch, waits_log, sites
) -> dict[str, int]:
    """Per repetition and timed method: the engine (R, 2R rounds), then each federation variant
    (R, 2R): ``federation`` (Flower's stock waits), ``flower_poll`` (the --ab app, stock waits),
    ``short_waits`` (the benchmark-only patch on), ``short_all`` (that, and our ServerApp's own wait
    between pulls of replies as short: ``short_app``). Every federated run's outputs are compared with
    the engine's of the same repetition. Returns what the short-waits patch shortened ({wait: processes})."""
    applied: dict[str, int] = {}
    stock = args.flower_waits in ("stock", "both")
    short = args.flower_waits in ("short", "both")
    for rep in range(args.repeats):
        for method in timed:
            by_rounds = configs[method]
            for rounds, cfg in by_rounds.items():
                out = tmp / f"engine-{method}-{rounds}-{rep}"
                t0 = time.perf_counter()
                run_training(cfg, out, threads=1, progress=False)
                results[method]["engine"].setdefault(rounds, []).append(time.perf_counter() - t0)
            variants = ([("federation", ROOT / "flower-app", False)] if stock else []) + (
                [("flower_poll", ab_app, False)] if stock and method in args.ab else []
            )
            variants += [("short_waits", ROOT / "flower-app", True), ("short_all", short_app, True)] if short else []
            if rep % 2:  # every other repetition in reverse: a load that drifts during a repetition favours no variant
                variants.reverse()
            for variant, app_dir, short_waits in variants:
                set_short_waits(switch, short_waits)
                for rounds in by_rounds:
                    out = tmp / f"{variant}-{method}-{rounds}-{rep}"
                    t0, wall0 = time.perf_counter(), time.time()
                    result = federation.run(
                        {"run-config": str(tmp / f"{method}-{rounds}.json"), "out": str(out)},
                        app_dir=app_dir,
                        timeout=1800,
                    )
                    elapsed = time.perf_counter() - t0
                    if not (out / "federation.json").is_file():
                        sys.exit(
                            f"bench_federation.py: the federated {method} run ({variant}, {rounds} rounds) wrote no federation.json:\n{result.stdout[-3000:]}{result.stderr[-2000:]}"
                        )
                    results[method].setdefault(variant, {}).setdefault(rounds, []).append(elapsed)
                    if variant != "flower_poll":
                        results[method]["bytes"][rounds] = json.loads((out / "federation.json").read_text())
                        # The same numbers as the engine's (the test's check, here on every run).
                        same = all(
                            filecmp.cmp(tmp / f"engine-{method}-{rounds}-{rep}" / name, out / name, shallow=False)
                            for name in ("final.json", "history.csv", "model_best.pt")
                        )
                        results[method].setdefault(f"equal_to_engine_{variant}", []).append(same)
                    if short_waits:
                        applied.update(short_waits_applied(waits_log, sites, args.short_wait_ms / 1000))
                    if args.profile and rounds == 2 * args.rounds:
                        results[method].setdefault("profile", {}).setdefault(variant, []).append(
                            step_profile(tmp / "profile.jsonl", wall0, time.time())
                        )
            set_short_waits(switch, args.flower_waits == "short")
            line = ", ".join(
                f"{v} {results[method][v][args.rounds][-1]:.1f} / {results[method][v][2 * args.rounds][-1]:.1f} s"
                for v in ("engine", "federation", "flower_poll", "short_waits", "short_all")
                if results[method].get(v)
            )
            print(f"  repetition {rep + 1}, {method} ({args.rounds} / {2 * args.rounds} rounds): {line}", flush=True)
    # After the runs: every process has started and imported what it needs; only polling is left.
    for waits, on in (("stock", False), ("short", True)) if switch else ():
        set_short_waits(switch, on)
        results.setdefault("_idle_cpu", {})[waits] = idle_cpu(federation)
    return applied


def store_label(args) -> str:
    if args.store == "paper-shaped":
        return f"paper-shaped {args.task} store, scale {args.scale:g}, {args.sites} sites"
    return "tiny store, 3 sites"


def paper_shaped_configs(tmp: Path, args) -> tuple[Path, Path, dict]:
    """The paper-shaped store of ``args.task`` (benchmarks/paper_shaped_stores.py) and, per method, the
    paper config's run on its first ``args.sites`` sites for R and 2R rounds: {method: {rounds: cfg}}."""
    import subprocess

    from fedmedbench import config as cfgmod

    out = tmp / "paper-shaped"
    made = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "paper_shaped_stores.py"), "--out", str(out), "--tasks", args.task, "--scale", str(args.scale)],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        sys.exit(f"bench_federation.py: paper_shaped_stores.py failed: {made.stderr.strip()[-1000:]}")
    print(made.stdout.strip().splitlines()[0] if made.stdout.strip() else "", flush=True)
    config = cfgmod.load_config(ROOT / "config" / "config.yaml", out / "overlay.yaml")
    configs = {}
    for method in args.methods:
        base = cfgmod.resolve_run(config, args.task, method, 0)
        base["clients"] = base["clients"][: args.sites]
        if base.get("client_labels"):
            base["client_labels"] = base["client_labels"][: args.sites]
        base["data"]["synthetic"] = (
            True  # random pixels: the store is marked so, and a run on it must say it is not real data
        )
        configs[method] = {r: {**base, "rounds": r} for r in (args.rounds, 2 * args.rounds)}
    cfg = next(iter(configs.values()))[args.rounds]
    return Path(cfg["data"]["store"]), Path(cfg["data"]["split"]), configs


def print_floor(results: dict, timed: list, args) -> None:
    """Per round: the engine's; the federation's with Flower's stock waits; Flower's fixed waits in it
    (stock minus the round with them cut, beside the bound the source gives: steps x (3 s + 0.5 s));
    ours (the round with Flower's waits cut) and ours / the engine's."""
    r = args.rounds
    rows = [(m, results[m]) for m in timed if {"federation", "short_waits"} <= set(results[m].get("per_round", {}))]
    if not rows:
        return
    print(f"\n### Flower's floor and ours ({store_label(args)}; s per round, medians)\n")
    print(
        "| method | engine | federation (Flower 1.42 stock) | steps per site | Flower's fixed waits: measured (stock - cut) | Flower's fixed waits: bound from its source (steps × 3.5 s) | ours: federation with Flower's waits cut | ours / engine |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for method, res in rows:
        rounds, b = res["per_round"], res["bytes"]
        sites = b[2 * r].get("sites") or 1
        steps = (b[2 * r]["messages_sent"] - b[r]["messages_sent"]) / r / sites
        res["floor"] = {
            "steps": steps,
            "flower_waits": rounds["federation"] - rounds["short_waits"],
            "bound": steps * 3.5,
            "ours": rounds["short_waits"],
        }
        row = {"store": store_label(args), "method": method, "engine_s": f"{rounds['engine']:.2f}", "federation_s": f"{rounds['federation']:.2f}", "steps_per_site": f"{steps:g}",
               "flower_waits_s": f"{rounds['federation'] - rounds['short_waits']:.2f}", "flower_waits_bound_s": f"{steps * 3.5:.1f}",
               "ours_s": f"{rounds['short_waits']:.2f}", "ours_over_engine": f"{rounds['short_waits'] / rounds['engine']:.2f}"}  # fmt: skip
        print(f"| {method} | {row['engine_s']} | {row['federation_s']} | {row['steps_per_site']} | {row['flower_waits_s']} | {row['flower_waits_bound_s']} | "
              f"{row['ours_s']} | {row['ours_over_engine']}× |")  # fmt: skip
        if args.csv:
            import csv

            new = not Path(args.csv).exists()
            with open(args.csv, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(row))
                if new:
                    writer.writeheader()
                writer.writerow(row)


def markdown_header(argv: list[str]) -> str:
    """What a benchmark record must say: the machine, the commit and the exact command."""
    import platform
    import shlex
    import subprocess

    def run(*command: str) -> str:
        try:
            return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    model = next(
        (line.split(":", 1)[1].strip() for line in run("lscpu").splitlines() if line.startswith("Model name")),
        platform.processor() or "unknown",
    )
    commit = run("git", "rev-parse", "HEAD") or "unknown"
    dirty = " with uncommitted changes" if run("git", "status", "--porcelain", "--untracked-files=no") else ""
    return (f"# Federation rounds against the engine ({time.strftime('%Y-%m-%d')})\n\n"
            f"- Machine: {model}, {os.cpu_count()} CPUs (lscpu), load average {os.getloadavg()[0]:.1f} at the start\n"
            f"- Commit: {commit}{dirty}\n"
            f"- Command: `{shlex.join(['python', *argv])}`\n\n")  # fmt: skip


class Tee:
    """stdout that also keeps what is printed (``--markdown``)."""

    def __init__(self, stream):
        self.stream, self.parts = stream, []

    def write(self, text):
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def main() -> None:
    args = parse_args()
    if not args.markdown:
        return run(args)
    header, tee = markdown_header(sys.argv), Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        run(args)
    Path(args.markdown).write_text(header + "".join(tee.parts))
    print(f"written: {args.markdown}")


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--methods", nargs="+", default=["fedavg", "prrfl", "fedlwr"], help="bytes per round (in process: fast)"
    )
    parser.add_argument(
        "--timed", nargs="*", default=None, help="of these, the ones run through the real federation (default: all)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="R: each side runs R and 2R rounds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--warm",
        action="store_true",
        help="the default, kept for older commands: the app processes forked from one warm interpreter (federation/warm.py)",
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="Flower's own fresh app process for every message (local_federation(warm=False))",
    )
    parser.add_argument(
        "--store",
        choices=("tiny", "paper-shaped"),
        default="tiny",
        help="the tests' tiny store (default) or a paper-shaped one (--task, --scale, --sites)",
    )
    parser.add_argument(
        "--task", default="prostate", help="--store paper-shaped: the paper config's task (default: %(default)s)"
    )
    parser.add_argument(
        "--scale",
        type=float,
        default=0.1,
        help="--store paper-shaped: fraction of the paper's per-site counts (default: %(default)s)",
    )
    parser.add_argument(
        "--sites", type=int, default=2, help="--store paper-shaped: the task's first N sites (default: %(default)s)"
    )
    parser.add_argument(
        "--markdown", help="also write the output here, under the machine (lscpu), the commit and the exact command"
    )
    parser.add_argument(
        "--ab",
        nargs="*",
        default=["fedavg"],
        help="methods also run with Flower's own reply polling (with Flower's stock waits; not with --flower-waits short)",
    )
    parser.add_argument("--flower-waits", choices=("stock", "short", "both"), default="stock",
                        help="BENCHMARK ONLY: run the federation with Flower's stock waits, with its hard-coded waits cut to --short-wait-ms "
                             "(benchmarks/flower_short_waits), or both interleaved on one federation start")  # fmt: skip
    parser.add_argument(
        "--short-wait-ms",
        type=float,
        default=20.0,
        help="what each of Flower's hard-coded waits becomes with --flower-waits short|both",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="BENCHMARK ONLY: time the steps of each message of every federated 2R-round run (benchmarks/flower_short_waits/fmb_flower_profile.py)",
    )
    parser.add_argument(
        "--no-paper-models", action="store_true", help="skip the codec overhead at the papers' model sizes"
    )
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument(
        "--csv",
        help="append the summary 'Flower's floor and ours' here, a row per method (with --flower-waits both; the file `make docs` quotes)",
    )
    return parser.parse_args()


def run(args) -> None:
    from fedmedbench.federation.local import local_federation

    load = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} CPU(s), load average {load:.1f} at start; torch {torch.__version__}, flwr {flwr.__version__}; engine and sites 1 thread; "
        f"app processes {'cold (a fresh process per message)' if args.cold else 'warm'}; store: {store_label(args)}\n"
    )
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.store == "paper-shaped":
            store, split, configs = paper_shaped_configs(tmp, args)
        else:
            store, split = write_tiny_task(tmp / "data")
            configs = {
                m: {r: tiny_run_config(store, split, m, rounds=r) for r in (args.rounds, 2 * args.rounds)}
                for m in args.methods
            }
        timed = [m for m in args.methods if args.timed is None or m in args.timed]
        for method, by_rounds in configs.items():
            for rounds, cfg in by_rounds.items():
                (tmp / f"{method}-{rounds}.json").write_text(json.dumps(cfg))
            results[method] = {"engine": {}, "bytes": {}}
            if method in timed:
                run_training(
                    by_rounds[args.rounds], tmp / f"warm-{method}", threads=1, progress=False
                )  # imports, caches
        sites = {
            name: {"store": str(store), "split": str(split)}
            for name in configs[args.methods[0]][args.rounds]["clients"]
        }
        ab_app = flower_poll_app(tmp / "flower-app-flower-poll")
        short_s, applied = args.short_wait_ms / 1000, {}
        short_app = short_poll_app(tmp / "flower-app-short-poll", short_s)
        patched = bool(timed) and (args.flower_waits != "stock" or args.profile)
        with (
            short_waits_env(tmp, short_s, args.profile) if patched else contextlib.nullcontext((None, None)) as (
                switch,
                waits_log,
            )
        ):
            set_short_waits(switch, args.flower_waits == "short")
            started = time.perf_counter()
            with (
                local_federation(sites, tmp / "federation", warm=not args.cold)
                if timed
                else contextlib.nullcontext() as federation
            ):
                if timed:
                    waits = (
                        f"{args.flower_waits}"
                        + (
                            f" (short: {args.short_wait_ms:g} ms, benchmark-only patch)"
                            if args.flower_waits != "stock"
                            else ""
                        )
                        + ("; profiled" if args.profile else "")
                    )
                    print(
                        f"federation started in {time.perf_counter() - started:.1f} s (SuperLink + {len(sites)} SuperNodes); Flower's waits: {waits}\n"
                    )
                    applied = time_runs(
                        args, federation, configs, timed, results, tmp, ab_app, short_app, switch, waits_log, len(sites)
                    )
        for method, by_rounds in configs.items():
            # In process: R rounds more of the method's work; on a paper-shaped store federation.json's count says it.
            results[method]["payload"] = (
                payload_per_round(by_rounds[args.rounds], tmp / f"count-{method}") if args.store == "tiny" else None
            )
            model = build_model(by_rounds[args.rounds]["model"]).state_dict()
            results[method]["model_bytes"] = state_bytes(model)
            results[method]["clients"] = len(by_rounds[args.rounds]["clients"])

    r = args.rounds
    print(f"\nmachine load average at the end: {os.getloadavg()[0]:.1f}\n")
    print(
        f"### Time per round ({store_label(args)}; median of {args.repeats}; a round = (t({2 * r}) - t({r})) / {r})\n"
    )
    print(
        "| method, side | engine s/round | federation s/round | federation / engine | engine start-up s | federation start-up s | outputs byte-identical to the engine's |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    labels = {"federation": "federation (Flower's stock waits)", "flower_poll": "federation, Flower's own reply polling (3 s; stock waits)",
              "short_waits": f"federation, Flower's waits {args.short_wait_ms:g} ms (benchmark-only patch)",
              "short_all": f"federation, Flower's waits and our ServerApp's reply polling {args.short_wait_ms:g} ms (benchmark only)"}  # fmt: skip
    for method, res in results.items():
        if method not in timed:
            continue
        eng = [(b - a) / r for a, b in zip(res["engine"][r], res["engine"][2 * r])]
        eng_start = median([a - (b - a) for a, b in zip(res["engine"][r], res["engine"][2 * r])])
        res["per_round"] = {"engine": median(eng)}
        print(f"| {method}, engine | {median(eng):.2f} | — | 1.0× | {eng_start:.1f} | | |")
        for variant, label in labels.items():
            if not res.get(variant):
                continue
            fed = [(b - a) / r for a, b in zip(res[variant][r], res[variant][2 * r])]
            fed_start = median([a - (b - a) for a, b in zip(res[variant][r], res[variant][2 * r])])
            res["per_round"][variant] = median(fed)
            same = res.get(f"equal_to_engine_{variant}")
            print(f"| {method}, {label} | {median(eng):.2f} | {median(fed):.2f} | {median(fed) / median(eng):.1f}× | {eng_start:.1f} | {fed_start:.1f} | "
                  f"{('yes' if all(same) else 'NO') + f' ({len(same)} runs)' if same else ''} |")  # fmt: skip
    print_floor(results, timed, args)
    if "_idle_cpu" in results:
        print("\nThe federation idle (no run), CPU seconds per second of all its processes: "
              + ", ".join(f"Flower's {k} waits {v:.2f}" for k, v in results["_idle_cpu"].items()) + f" (of {os.cpu_count()} CPUs)")  # fmt: skip
    if applied:
        print(
            f"\nShort waits applied (processes that shortened each wait, from the patch's log): {', '.join(f'{key} in {n}' for key, n in applied.items())}."
        )
    for method, res in results.items():
        if not method.startswith("_") and res.get("profile"):
            print(f"\n{method}:", end="")
            print_profile(res["profile"], r)
    print("\n### Bytes per round (both ways, all sites) vs the floor\n")
    print(
        "| method | model (state bytes) | 2 K × model | floor: the method's payloads, raw | encoded for Flower | encoded / floor | federation.json | federation.json / floor |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for method, res in results.items():
        if method.startswith("_"):  # the run's own figures (_idle_cpu), not a method
            continue
        pay = res["payload"] or {
            "down_raw": float("nan"),
            "up_raw": float("nan"),
            "down_enc": float("nan"),
            "up_enc": float("nan"),
        }
        floor, encoded = pay["down_raw"] + pay["up_raw"], pay["down_enc"] + pay["up_enc"]
        b = res["bytes"]
        fed = (
            ((b[2 * r]["bytes_sent"] + b[2 * r]["bytes_received"]) - (b[r]["bytes_sent"] + b[r]["bytes_received"])) / r
            if b
            else float("nan")
        )
        res["bytes_per_round"] = {
            "floor": floor,
            "encoded": encoded,
            "federation": fed,
            "model_floor": 2 * res["clients"] * res["model_bytes"],
        }
        print(
            f"| {method} | {res['model_bytes']:,} | {2 * res['clients'] * res['model_bytes']:,} | {cell(floor, ',.0f')} | {cell(encoded, ',.0f')} | {cell(encoded / floor, '.3f')} | {cell(fed, ',.0f')} | {cell(fed / floor, '.3f')} |"
        )
    if not args.no_paper_models:
        print("\n### The codec at the papers' model sizes (one FedAvg reply)\n")
        print("| model | tensors | state bytes | encoded bytes | encoded / state |")
        print("|---|---:|---:|---:|---:|")
        paper = codec_overhead(PAPER_MODELS)
        for name, tensors, raw, enc in paper:
            print(f"| {name} | {tensors} | {raw:,} | {enc:,} | {enc / raw:.4f} |")
        results["_paper_models"] = [
            dict(zip(("model", "tensors", "state_bytes", "encoded_bytes"), row)) for row in paper
        ]
    if applied:
        results["_short_waits_applied"] = applied
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
