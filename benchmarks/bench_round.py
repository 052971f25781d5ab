"""Where a round's time goes: the real engine (``fl/engine.run_training``) on any task of a config,
every phase of every round timed, exclusive of the phases inside it.

    python benchmarks/paper_shaped_stores.py --out /tmp/ps --tasks prostate
    python benchmarks/bench_round.py --config config/config.yaml /tmp/ps/overlay.yaml --task prostate --run fedavg --rounds 2
    python benchmarks/bench_round.py ... --init-features 4      # a small UNet: the costs that are not the model's
    python benchmarks/bench_round.py ... --json out.json

Nothing in the engine is changed: the phases are measured by wrapping, for the duration of the run,
the functions the engine calls (reading a batch, a training step, the model's forward, the metric,
the selection's model copies, the checkpoint ...), each wrapper a clock around the original call.
A phase's time is its own: the time of the phases it calls (a batch's read inside a training epoch,
the forward inside a step) is counted under those. On CUDA every phase boundary waits for the
device (``torch.cuda.synchronize``), so the device's work lands in the phase that queued it; this
serialises the copies with the compute and makes the round a little slower than unmeasured.

The table has one column per round and one for what happens before round 1 and after the last
(data, model, final test, outputs); ``rest of round`` is the part of a round outside every phase
(the loop's bookkeeping, history rows, the progress line).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


class Clock:
    """Exclusive time per phase path ("evaluate/forward"), per period (a round, or "outside")."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stack: list[str] = []
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.calls: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.bytes: dict[str, int] = defaultdict(int)  # bytes written per kind of file
        self.period = "before"
        self.mark = time.perf_counter()

    def _charge(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        path = "/".join(self.stack) if self.stack else "(outside phases)"
        self.seconds[self.period][path] += now - self.mark
        self.mark = now

    @contextlib.contextmanager
    def phase(self, name: str):
        self._charge()
        self.stack.append(name)
        path = "/".join(self.stack)
        self.calls[self.period][path] += 1
        try:
            yield
        finally:
            self._charge()
            self.stack.pop()

    def enter(self, name: str) -> None:
        self._charge()
        self.stack.append(name)
        self.calls[self.period]["/".join(self.stack)] += 1

    def leave(self) -> None:
        self._charge()
        self.stack.pop()

    def new_period(self, name: str) -> None:
        self._charge()
        self.period = name

    def wrap(self, owner, attr: str, name: str, generator: bool = False) -> None:
        original = getattr(owner, attr)
        clock = self
        if generator:

            @functools.wraps(original)
            def timed(*args, **kwargs):
                iterator = iter(original(*args, **kwargs))
                while True:
                    with clock.phase(name):
                        item = next(iterator, StopIteration)
                    if item is StopIteration:
                        return
                    yield item
        else:

            @functools.wraps(original)
            def timed(*args, **kwargs):
                with clock.phase(name):
                    return original(*args, **kwargs)

        setattr(owner, attr, timed)
        self.restore.append((owner, attr, original))

    restore: list = []


def instrument(clock: Clock, method_name: str, method_module: str | None) -> None:
    from fedmedbench import metrics
    from fedmedbench.fl import checkpoint, client, data, engine, evaluation, rounds, selection
    from fedmedbench.fl.history_log import HistoryLog
    from fedmedbench.registry import load_method

    method = load_method(method_name, method_module)
    clock.restore = []
    w = clock.wrap
    # Per client, per round: the global weights in (Site.evaluate receives them after aggregation).
    w(method.Client, "receive", "receive weights")
    w(rounds, "check_finite", "check finite")
    w(method.Client, "reply", "reply (state to server)")
    # Training: a batch (gather from the store, to the device, augment, to float) vs the step.
    w(data, "gather", "gather (store -> uint8 batch)")
    w(client, "train_batches", "train batch (copy, augment, float)", generator=True)
    w(method.Client, "train_step", "train step (forward, backward, optimizer)")
    # Evaluation: batches, the model's forward, the loss, the metric (Dice per sample and case).
    w(evaluation, "eval_batches", "eval batch (copy, float)", generator=True)
    for meter in {metrics.METERS[k] for k in metrics.METERS}:
        w(meter, "update", "metric update")
        w(meter, "compute", "metric compute")
    original_build_loss = evaluation.build_loss

    def timed_loss(name):
        loss = original_build_loss(name)

        def call(*args, **kwargs):
            with clock.phase("eval loss"):
                return loss(*args, **kwargs)

        return call

    evaluation.build_loss = timed_loss
    clock.restore.append((evaluation, "build_loss", original_build_loss))
    w(rounds.Site, "train", "site train")
    w(rounds.Site, "evaluate", "site evaluate")
    w(rounds, "evaluate", "evaluate split")
    # Selection: the models and predictions kept when the validation score improves.
    w(rounds.Site, "keep", "selection keep")
    w(rounds, "detached", "model copy to host")
    w(rounds, "predict_samples", "predictions (qualitative)")
    w(selection.Selection, "improved", "selection compare")
    w(selection.Selection, "record", "selection record")
    # Server: aggregation and packages.
    w(method.Server, "aggregate", "aggregate")
    w(method.Server, "package", "package")
    # Checkpoint: the selection file, the history log, the state file.
    w(engine, "save_state", "checkpoint")
    # The selection file (written when the selection changed) apart from the round's checkpoint.
    original_save = checkpoint.save

    def save_checkpoint(obj, path):
        kind = "selection file" if Path(path).name.startswith("selection-") else "checkpoint file"
        with clock.phase(f"write {kind}"):
            original_save(obj, path)
        clock.bytes[kind] += Path(path).stat().st_size

    checkpoint.save = save_checkpoint
    clock.restore.append((checkpoint, "save", original_save))
    w(HistoryLog, "append", "history log append")
    w(method.Client, "state_dict", "client state_dict")
    # After the rounds.
    w(engine, "final_test", "final test")
    w(engine, "write_outputs", "write outputs")
    w(engine, "load_clients", "open store")
    w(engine, "data_digest", "data digest")
    w(engine, "build_model", "build model")

    # The model's forward, wherever it runs (in a training step, an evaluation, the predictions):
    # hooks on the model the engine builds, which every client's deep copy carries.
    original_build_model = engine.build_model

    def build_model(model_cfg):
        model = original_build_model(model_cfg)
        model.register_forward_pre_hook(lambda module, args: clock.enter("forward"))
        model.register_forward_hook(lambda module, args, output: clock.leave())
        return model

    engine.build_model = build_model
    clock.restore.append((engine, "build_model", original_build_model))

    original_run_rounds = engine.run_rounds

    def run_rounds(cfg, server, transport_, names, selection_, history, first_round, on_round_end=None):
        clock.new_period(f"round {first_round}")

        def round_end(round_index, val, test):
            if on_round_end is not None:
                on_round_end(round_index, val, test)
            clock.new_period(f"round {round_index + 1}" if round_index < cfg.rounds else "after")

        return original_run_rounds(cfg, server, transport_, names, selection_, history, first_round, round_end)

    engine.run_rounds = run_rounds
    clock.restore.append((engine, "run_rounds", original_run_rounds))


def uninstrument(clock: Clock) -> None:
    for owner, attr, original in reversed(clock.restore):
        setattr(owner, attr, original)
    clock.restore = []


def measure(run_cfg: dict, rounds: int, device: str, threads: int | None, data_workers: int) -> Clock:
    from fedmedbench.fl.engine import run_training

    dev = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    )
    clock = Clock(dev)
    instrument(clock, run_cfg["method"], run_cfg.get("method_module"))
    try:
        with tempfile.TemporaryDirectory(prefix="bench-round-") as out:
            clock.new_period("before")
            run_training(
                {**run_cfg, "rounds": rounds},
                Path(out) / "run",
                device=device,
                threads=threads,
                progress=False,
                data_workers=data_workers,
            )
            clock.new_period("after")
    finally:
        uninstrument(clock)
    return clock


def table(clock: Clock) -> str:
    periods = [p for p in clock.seconds if p != "before"]
    periods = [
        "before",
        *sorted((p for p in periods if p.startswith("round")), key=lambda p: int(p.split()[1])),
        "after",
    ]
    periods = [p for p in periods if p in clock.seconds]
    paths = sorted({path for p in periods for path in clock.seconds[p]})
    head = "| phase (exclusive s) | " + " | ".join(periods) + " |"
    lines = [head, "|---|" + "---:|" * len(periods)]
    for path in paths:
        cells = []
        for p in periods:
            s, n = clock.seconds[p].get(path, 0.0), clock.calls[p].get(path, 0)
            cells.append(f"{s:.3f} ({n})" if n else (f"{s:.3f}" if s else "–"))
        lines.append(f"| {path} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"**{sum(clock.seconds[p].values()):.3f}**" for p in periods) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from fedmedbench import config as cfgmod

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", nargs="+", required=True, help="config file and overlays, merged in order")
    parser.add_argument("--task", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--curve-every",
        type=int,
        default=None,
        help="override curve_every (default: the config's; 0 = ~50 points per run over --rounds)",
    )
    parser.add_argument(
        "--init-features", type=int, default=None, help="a smaller UNet: isolates the costs that are not the model's"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--data-workers", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    config = cfgmod.load_config(*(Path(p) for p in args.config))
    run_cfg = cfgmod.resolve_run(config, args.task, args.run, args.seed)
    if args.init_features is not None:
        run_cfg = {**run_cfg, "model": {**run_cfg["model"], "init_features": args.init_features}}
    if args.curve_every is not None:
        run_cfg = {**run_cfg, "curve_every": args.curve_every}
    started = time.perf_counter()
    clock = measure(run_cfg, args.rounds, args.device, args.threads, args.data_workers)
    print(
        f"{args.task}/{args.run} seed {args.seed}, {args.rounds} rounds on {args.device}, model {run_cfg['model']['name']} "
        f"init_features {run_cfg['model'].get('init_features')}, {time.perf_counter() - started:.1f} s in all; (n) = calls"
    )
    print(table(clock))
    print("bytes written: " + ", ".join(f"{kind} {size / 1e6:.1f} MB" for kind, size in sorted(clock.bytes.items())))
    if args.json:
        args.json.write_text(
            json.dumps({"seconds": clock.seconds, "calls": clock.calls, "bytes": clock.bytes}, indent=1, sort_keys=True)
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
