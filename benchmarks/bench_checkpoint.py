"""Checkpoints at the papers' model sizes: bytes, write time against a raw write, peak host memory,
history cost over the rounds, selection files. Before (``FMBCKPT1``: ``torch.save`` into memory,
every copy written, history inside) and after (``FMBCKPT2``, fl/state.py), measured in one run.

    python benchmarks/bench_checkpoint.py                      # prostate, camelyon17, skin (paper sizes)
    python benchmarks/bench_checkpoint.py --tasks prostate --reps 5
    python benchmarks/bench_checkpoint.py --small               # tiny models: a smoke run in seconds
    python benchmarks/bench_checkpoint.py --skip peaks history  # the write times alone (a busy machine)
    python benchmarks/bench_checkpoint.py --skip peaks history --against HEAD~1  # before/after, interleaved

The state is the engine's own, at the end of a round: config.yaml's task (model, optimizer, clients)
with FedAvg, the real ``Server``/``Client`` objects (each client took one optimizer step, so Adam or
momentum buffers exist as in a run, then received the global model), the selection of that round
and a history of the round's length. ``runfolder.save_state`` writes it as the engine does.

Numbers:
- *state*: bytes of every tensor storage the checkpoint holds (what ``torch.save`` writes);
  *unique*: each distinct content once, found independently of the checkpoint code (SHA-256 of the
  bytes of every storage); *file*: the checkpoint's size on disk.
- write times are medians over ``--reps`` interleaved repetitions of: a raw write of as many bytes
  as the new file (a buffer already in memory, written to a temporary, fsynced, renamed over the
  previous file, which is kept as ``.prev``: the checkpoint's policy, and no less), the new
  ``save_checkpoint``, the same raw write done in the checkpoint's pieces with its early writeback
  (``state._Writer``), the same raw write into a recycled file (``state._checkpoint_file``: written
  over the file two writes back, as the checkpoint writes since the fourth session: the same
  bytes, renames and fsync, the checkpoint's own file handling, so ``new / raw recycled`` is the
  checkpoint's own cost beside its bytes), a raw write of the state's bytes, the old writer. Files
  stay between repetitions, so every write replaces the one before, as in a run; each is written
  three times untimed first, so that the timed writes meet the files of a run's steady state.
- peak memory: each writer in its own process, which loaded the state from a checkpoint (no build
  peak above the state's size); the rise of ``ru_maxrss`` during the write, and of ``VmHWM`` after
  resetting the high-water mark through ``/proc/self/clear_refs`` (the same kernel counter).
- history: ``runfolder.save_state`` at round 1 and at round ``rounds`` (the history of all rounds
  before it already in the log / in memory), new vs old.
- ``--against REV``: the ``save_checkpoint`` of ``src/fedmedbench/fl/state.py`` at git revision
  ``REV`` ("before") timed in the same interleaved repetitions as the current one, and its file
  compared byte for byte with the current one's; also the median over repetitions of each
  repetition's own ratio to the raw write just before it (steadier than a ratio of medians when
  other processes come and go).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fedmedbench import config as cfgmod  # noqa: E402
from fedmedbench.files import atomic_file  # noqa: E402
from fedmedbench.fl import evaluation, runfolder  # noqa: E402
from fedmedbench.fl import state as ckpt_io  # noqa: E402
from fedmedbench.fl.seeding import client_generator, global_rng_state  # noqa: E402
from fedmedbench.fl.selection import Selection  # noqa: E402
from fedmedbench.registry import load_method  # noqa: E402
from fedmedbench.models import build_model  # noqa: E402
from fedmedbench.runconfig import RunConfig  # noqa: E402

TASKS = ("prostate", "camelyon17", "skin")
SMALL_MODELS = {
    "prostate": {"init_features": 4},
    "camelyon17": {"growth_rate": 8, "block_config": [2, 2, 2, 2], "num_init_features": 16},
    "skin": {"name": "vgg_slim"},
}


def run_config(task: str, small: bool) -> RunConfig:
    config = cfgmod.load_config(ROOT / "config" / "config.yaml")
    cfg = cfgmod.resolve_run(config, task, "fedavg", 0)
    if small:
        cfg["model"] = {**cfg["model"], **SMALL_MODELS[task]}
    return RunConfig.from_dict(cfg)


def build_state(task: str, small: bool):
    """The engine's objects at the end of round 1 of FedAvg on ``task``: server, clients (optimizer
    state present unless the task rebuilds optimizers each round), selection (every client's
    evaluated model selected at this round)."""
    torch.manual_seed(0)
    cfg = run_config(task, small)
    method = load_method(cfg.method, cfg.method_module)
    model = build_model(cfg.model)
    server = method.Server(cfg, model, len(cfg.clients))
    clients = []
    for i, name in enumerate(cfg.clients):
        data = SimpleNamespace(name=name, train=range(8))
        client = method.Client(cfg, i, data, copy.deepcopy(model), client_generator(0, i), torch.device("cpu"))
        client.round_index = 1
        # One optimizer step on a cheap loss: the optimizer state (Adam moments, momentum) exists
        # with its real shapes and distinct values per client, as after local training.
        client.optimizer.zero_grad(set_to_none=True)
        sum((p * (1.0 + i)).sum() for p in client.model.parameters()).backward()
        client.optimizer.step()
        client.optimizer.zero_grad(set_to_none=True)
        clients.append(client)
    for client in clients:
        client.receive(server.package(client.index, 1))
    per_client = {"auto": method.PERSONALIZED, "per_client": True, "pooled": False}[cfg.selection_scope]
    selection = Selection(list(cfg.clients), cfg.selection_metric, per_client=per_client)
    val = {n: {cfg.selection_metric: 0.5} for n in cfg.clients}
    for key, covered in selection.improved(val, 1).items():
        models = {n: {k: v.detach().cpu().clone() for k, v in clients[cfg.clients.index(n)].eval_model().state_dict().items()} for n in covered}
        selection.record(key, 1, val, models, {n: {} for n in covered})
    return cfg, server, clients, selection


def checkpoint_object(server, clients, selection, history=None) -> dict:
    """What ``runfolder.save_state`` checkpoints (the old format also held the history)."""
    state = {"config_hash": "x", "data_digest": "y", "round": 1, "server": server.state_dict(), "clients": [c.state_dict() for c in clients], "selection": selection.state_dict(), "rng": global_rng_state()}
    if history is not None:
        state["history"] = history
    return state


def history_rows(cfg: RunConfig, rounds: int) -> list[dict]:
    """The rows a run of ``rounds`` rounds logs: per client the training loss, the validation
    scores every round and the test scores every ``curve_every`` rounds (values are random floats)."""
    gen = torch.Generator().manual_seed(1)
    metrics = ["dice_paper", "dice_fg", "loss"] if cfg.kind == "segmentation" else ["accuracy", "loss", "f1_macro", "auc_macro"]
    rows = []
    for r in range(1, rounds + 1):
        for c in cfg.clients:
            rows.append({"round": r, "client": c, "split": "train", "metric": "loss", "value": torch.rand(1, generator=gen).item()})
            for split in ("val", "test") if r % evaluation.curve_every(cfg) == 0 else ("val",):
                rows += [{"round": r, "client": c, "split": split, "metric": m, "value": torch.rand(1, generator=gen).item()} for m in metrics]
    return rows


def tensors_of(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tensors_of(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from tensors_of(v)


def storage_bytes(tree) -> tuple[int, int]:
    """(bytes of all distinct storages, bytes of all distinct contents): the second by SHA-256."""
    storages = {}
    for t in tensors_of(tree):
        s = t.untyped_storage()
        storages[(s.data_ptr(), s.nbytes())] = s
    digests = {}
    for s in storages.values():
        data = torch.empty(0, dtype=torch.uint8).set_(s).numpy()
        digests[hashlib.sha256(data).digest()] = s.nbytes()
    return sum(s.nbytes() for s in storages.values()), sum(digests.values())


def distinct_models(selection) -> tuple[int, int]:
    """(models in the selection, distinct ones), models compared by the SHA-256 of all their tensors."""
    models = selection.merged("models")
    keys = {hashlib.sha256(b"".join(hashlib.sha256(torch.empty(0, dtype=torch.uint8).set_(v.contiguous().untyped_storage()).numpy()).digest() for v in m.values())).digest() for m in models.values()}
    return len(models), len(keys)


def raw_write(buffer: memoryview, path: Path) -> None:
    """The floor: bytes already in memory, to a temporary, fsynced, renamed (``atomic_file``), the
    file it replaces kept as ``.prev``: the checkpoint's fsync and rename policy, one ``write``."""
    with atomic_file(path) as handle:
        handle.write(buffer)
        if path.exists():
            os.replace(path, ckpt_io.previous(path))


def raw_write_pieces(buffer: memoryview, path: Path) -> None:
    """The same, written as the checkpoint writes: ``CHUNK`` pieces through the checkpoint's own writer
    step (``state._Writer``: the disk's writeback started every ``WRITEBACK`` bytes)."""
    with atomic_file(path) as handle:
        writer = ckpt_io._Writer(handle, 0)
        for start in range(0, len(buffer), ckpt_io.CHUNK):
            writer([buffer[start : start + ckpt_io.CHUNK]])
        if path.exists():
            os.replace(path, ckpt_io.previous(path))


def raw_write_recycled(buffer: memoryview, path: Path) -> None:
    """The same bytes in one ``write``, through the checkpoint's own file handling
    (``state._checkpoint_file``: over the spare file, then the checkpoint's renames and fsync)."""
    with ckpt_io._checkpoint_file(path) as handle:
        handle.write(buffer)


def timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def cpu_timed(fn, *args) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads, user + system)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


PEAK = """
import json, resource, sys, tempfile
from pathlib import Path
sys.path.insert(0, {src!r})
from fedmedbench.fl import state
obj = state.load_checkpoint(Path({path!r}))  # the state, with no build-time peak above its size
status = lambda key: int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
ru_before, before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, status("VmRSS")
try:
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    reset = True
except OSError:
    reset = False
with tempfile.TemporaryDirectory(dir={tmp!r}) as tmp:
    getattr(state, {writer!r})(obj, Path(tmp) / "checkpoint.pt")
ru_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"resident_mib": before / 1024, "ru_rise_mib": max(0, ru_after - ru_before) / 1024, "hwm_rise_mib": (status("VmHWM") - before) / 1024 if reset else None}}))
"""


def peak_rise(state_file: Path, writer: str, tmp: Path) -> dict:
    """In a fresh process that loaded the state: how far one write raises the peak resident size,
    by ``ru_maxrss`` and by ``VmHWM`` after resetting it (``/proc/self/clear_refs``)."""
    code = PEAK.format(src=str(ROOT / "src"), path=str(state_file), tmp=str(tmp), writer=writer)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_peaks(task: str, small: bool, tmp: Path) -> dict:
    """Peak rises of both writers, each in a process started while this one holds no state: Linux
    carries a parent's resident size at fork into the child's ``ru_maxrss``."""
    state_file = tmp / "state.pt"
    build = f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import bench_checkpoint as b; cfg, s, c, sel = b.build_state({task!r}, {small}); b.ckpt_io.save_checkpoint(b.checkpoint_object(s, c, sel), b.Path({str(state_file)!r}))"
    subprocess.run([sys.executable, "-c", build], check=True)
    try:
        return {f"peak_{w}": peak_rise(state_file, f, tmp) for w, f in (("new", "save_checkpoint"), ("old", "save_checkpoint_v1"))}
    finally:
        state_file.unlink()


def state_module_at(rev: str, tmp: Path):
    """``fl/state.py`` as it was at git revision ``rev``, imported as a module of its own."""
    out = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/fedmedbench/fl/state.py"], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"--against {rev}: {out.stderr.strip()}")
    path = tmp / f"state_{rev.replace('/', '_').replace('~', '_')}.py"
    path.write_text(out.stdout)
    spec = importlib.util.spec_from_file_location("state_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_task(task: str, small: bool, reps: int, tmp: Path, peaks: dict, history: bool = True, before=None) -> dict:
    cfg, server, clients, selection = build_state(task, small)
    obj = checkpoint_object(server, clients, selection)
    model_bytes = sum(v.numel() * v.element_size() for v in clients[0].model.state_dict().values())
    state_bytes, unique_bytes = storage_bytes(obj)

    new, old = tmp / "new.pt", tmp / "old.pt"
    ckpt_io.save_checkpoint(obj, new)
    ckpt_io.save_checkpoint_v1(obj, old)
    new_size, old_size = new.stat().st_size, old.stat().st_size
    sel_new, sel_old = tmp / "sel-new.pt", tmp / "sel-old.pt"
    ckpt_io.save_checkpoint(selection.heavy_state(), sel_new)
    ckpt_io.save_checkpoint_v1(selection.heavy_state(), sel_old)
    sel_new_size, sel_old_size = sel_new.stat().st_size, sel_old.stat().st_size
    n_models, n_distinct = distinct_models(selection)
    same_as_before = None
    if before is not None:
        before.save_checkpoint(obj, tmp / "before.pt")
        same_as_before = (tmp / "before.pt").read_bytes() == new.read_bytes()
        (tmp / "before.pt").unlink()
    for path in (new, old, sel_new, sel_old):
        path.unlink()

    # Interleaved, so load from other processes hits every variant alike. Files are kept between
    # repetitions, so each write replaces the previous one and keeps it as ``.prev``, as in a run.
    buffer = memoryview(torch.randint(0, 256, (max(state_bytes, new_size),), dtype=torch.uint8).numpy())
    times = {"raw_file": [], "raw_pieces": [], "raw_recycled": [], "new": [], "raw_state": [], "old": [], "dedup_pass": [], "raw_file_cpu": [], "raw_pieces_cpu": [], "raw_recycled_cpu": [], "new_cpu": [], "before": [], "before_cpu": []}
    variants = (("raw_file", raw_write, (buffer[:new_size], tmp / "raw.bin")), ("new", ckpt_io.save_checkpoint, (obj, tmp / "checkpoint.pt")), ("raw_pieces", raw_write_pieces, (buffer[:new_size], tmp / "pieces.bin")), ("raw_recycled", raw_write_recycled, (buffer[:new_size], tmp / "recycled.bin")))
    if before is not None:
        variants += (("before", before.save_checkpoint, (obj, tmp / "before.pt")),)
    # Three untimed writes of each first: every timed one then finds the files a run has from its
    # fourth checkpoint on (the previous file, its .prev, and for the recycling legs the spare).
    for _ in range(3):
        for _key, fn, args in variants:
            fn(*args)
    loads = [os.getloadavg()[0]]
    for _ in range(reps):
        for key, fn, args in variants:
            wall, cpu = cpu_timed(fn, *args)
            times[key].append(wall)
            times[f"{key}_cpu"].append(cpu)
        times["raw_state"].append(timed(raw_write, buffer[:state_bytes], tmp / "raw-state.bin"))
        times["old"].append(timed(ckpt_io.save_checkpoint_v1, obj, tmp / "old.pt"))
        times["dedup_pass"].append(timed(lambda: ckpt_io._Packer(ckpt_io._Blobs()).pack(obj)))
    loads.append(os.getloadavg()[0])
    for path in tmp.iterdir():
        if path.suffix != ".py":
            path.unlink()  # the spares too (".<name>.spare.tmp")
    del buffer
    median = {k: statistics.median(v) for k, v in times.items() if v}
    # Each repetition's own ratios: the raw write and the checkpoints ran within a second of each other.
    per_rep = {f"{k}_per_rep": statistics.median(a / r for a, r in zip(times[k], times["raw_file"])) for k in ("new", "before") if times[k]}
    per_rep["new_per_rep_recycled"] = statistics.median(a / r for a, r in zip(times["new"], times["raw_recycled"]))

    # History: at round 1 and at the last round, with the rows of all rounds before already logged.
    # The whole save_state (the selection file already written, as in a round where it did not
    # change) and the history part alone: appending the round's rows vs pickling all of them.
    rows = history_rows(cfg, cfg.rounds)
    per_round = len(rows) // cfg.rounds
    history_times = {}
    for rounds_done in (1, cfg.rounds) if history else ():
        history = rows[: rounds_done * per_round]
        timing = {"new": [], "old": [], "new_rows": [], "old_rows": []}
        for _ in range(reps):
            out = tmp / f"run{rounds_done}"
            out.mkdir(exist_ok=True)
            ckpt_io.save_checkpoint(selection.heavy_state(), runfolder.selection_file(out, selection.version))
            log = ckpt_io.HistoryLog(runfolder.history_file(out))
            log.reset()
            log.append(history[:-per_round])
            timing["new"].append(timed(runfolder.save_state, out, out / "checkpoint.pt", rounds_done, ("x", "y"), server, clients, selection, history, selection.version, log))
            timing["old"].append(timed(ckpt_io.save_checkpoint_v1, checkpoint_object(server, clients, selection, history), out / "old.pt"))
            log.reset()
            log.append(history[:-per_round])
            timing["new_rows"].append(timed(log.append, history[-per_round:]))
            timing["old_rows"].append(timed(ckpt_io.save_checkpoint_v1, {"history": history}, out / "rows.pt"))
            shutil.rmtree(out)
        history_times[rounds_done] = {k: statistics.median(v) for k, v in timing.items()} | {"rows": len(history)}

    return {
        "task": task,
        "model": cfg.model.name,
        "clients": len(cfg.clients),
        "optimizer": cfg.optimizer.name + (" (rebuilt each round)" if cfg.reset_optimizer_each_round else ""),
        "model_bytes": model_bytes,
        "state_bytes": state_bytes,
        "unique_bytes": unique_bytes,
        "old_file": old_size,
        "new_file": new_size,
        "selection_models": n_models,
        "selection_distinct": n_distinct,
        "selection_old_file": sel_old_size,
        "selection_new_file": sel_new_size,
        "times": median | per_rep,
        "load": loads,
        "same_bytes_as_before": same_as_before,
        "history": history_times,
        "rounds": cfg.rounds,
        **peaks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="tiny models (a smoke run)")
    parser.add_argument("--dir", default=None, help="where to write (default: the system's temporary folder)")
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument("--skip", nargs="+", default=[], choices=("peaks", "history"), help="leave these tables out (on a busy machine: the write times alone)")
    parser.add_argument("--against", metavar="REV", help="also time save_checkpoint of fl/state.py at this git revision, interleaved (before/after)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    crc = "isal (ISA-L)" if ckpt_io._CRC32 is not zlib.crc32 else "zlib"
    print(f"CPU, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}; CRC32: {crc}; sizes: {'small' if args.small else 'paper'}\n")
    results = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        # Peaks first, before this process grows.
        peaks = {task: {} if "peaks" in args.skip else measure_peaks(task, args.small, Path(tmp)) for task in args.tasks}
        before = state_module_at(args.against, Path(tmp)) if args.against else None
        for task in args.tasks:
            results.append(bench_task(task, args.small, args.reps, Path(tmp), peaks[task], "history" not in args.skip, before))
            if before is not None:
                results[-1]["against"] = args.against
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def report(results: list[dict]) -> None:
    print("| task (model, K, optimizer) | model MB | state MB | unique MB | old file MB | new file MB | new / unique | old / unique |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['task']} ({r['model']}, K={r['clients']}, {r['optimizer']}) | {mb(r['model_bytes'])} | {mb(r['state_bytes'])} | {mb(r['unique_bytes'])} | {mb(r['old_file'])} | {mb(r['new_file'])} | {r['new_file'] / r['unique_bytes']:.3f} | {r['old_file'] / r['unique_bytes']:.2f} |")
    print("\n| task | selected models | distinct | model MB | old selection file MB | new selection file MB | new / (distinct x model) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['task']} | {r['selection_models']} | {r['selection_distinct']} | {mb(r['model_bytes'])} | {mb(r['selection_old_file'])} | {mb(r['selection_new_file'])} | {r['selection_new_file'] / (r['selection_distinct'] * r['model_bytes']):.3f} |")
    print("\n| task | raw write of the new file's bytes s (one write / pieces + writeback / recycled file) | new write s | new / raw, same bytes (one write / pieces / recycled) | CPU s raw / new | raw write of the state's bytes s | old write s | old / raw (same bytes) | new / raw of the state | walk + compare s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        t = r["times"]
        print(f"| {r['task']} | {t['raw_file']:.3f} / {t['raw_pieces']:.3f} / {t['raw_recycled']:.3f} | {t['new']:.3f} | {t['new'] / t['raw_file']:.2f} / {t['new'] / t['raw_pieces']:.2f} / {t['new'] / t['raw_recycled']:.2f} | {t['raw_file_cpu']:.2f} / {t['new_cpu']:.2f} | {t['raw_state']:.3f} | {t['old']:.3f} | {t['old'] / t['raw_state']:.2f} | {t['new'] / t['raw_state']:.2f} | {t['dedup_pass']:.3f} |")
    if all(r["times"].get("before") for r in results):
        print(f"\n| task | load average, start → end | raw, one write s | raw into a recycled file s | before ({results[0]['against']}) s | new s | before / raw | **new / raw** | new / raw recycled | new / before | median of per-repetition ratios, before / new / new vs recycled | CPU s raw / before / new | same bytes |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|")
        for r in results:
            t = r["times"]
            print(f"| {r['task']} | {r['load'][0]:.1f} → {r['load'][1]:.1f} | {t['raw_file']:.3f} | {t['raw_recycled']:.3f} | {t['before']:.3f} | {t['new']:.3f} | {t['before'] / t['raw_file']:.2f} | **{t['new'] / t['raw_file']:.2f}** | {t['new'] / t['raw_recycled']:.2f} | {t['new'] / t['before']:.2f} | {t['before_per_rep']:.2f} / {t['new_per_rep']:.2f} / {t['new_per_rep_recycled']:.2f} | {t['raw_file_cpu']:.2f} / {t['before_cpu']:.2f} / {t['new_cpu']:.2f} | {'yes' if r['same_bytes_as_before'] else 'NO'} |")
    if not all(r.get("peak_new") for r in results):
        return
    print("\n| task | resident MiB before the write | peak rise, new MiB (ru_maxrss / VmHWM) | peak rise, old MiB (ru_maxrss / VmHWM) |")
    print("|---|---:|---:|---:|")
    for r in results:
        new, old = r["peak_new"], r["peak_old"]
        print(f"| {r['task']} | {new['resident_mib']:.0f} | {new['ru_rise_mib']:.1f} / {new['hwm_rise_mib']:.1f} | {old['ru_rise_mib']:.1f} / {old['hwm_rise_mib']:.1f} |")
    if not all(r["history"] for r in results):
        return
    print("\n| task | history rows at round 1 / last | new save_state s, round 1 → last | old checkpoint s, round 1 → last | history part, new ms (append the round's rows) | history part, old ms (all rows in the checkpoint) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        h1, hn = r["history"][1], r["history"][r["rounds"]]
        print(f"| {r['task']} | {h1['rows']} / {hn['rows']} (round {r['rounds']}) | {h1['new']:.3f} → {hn['new']:.3f} | {h1['old']:.3f} → {hn['old']:.3f} | {h1['new_rows'] * 1e3:.1f} → {hn['new_rows'] * 1e3:.1f} | {h1['old_rows'] * 1e3:.1f} → {hn['old_rows'] * 1e3:.1f} |")


if __name__ == "__main__":
    main()
