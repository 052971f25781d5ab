"""Stores with the shapes and per-client counts of the papers' real data, filled with random pixels,
laid out as a run of the paper config reads its data, under ``--out``: so that ``python -m fedmedbench estimate``
can time the paper's jobs on a machine that has a GPU but not the data (a lent GPU node, a cluster
node before the download). A round's time depends on the image size, the channels, the number of
samples per client and split and the model, not on the pixel values; the scores such a run reaches
mean nothing.

    python benchmarks/paper_shaped_stores.py --out results/paper-shaped          # every task
    python benchmarks/paper_shaped_stores.py --tasks prostate skin --scale 0.05    # fewer samples
    python -m fedmedbench estimate --config config/config.yaml results/paper-shaped/overlay.yaml \
        --experiments harmofl_table6_ablation_prostate

The overlay it writes points the paper config's data paths into ``--out``. ``--out`` is refused where
the pipeline reads data (``results/paper``, ``results/demo``, a folder holding one, such as
``results``): training there would take the random pixels for the real data. Each store's
``info.json`` says ``"pixels": "random"``, and ``fedmedbench train`` refuses such a store unless the
run's data are marked synthetic; ``estimate`` times it. Counts, per client (train, val, test):
- prostate (HarmoFL): the annotated slices per site of HarmoFL's index files (261/157/468/411/384/175),
  split 64/16/20 at slice level (the first floor(0.64 n), up to floor(0.8 n), the rest);
- prostate_lwr (Fed-LWR): the same slices per site (Site1..6 = BIDMC, BMC, HK, I2CVB, RUNMC, UCL),
  about 60/20/20 (the real split is by case, so a few slices off);
- nuclei (HarmoFL): MoNuSAC's 294 images (train + test) shared equally by its four organs (the real
  per-organ counts are not published), MoNuSeg's 30 + 14, TNBC's 50; 64/16/20;
- camelyon17 (HarmoFL): WILDS' patches per hospital, test 20 %, val 20 % of the rest;
- skin (PRR-FL): the split files of record (specs/datasets.md 4.3) and the 427 images of the OOD cohort;
- fundus (Fed-LWR): 40/10/51, 79/20/60, 256/64/80, 256/64/80 (the Fed-LWR fork's log).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bench_memory import REAL as HOSPITALS  # noqa: E402  (WILDS' patches per hospital)

from fedmedbench import config as cfgmod  # noqa: E402
from fedmedbench.data.camelyon17.splits import TEST_FRACTION, VAL_FRACTION  # noqa: E402
from fedmedbench.data.prostate.splits import cut_points  # noqa: E402
from fedmedbench.data.store import mark_random_pixels, staged_dir, write_client, write_split_csv  # noqa: E402
from fedmedbench.errors import ConfigError, FedmedbenchError  # noqa: E402


def harmofl_cut(n: int) -> tuple[int, int, int]:
    """64/16/20 as HarmoFL's loaders cut a site (the prostate split's own cut points)."""
    train_end, val_end = cut_points(n)
    return train_end, val_end - train_end, n - val_end


def camelyon_cut(n: int) -> tuple[int, int, int]:
    """The Camelyon17 split of record's patch-level fractions."""
    test = int(n * TEST_FRACTION)
    val = int((n - test) * VAL_FRACTION)
    return n - test - val, val, test


def sixty_twenty(n: int) -> tuple[int, int, int]:
    val, test = round(0.2 * n), round(0.2 * n)
    return n - val - test, val, test


SLICES = {"BIDMC": 261, "HK": 157, "I2CVB": 468, "ISBI": 411, "ISBI_1.5": 384, "UCL": 175}
LWR_SITES = {
    "Site1": 261,
    "Site2": 384,
    "Site3": 157,
    "Site4": 468,
    "Site5": 411,
    "Site6": 175,
}  # BIDMC BMC HK I2CVB RUNMC UCL
NUCLEI = {
    "MoNuSAC_breast": 74,
    "MoNuSAC_kidney": 74,
    "MoNuSAC_lung": 73,
    "MoNuSAC_prostate": 73,
    "MoNuSeg": 44,
    "TNBC": 50,
}
SKIN = {"A": (2091, 298, 598), "B": (2708, 386, 774), "C": (1144, 163, 328), "D": (1400, 199, 401), "OOD": (0, 0, 427)}
FUNDUS = {"Domain1": (40, 10, 51), "Domain2": (79, 20, 60), "Domain3": (256, 64, 80), "Domain4": (256, 64, 80)}

# task: {client: (train, val, test)}
COUNTS = {
    "prostate": {c: harmofl_cut(n) for c, n in SLICES.items()},
    "prostate_lwr": {c: sixty_twenty(n) for c, n in LWR_SITES.items()},
    "nuclei": {c: harmofl_cut(n) for c, n in NUCLEI.items()},
    "camelyon17": {c: camelyon_cut(n) for c, n in HOSPITALS.items()},
    "skin": SKIN,
    "fundus": FUNDUS,
}
IMAGE_SIZE = {"prostate": 384, "prostate_lwr": 384, "nuclei": 256, "camelyon17": 96, "skin": 128, "fundus": 384}


def scaled(counts: tuple[int, int, int], scale: float) -> tuple[int, int, int]:
    """Each non-empty split keeps at least one batch's worth of rows below it (>= 2 rows)."""
    return tuple(0 if n == 0 else max(2, round(n * scale)) for n in counts)


def task_paths(config: dict, task: str) -> tuple[Path, Path]:
    """(store, split file) of a task, where the config's run reads them."""
    spec = cfgmod.resolve_run(config, task, _any_run(config, task), 0)
    return Path(spec["data"]["store"]), Path(spec["data"]["split"])


def write_task(config: dict, task: str, scale: float, rng: np.random.Generator) -> int:
    """The task's store (staged: it appears whole, marked random, or not at all) and split file."""
    spec = cfgmod.resolve_run(config, task, _any_run(config, task), 0)
    store, split = task_paths(config, task)
    model, size = spec["model"], IMAGE_SIZE[task]
    wanted = set(spec["clients"]) | set(spec.get("ood_clients") or [])
    if set(COUNTS[task]) != wanted:
        raise ConfigError(
            f"task {task}: the config's clients {sorted(wanted)} are not the counted ones {sorted(COUNTS[task])}"
        )
    rows, written = [], 0
    with staged_dir(store) as staged:
        for client, counts in COUNTS[task].items():
            train, val, test = scaled(counts, scale)
            n = train + val + test
            images = np.empty((n, size, size, model["in_channels"]), np.uint8)
            for start in range(0, n, 4096):  # chunks: the generator's temporaries stay small
                images[start : start + 4096] = rng.integers(0, 256, images[start : start + 4096].shape, dtype=np.uint8)
            if spec["kind"] == "segmentation":
                labels = rng.integers(0, model["num_classes"], (n, size, size), dtype=np.uint8)
            else:
                labels = (np.arange(n) % model["num_classes"]).astype(np.int64)  # every class in every split
            ids = [f"{client}/{i}" for i in range(n)]
            write_client(
                staged, client, images, labels, pd.DataFrame({"id": ids, "group": ids, "source": "paper-shaped"})
            )
            parts = ["train"] * train + ["val"] * val + ["test"] * test
            rows += [
                {"client": client, "split": s, "row": i, "id": ids[i], "group": ids[i]} for i, s in enumerate(parts)
            ]
            written += images.nbytes + labels.nbytes
        mark_random_pixels(staged, "benchmarks/paper_shaped_stores.py")
    write_split_csv(pd.DataFrame(rows), split)
    return written


def pipeline_runs(config_file: Path) -> dict[Path, str]:
    """The run folders the pipeline reads data from, each with the config that makes it: the
    config's own and each profile overlay's (the demo's), relative paths taken from the working
    directory and from the checkout (where Snakemake is run)."""
    base = cfgmod.read_yaml(config_file)
    overlays = [(config_file, {})] + [
        (path, cfgmod.read_yaml(path)) for path in sorted((ROOT / "workflow" / "profiles").glob("*/*.yaml"))
    ]
    runs = {}
    for path, overlay in overlays:
        if path != config_file and "run_name" not in (overlay or {}):
            continue  # a Snakemake profile's settings, not a config overlay
        root = cfgmod.results_root(
            {**base, **{k: v for k, v in (overlay or {}).items() if k in ("results_dir", "run_name")}}
        )
        shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
        for folder in (Path.cwd(), ROOT):
            runs.setdefault((folder / root).resolve(), f"the run of {shown}")
    return runs


def check_out(given: str, out: Path, config_file: Path) -> None:
    """``--out`` is a folder of its own, checked before anything is written: the overlay makes it a
    run folder (its parent the results folder), so it may not be, hold or lie in a folder the
    pipeline reads data from, and its parent may not be the working directory or the checkout."""
    option = f"--out {shlex.quote(given)}"
    if not cfgmod.NAME_PATTERN.match(out.name):
        raise ConfigError(
            f"{option}: its last name {out.name!r} must be a plain name ({cfgmod.NAME_RULE}): it names the run"
        )
    if "{" in str(out) or "}" in str(out):
        raise ConfigError(f"{option}: a path with a brace, which Snakemake reads as a wildcard; pick another folder")
    for run, made_by in pipeline_runs(config_file).items():
        relation = (
            "is" if out == run else "is inside" if run in out.parents else "holds" if out in run.parents else None
        )
        if relation:
            raise ConfigError(
                f"{option}: it {relation} {run}, the folder {made_by} reads its data from; give a folder of its own, e.g. --out results/paper-shaped"
            )
    for protected, what in (
        (Path.cwd().resolve(), "the working directory"),
        (cfgmod.PACKAGE_ROOT, "the fedmedbench checkout"),
    ):
        if out.parent == protected or out.parent in protected.parents:
            raise ConfigError(
                f"{option}: put it one folder deeper (e.g. --out results/{out.name}): the folder that holds it becomes a results folder, "
                f"which may not be {what} ({protected}) or a folder above it"
            )


def _any_run(config: dict, task: str) -> str:
    for experiment in config["experiments"]:
        for t, run, _ in cfgmod.experiment_runs(config, experiment):
            if t == task:
                return run
    raise ConfigError(f"no experiment of the config runs task {task}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "config/config.yaml"))
    parser.add_argument(
        "--out",
        default="results/paper-shaped",
        help="the run folder the overlay points the config's data paths at; "
        "never one the pipeline reads (default: %(default)s)",
    )
    parser.add_argument("--tasks", nargs="+", default=list(COUNTS), choices=list(COUNTS))
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the real counts (a smoke test)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    # Everything is checked before the first write: a refusal leaves nothing behind.
    check_out(args.out, out, Path(args.config))
    config = cfgmod.load_config(args.config)
    config.update(results_dir=str(out.parent), run_name=out.name)  # what the overlay will say
    cfgmod.validate(config, f"{args.config} with --out {args.out}")
    for task in args.tasks:
        store, _ = task_paths(config, task)
        if store.exists():
            raise ConfigError(f"{store} already exists: remove it or pick another --out")
    made = [p for p in (out, *out.parents) if not p.exists()][-1:]  # the topmost folder this run creates
    written: list[Path] = []
    try:
        rng = np.random.default_rng(0)
        for task in args.tasks:
            started = time.perf_counter()
            store, split = task_paths(config, task)
            written.append(store)  # staged: it appears whole or not at all
            size = write_task(config, task, args.scale, rng)
            written.append(split)
            print(f"{task}: {size / 1e9:.2f} GB in {time.perf_counter() - started:.1f} s -> {store}", flush=True)
        overlay = out / "overlay.yaml"
        overlay.write_text(yaml.safe_dump({"results_dir": str(out.parent), "run_name": out.name}))
    except BaseException:
        # Interrupted or failed part way: no store without the rest of what was asked for.
        for path in [*made, *written]:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            for folder in path.parents:  # the folders made for it, up to --out
                if folder == out or out not in folder.parents or not folder.is_dir() or any(folder.iterdir()):
                    break
                folder.rmdir()
        raise
    print(f"overlay: {overlay}")


if __name__ == "__main__":
    try:
        main()
    except (FedmedbenchError, OSError) as err:  # bad input or a full disk: one line, nothing left behind
        sys.exit(f"paper_shaped_stores.py: {err}")
