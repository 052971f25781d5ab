"""A real Flower federation vs the engine on the same work: wall time per round and bytes per round.

    python benchmarks/bench_federation.py                       # FedAvg, PRR-FL, Fed-LWR; tiny store
    python benchmarks/bench_federation.py --methods fedavg ditto --rounds 2 --repeats 3

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
(``serverapp.send_and_receive``: 50 ms growing to 0.5 s), on the same federation, interleaved: an
app folder beside ``flower-app/`` whose ServerApp swaps the function back.

Bytes per round (server -> sites and back), three figures against the floor:
- **floor**: one model each way per client (2 K x the model's state bytes), plus what the method
  adds, measured as the raw bytes (tensor bytes, 8 per number) of every payload the method exchanges
  in a round through the in-process transport (train replies, queries and answers, evaluation
  packages and scores);
- **encoded**: the same payloads as ``federation.messages.pack`` encodes them, counted as Flower
  sends them (the deflated bytes of every object of the message's object tree);
- **federation**: the real run's ``federation.json`` (each record's ``count_bytes``), differenced
  between R and 2R rounds.
Prints Markdown; numbers go to docs/performance.md with the machine named. Refuses in one line
where the ``flower`` extra (flwr) is not installed.
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
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

try:
    import flwr  # noqa: F401
except ImportError:
    sys.exit("bench_federation.py: flwr is not installed; install the flower extra (pip install -e '.[flower]')")

import torch  # noqa: E402

from fedmedbench.federation.messages import pack  # noqa: E402
from fedmedbench.fl.engine import run_training  # noqa: E402
from fedmedbench.fl.transport import InProcessTransport, in_process_sites, serve  # noqa: E402
from fedmedbench.registry import merge_params  # noqa: E402
from fedmedbench.models import build_model  # noqa: E402
from fedmedbench.runconfig import RunConfig  # noqa: E402
from tests.conftest import tiny_run_config, write_tiny_task  # noqa: E402

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
            self._add(round_index, "down", raw_bytes(package), wire_bytes(package, round=round_index, with_test=with_test))
            self._add(round_index, "up", raw_bytes({"val": val, "test": test}), wire_bytes({"val": val, "test": test}))
        return out


FLOWER_POLL_APP = """# The ServerApp of fedmedbench with Flower's own Grid.send_and_receive (its 3 s wait between pulls).
from fedmedbench.federation import serverapp


def _flower_default(grid, messages, timeout):
    return list(grid.send_and_receive(messages, timeout=timeout))


serverapp.send_and_receive = _flower_default
app = serverapp.app
"""


def flower_poll_app(folder: Path) -> Path:
    """``flower-app/`` with the ServerApp above (the FAB carries the module)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "flower-app" / "pyproject.toml").read_text()
    if 'serverapp = "fedmedbench.federation.serverapp:app"' not in text:
        sys.exit("bench_federation.py: flower-app/pyproject.toml no longer names fedmedbench.federation.serverapp:app; update the --ab app")
    (folder / "pyproject.toml").write_text(text.replace("fedmedbench.federation.serverapp:app", "flowerpoll:app"))
    (folder / "flowerpoll.py").write_text(FLOWER_POLL_APP)
    return folder


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
        state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in build_model(spec).state_dict().items()}
        reply = {"state": state, "num_samples": 100}
        rows.append((name, len(state), state_bytes(state), wire_bytes(reply, loss=0.5, rows="[]")))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["fedavg", "prrfl", "fedlwr"], help="bytes per round (in process: fast)")
    parser.add_argument("--timed", nargs="*", default=None, help="of these, the ones run through the real federation (default: all)")
    parser.add_argument("--rounds", type=int, default=2, help="R: each side runs R and 2R rounds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warm", action="store_true", help="local_federation(warm=True): the app processes forked from one warm interpreter (federation/warm.py)")
    parser.add_argument("--ab", nargs="*", default=["fedavg"], help="methods also run with Flower's own reply polling")
    parser.add_argument("--no-paper-models", action="store_true", help="skip the codec overhead at the papers' model sizes")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()
    from fedmedbench.federation.local import local_federation

    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} CPU(s), load average {load:.1f} at start; torch {torch.__version__}, flwr {flwr.__version__}; engine and sites 1 thread\n")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        store, split = write_tiny_task(tmp / "data")
        configs = {m: {r: tiny_run_config(store, split, m, rounds=r) for r in (args.rounds, 2 * args.rounds)} for m in args.methods}
        timed = [m for m in args.methods if args.timed is None or m in args.timed]
        for method, by_rounds in configs.items():
            for rounds, cfg in by_rounds.items():
                (tmp / f"{method}-{rounds}.json").write_text(json.dumps(cfg))
            results[method] = {"engine": {}, "federation": {}, "bytes": {}}
            if method in timed:
                run_training(by_rounds[args.rounds], tmp / f"warm-{method}", threads=1, progress=False)  # imports, caches
        sites = {name: {"store": str(store), "split": str(split)} for name in configs[args.methods[0]][args.rounds]["clients"]}
        ab_app = flower_poll_app(tmp / "flower-app-flower-poll")
        started = time.perf_counter()
        with local_federation(sites, tmp / "federation", **({"warm": True} if args.warm else {})) if timed else contextlib.nullcontext() as federation:
            if timed:
                print(f"federation started in {time.perf_counter() - started:.1f} s (SuperLink + {len(sites)} SuperNodes)\n")
            for rep in range(args.repeats):
                for method in timed:
                    by_rounds = configs[method]
                    for rounds, cfg in by_rounds.items():
                        out = tmp / f"engine-{method}-{rounds}-{rep}"
                        t0 = time.perf_counter()
                        run_training(cfg, out, threads=1, progress=False)
                        results[method]["engine"].setdefault(rounds, []).append(time.perf_counter() - t0)
                    variants = [("federation", ROOT / "flower-app")] + ([("flower_poll", ab_app)] if method in args.ab else [])
                    for variant, app_dir in variants:
                        for rounds in by_rounds:
                            out = tmp / f"{variant}-{method}-{rounds}-{rep}"
                            t0 = time.perf_counter()
                            result = federation.run({"run-config": str(tmp / f"{method}-{rounds}.json"), "out": str(out)}, app_dir=app_dir, timeout=1800)
                            elapsed = time.perf_counter() - t0
                            if not (out / "federation.json").is_file():
                                sys.exit(f"bench_federation.py: the federated {method} run ({variant}, {rounds} rounds) wrote no federation.json:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
                            results[method].setdefault(variant, {}).setdefault(rounds, []).append(elapsed)
                            if variant == "federation":
                                results[method]["bytes"][rounds] = json.loads((out / "federation.json").read_text())
                                # The same numbers as the engine's (the test's check, here on every run).
                                same = all(filecmp.cmp(tmp / f"engine-{method}-{rounds}-{rep}" / name, out / name, shallow=False) for name in ("final.json", "history.csv", "model_best.pt"))
                                results[method].setdefault("equal_to_engine", []).append(same)
                    print(f"  repetition {rep + 1}, {method}: engine {results[method]['engine'][args.rounds][-1]:.1f} / {results[method]['engine'][2 * args.rounds][-1]:.1f} s, "
                          f"federation {results[method]['federation'][args.rounds][-1]:.1f} / {results[method]['federation'][2 * args.rounds][-1]:.1f} s ({args.rounds} / {2 * args.rounds} rounds)", flush=True)  # fmt: skip
        for method, by_rounds in configs.items():
            results[method]["payload"] = payload_per_round(by_rounds[args.rounds], tmp / f"count-{method}")
            model = build_model(by_rounds[args.rounds]["model"]).state_dict()
            results[method]["model_bytes"] = state_bytes(model)
            results[method]["clients"] = len(by_rounds[args.rounds]["clients"])

    r = args.rounds
    print(f"\nmachine load average at the end: {os.getloadavg()[0]:.1f}\n")
    print(f"### Time per round (tiny store, 3 sites; median of {args.repeats}; a round = (t({2 * r}) - t({r})) / {r})\n")
    print("| method | engine s/round | federation s/round | federation / engine | engine start-up s | federation start-up s | outputs byte-identical to the engine's |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for method, res in results.items():
        if method not in timed:
            continue
        eng = [(b - a) / r for a, b in zip(res["engine"][r], res["engine"][2 * r])]
        fed = [(b - a) / r for a, b in zip(res["federation"][r], res["federation"][2 * r])]
        eng_start = median([a - (b - a) for a, b in zip(res["engine"][r], res["engine"][2 * r])])
        fed_start = median([a - (b - a) for a, b in zip(res["federation"][r], res["federation"][2 * r])])
        res["per_round"] = {"engine": median(eng), "federation": median(fed)}
        print(f"| {method} | {median(eng):.2f} | {median(fed):.2f} | {median(fed) / median(eng):.1f}× | {eng_start:.1f} | {fed_start:.1f} | {'yes' if all(res['equal_to_engine']) else 'NO'} ({len(res['equal_to_engine'])} runs) |")
        if "flower_poll" in res:
            slow = [(b - a) / r for a, b in zip(res["flower_poll"][r], res["flower_poll"][2 * r])]
            slow_start = median([a - (b - a) for a, b in zip(res["flower_poll"][r], res["flower_poll"][2 * r])])
            res["per_round"]["flower_poll"] = median(slow)
            print(f"| {method}, Flower's own reply polling (3 s) | {median(eng):.2f} | {median(slow):.2f} | {median(slow) / median(eng):.1f}× | {eng_start:.1f} | {slow_start:.1f} | |")
    print("\n### Bytes per round (both ways, all sites) vs the floor\n")
    print("| method | model (state bytes) | 2 K × model | floor: the method's payloads, raw | encoded for Flower | encoded / floor | federation.json | federation.json / floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for method, res in results.items():
        pay = res["payload"]
        floor, encoded = pay["down_raw"] + pay["up_raw"], pay["down_enc"] + pay["up_enc"]
        b = res["bytes"]
        fed = ((b[2 * r]["bytes_sent"] + b[2 * r]["bytes_received"]) - (b[r]["bytes_sent"] + b[r]["bytes_received"])) / r if b else float("nan")
        res["bytes_per_round"] = {"floor": floor, "encoded": encoded, "federation": fed, "model_floor": 2 * res["clients"] * res["model_bytes"]}
        print(f"| {method} | {res['model_bytes']:,} | {2 * res['clients'] * res['model_bytes']:,} | {floor:,.0f} | {encoded:,.0f} | {encoded / floor:.3f} | {fed:,.0f} | {fed / floor:.3f} |")
    if not args.no_paper_models:
        print("\n### The codec at the papers' model sizes (one FedAvg reply)\n")
        print("| model | tensors | state bytes | encoded bytes | encoded / state |")
        print("|---|---:|---:|---:|---:|")
        paper = codec_overhead(PAPER_MODELS)
        for name, tensors, raw, enc in paper:
            print(f"| {name} | {tensors} | {raw:,} | {enc:,} | {enc / raw:.4f} |")
        results["_paper_models"] = [dict(zip(("model", "tensors", "state_bytes", "encoded_bytes"), row)) for row in paper]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
