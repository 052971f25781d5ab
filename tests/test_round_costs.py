"""Where a round's time goes (``benchmarks/bench_round.py``) and the waste it found in the engine:
the qualitative predictions gathered one batch more than they use, and a kept model was copied to
the host twice on a GPU."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from fedmedbench.data.store import write_split_csv
from tests.conftest import tiny_run_config, write_tiny_task

ROOT = Path(__file__).resolve().parents[1]


def bench_round():
    spec = importlib.util.spec_from_file_location("bench_round", ROOT / "benchmarks" / "bench_round.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_clock_charges_each_phase_its_own_time(monkeypatch):
    bench = bench_round()
    now = [10.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])
    clock = bench.Clock(torch.device("cpu"))
    clock.new_period("round 1")

    def inner():
        now[0] += 2.0

    def reads():  # a generator: the time of each item is the phase's, the consumer's is not
        for item in range(2):
            now[0] += 0.125
            yield item

    Owner = SimpleNamespace(inner=inner, reads=reads)
    clock.wrap(Owner, "inner", "inner")
    clock.wrap(Owner, "reads", "read", generator=True)
    with clock.phase("outer"):
        now[0] += 1.0
        Owner.inner()
        for _ in Owner.reads():
            now[0] += 0.5  # the consumer's work, inside "outer"
    now[0] += 0.25
    clock.new_period("after")
    assert dict(clock.seconds["round 1"]) == {
        "outer": 2.0,
        "outer/inner": 2.0,
        "outer/read": 0.25,
        "(outside phases)": 0.25,
    }
    assert dict(clock.calls["round 1"]) == {"outer": 1, "outer/inner": 1, "outer/read": 3}  # 2 items and the end
    assert sum(clock.seconds["round 1"].values()) == 4.5  # every second of the period, once
    bench.uninstrument(clock)
    assert Owner.inner is inner and Owner.reads is reads


def test_a_tiny_run_has_the_phases_and_counts_of_its_rounds(tmp_path, monkeypatch):
    """3 clients with 8, 6, 4 training samples in batches of 4: 5 steps a round; val and test (2
    samples each, test every round of a 2-round run) one batch each: 6 evaluated splits a round."""
    from fedmedbench.fl import engine, rounds

    bench = bench_round()
    store, split = write_tiny_task(tmp_path)
    cfg = tiny_run_config(store, split, rounds=2)
    originals = (engine.save_state, rounds.detached, engine.build_model)
    # The clock reads this thread's CPU time instead of the wall clock: the coverage check below then
    # does not depend on what else the machine runs (one thread: measure's threads=1, no data workers).
    monkeypatch.setattr(bench.time, "perf_counter", time.thread_time)
    started = time.perf_counter()
    clock = bench.measure(cfg, 2, "cpu", 1, 0)
    spent = time.perf_counter() - started
    monkeypatch.undo()
    assert (engine.save_state, rounds.detached, engine.build_model) == originals  # nothing left patched
    for period in ("round 1", "round 2"):
        calls = clock.calls[period]
        assert calls["site train/train step (forward, backward, optimizer)"] == 5
        assert calls["site train/train step (forward, backward, optimizer)/forward"] == 5
        assert calls["site train/train batch (copy, augment, float)/gather (store -> uint8 batch)"] == 5
        assert calls["site evaluate/evaluate split"] == 6
        assert calls["site evaluate/evaluate split/forward"] == 6
        assert calls["site evaluate/evaluate split/metric update"] == 6
        assert calls["site evaluate/receive weights"] == 3 and calls["aggregate"] == 1
        assert calls["checkpoint/write checkpoint file"] == 1
    # Round 1 always improves the selection: 3 kept models, one qualitative batch each, one selection file.
    assert (
        clock.calls["round 1"]["selection keep"] == 3
        and clock.calls["round 1"]["selection keep/predictions (qualitative)"] == 3
    )
    assert (
        clock.calls["round 1"][
            "selection keep/predictions (qualitative)/eval batch (copy, float)/gather (store -> uint8 batch)"
        ]
        == 3
    )
    assert clock.calls["round 1"]["checkpoint/write selection file"] == 1
    assert clock.bytes["checkpoint file"] > 0 and clock.bytes["selection file"] > 0
    total = sum(sum(p.values()) for p in clock.seconds.values())
    assert spent - 0.5 < total <= spent  # the periods cover the run (CPU s of this thread), each second once
    table = bench.table(clock)
    assert table.splitlines()[0] == "| phase (exclusive s) | before | round 1 | round 2 | after |"


def qualitative_task(tmp_path):
    store, split = write_tiny_task(tmp_path, clients=("A",), n=(12,))
    rows = pd.read_csv(split)
    rows["split"] = ["train"] * 4 + ["val"] * 2 + ["test"] * 6
    write_split_csv(rows, split)
    return store, split


@pytest.mark.parametrize("workers", [0, 2])
def test_qualitative_predictions_gather_only_the_batches_they_use(tmp_path, monkeypatch, workers):
    """3 predictions in batches of 2: the first two batches (4 images) are read, not the third that
    the evaluation's batches read ahead (nor more that reader threads queue)."""
    from fedmedbench.fl import data
    from fedmedbench.fl.data import BatchReader, eval_batches, load_clients
    from fedmedbench.fl.evaluation import predict_samples
    from fedmedbench.models import build_model
    from fedmedbench.runconfig import RunConfig

    store, split = qualitative_task(tmp_path)
    cfg = RunConfig.from_dict(tiny_run_config(store, split, clients=("A",), eval_batch_size=2, qualitative_samples=3))
    reader = BatchReader(workers) if workers else None
    (client,) = load_clients(store, split, ["A"], False, reader)
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    gathered = []
    original = data.gather
    monkeypatch.setattr(
        data, "gather", lambda split_, rows: gathered.append(split_.rows[rows].tolist()) or original(split_, rows)
    )
    saved = predict_samples(model, client.test, cfg, torch.device("cpu"))
    if reader is not None:
        reader.close()
    assert sorted(gathered) == [client.test.rows[:2].tolist(), client.test.rows[2:4].tolist()]
    monkeypatch.setattr(data, "gather", original)
    x = torch.cat([b[0] for b, _ in zip(eval_batches(client.test, 2, cfg.intensity_scale), range(2))])
    with torch.no_grad():
        expected = torch.cat([model(x[:2]), model(x[2:4])]).argmax(1)[:3]
    assert torch.equal(saved["pred"], expected.to(torch.uint8))
    assert saved["image"].shape == (3, 16, 16, 3) and saved["label"].shape == (3, 16, 16)


DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_model_is_copied_to_the_host_once(device):
    from torch.utils._python_dispatch import TorchDispatchMode

    from fedmedbench.fl.rounds import detached

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in ("clone", "_to_copy", "copy_", "empty_like", "empty_strided"):
                self.ops.append(name)
            return func(*args, **(kwargs or {}))

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).to(device)
    state = model.state_dict()
    with Copies() as copies:
        kept = detached(state)
    assert copies.ops.count("clone") + copies.ops.count("_to_copy") == len(state) == 7  # one copy per tensor
    for key, value in state.items():
        assert kept[key].device.type == "cpu" and not kept[key].requires_grad
        assert (
            torch.equal(kept[key], value.cpu())
            and kept[key].dtype == value.dtype
            and kept[key].stride() == value.stride()
        )
    before = kept["0.weight"].clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)  # the kept copy is the model's at keep time, not a view of it
    assert torch.equal(kept["0.weight"], before) and not torch.equal(model[0].weight.detach().cpu(), before)
