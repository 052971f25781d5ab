#!/usr/bin/env python3
"""Write the measured numbers of the documentation from their result files (``make docs``).

A page quotes a measurement only inside a generated block::

    <!-- generated:h200-engine -->
    ... (this script writes everything in between) ...
    <!-- /generated -->

Each block name maps to one CSV file under ``benchmarks/results/`` (dated, with its machine, commit and
command beside it in the Markdown record of the same date) and the columns it shows. The values are copied
as the CSV spells them, never recomputed or rounded, so the page says exactly what the file says.

The benchmark records themselves (``benchmarks/results/*.md``) show their summary tables the same way: each
table is a block written from the CSV beside the record (``RECORD_TABLES``: every column, headed as the CSV
heads it), so a measured value has one place, its CSV, and ``tests/test_docs_units.py`` fails on one written
by hand outside a block.

    python scripts/docs_numbers.py            # rewrite every block in README.md, docs/**/*.md and the records
    python scripts/docs_numbers.py --check    # exit 1, naming the page and block, where a block is stale

``tests/test_docs.py`` runs the check.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

CHECKPOINT_BYTES = [
    ("task", "task"),
    ("model", "model"),
    ("clients", "K"),
    ("optimizer", "optimizer"),
    ("model_mb", "model MB"),
    ("state_mb", "state MB"),
    ("unique_mb", "unique MB"),
    ("file_mb", "checkpoint file MB"),
    ("file_over_unique", "file ÷ unique"),
    ("selection_unique_mb", "selection: unique MB"),
    ("selection_file_mb", "selection: file MB"),
    ("selection_file_over_unique", "selection: file ÷ unique"),
]
CHECKPOINT_TIMES = [
    ("task", "task"),
    ("load_start", "load, start"),
    ("load_end", "load, end"),
    ("checkpoint_s", "checkpoint s"),
    ("state_fsync_s", "torch.save(state) + fsync s"),
    ("distinct_fsync_s", "torch.save(distinct) + fsync s"),
    ("checkpoint_over_state_fsync", "checkpoint ÷ torch.save(state) + fsync"),
    ("checkpoint_over_state_fsync_per_rep", "(per repetition)"),
    ("checkpoint_over_distinct_fsync", "checkpoint ÷ torch.save(distinct) + fsync"),
    ("checkpoint_cpu_s", "CPU s: checkpoint"),
    ("state_fsync_cpu_s", "CPU s: torch.save(state) + fsync"),
]

# name: (CSV file, the Markdown record it belongs to, [(CSV column, table header), ...])
BLOCKS: dict[str, tuple[str, str, list[tuple[str, str]]]] = {
    "h200-engine": (
        "2026-11-26-h200-engine.csv",
        "2026-11-26-h200.md",
        [
            ("task", "task"),
            ("model", "model"),
            ("image_px", "image (px)"),
            ("batch", "batch"),
            ("engine_ms_per_step", "engine ms/step (fp32)"),
            ("plain_ms_per_step_bf16", "plain loop ms/step (bf16)"),
            ("train_s_per_round", "train s/round (2 clients)"),
            ("eval_s_per_round", "eval s/round"),
            ("checkpoint_s_per_round", "checkpoint s/round"),
        ],
    ),
    "h200-jobs-per-gpu": (
        "2026-11-26-h200-jobs-per-gpu.csv",
        "2026-11-26-h200.md",
        [
            ("task", "task"),
            ("steps_per_s_1_job", "1 job: steps/s"),
            ("gain_2_jobs", "2 jobs: throughput × one job"),
            ("gain_4_jobs", "4 jobs: throughput × one job"),
        ],
    ),
    "h200-estimate": (
        "2026-11-26-h200-estimate.csv",
        "2026-11-26-h200.md",
        [
            ("experiment", "experiment"),
            ("jobs", "jobs"),
            ("rounds", "rounds"),
            ("gpu_hours", "GPU-hours (H200)"),
            ("caveat", "caveat"),
        ],
    ),
    "reader-threads": (
        "2026-11-25-reader-cpu.csv",
        "2026-11-25-paper-scale-cpu.md",
        [
            ("task", "task"),
            ("image_px", "image (px)"),
            ("batch", "batch"),
            ("samples_per_s_per_thread_warm", "samples/s per thread"),
            ("threads_for_h100_bound_training", "threads at H100 peak: train"),
            ("threads_for_h100_bound_evaluation", "eval"),
        ],
    ),
    "checkpoint-sizes": (
        "2026-11-25-checkpoint-sizes.csv",
        "2026-11-25-checkpoint-writer.md",
        [
            ("task", "task"),
            ("model", "model"),
            ("clients", "clients"),
            ("optimizer", "optimizer"),
            ("model_mb", "model MB"),
            ("checkpoint_mb", "checkpoint MB (each round)"),
            ("selection_file_mb", "selected models MB"),
        ],
    ),
    "federation-rounds": (
        "2026-11-29-federation-rounds.csv",
        "2026-11-29-federation-rounds.md",
        [
            ("store", "store"),
            ("method", "method"),
            ("engine_s", "engine s/round"),
            ("federation_s", "federation s/round (Flower's stock waits)"),
            ("flower_waits_s", "of it Flower's fixed waits"),
            ("flower_waits_bound_s", "their bound"),
            ("ours_s", "ours s/round (those waits cut)"),
            ("ours_over_engine", "ours ÷ engine"),
        ],
    ),
    "warm-apps": (
        "2026-11-29-warm-apps.csv",
        "2026-11-29-federation-rounds.md",
        [("quantity", "quantity"), ("value", "value"), ("unit", "unit")],
    ),
    "memory": (
        "2026-11-25-memory-cpu.csv",
        "2026-11-25-paper-scale-cpu.md",
        [("quantity", "quantity"), ("value", "value"), ("unit", "unit"), ("how", "measured with")],
    ),
    # The checkpoint record (bench_checkpoint.py's CSV): sizes, and write times, at the papers' and the demo's sizes.
    **{
        f"{name}-{part}": (f"2026-12-02-{name}.csv", "2026-12-02-checkpoint.md", columns)
        for name in ("checkpoint", "checkpoint-demo-sizes")
        for part, columns in (("bytes", CHECKPOINT_BYTES), ("times", CHECKPOINT_TIMES))
    },
    "fair-steps": (
        "2026-12-02-fair-steps.csv",
        "2026-12-02-fair-steps.md",
        [
            ("task", "task"),
            ("setting", "setting"),
            ("local_steps", "local steps s (round 1, mean)"),
            ("run", "row"),
            ("step_over_fedavg_rounds", "global step ÷ FedAvg's (round 1 / 2 / ...)"),
            ("mean_client_update_r1", "mean ‖Δ_i‖ (round 1)"),
            ("adam_bound_fraction_r1", "‖Δ_i‖ ÷ η·s·√N"),
            ("gamma_r1", "Γ (round 1)"),
            ("h_term_ratio_r1", "q·F^(q−1)·‖Δw‖² ÷ L·F^q (round 1)"),
        ],
    ),
}

# The records' own tables: record -> the CSV files (beside it) whose tables it shows, in the order shown. The
# block's name is the CSV's name without ".csv"; it shows every column under the CSV's own header.
RECORD_TABLES: dict[str, list[str]] = {
    "2026-12-02-demo-wall-time.md": ["2026-12-02-demo-wall-time.csv", "2026-12-02-demo-wall-time-summary.csv"],
    "2026-11-22-engine-small-cpu.md": ["2026-11-22-engine-small-cpu.csv"],
    "2026-11-22-fedlwr-cka-cpu.md": ["2026-11-22-fedlwr-cka-cpu.csv", "2026-11-22-fedlwr-cka-cpu-steps.csv"],
    "2026-11-23-dag-time.md": ["2026-11-23-dag-time.csv", "2026-11-23-dag-time-slurm-probe.csv"],
    "2026-11-23-demo-wall-time.md": ["2026-11-23-demo-wall-time.csv"],
    "2026-11-26-demo-wall-time.md": ["2026-11-26-demo-wall-time.csv"],
    "2026-11-28-demo-wall-time.md": ["2026-11-28-demo-wall-time.csv", "2026-11-28-demo-wall-time-pair.csv"],
    "2026-11-28-test-tiers.md": [
        "2026-11-28-test-tiers-fast.csv",
        "2026-11-28-test-tiers-slow.csv",
        "2026-11-28-test-tiers-ci.csv",
        "2026-11-28-test-tiers-avx512.csv",
        "2026-11-28-test-tiers-ci-9022adf.csv",
        "2026-11-28-test-tiers-ci-3e61222.csv",
    ],
    "2026-11-29-test-tiers.md": [
        "2026-11-29-test-tiers-fast.csv",
        "2026-11-29-test-tiers-ci.csv",
        "2026-11-29-test-tiers-demo.csv",
    ],
    "2026-11-29-install.md": ["2026-11-29-install.csv"],
    "2026-11-25-paper-scale-cpu.md": [
        "2026-11-25-paper-scale-cpu-eval-per-round.csv",
        "2026-11-25-paper-scale-cpu-reader.csv",
        "2026-11-25-paper-scale-cpu-reader-bound.csv",
        "2026-11-25-paper-scale-cpu-memory-per-store.csv",
        "2026-11-25-paper-scale-cpu-engine.csv",
        "2026-11-25-paper-scale-cpu-engine-ab.csv",
    ],
    "2026-11-29-federation-rounds.md": [
        "2026-11-29-federation-rounds-after-time.csv",
        "2026-11-29-federation-rounds-after-bytes.csv",
        "2026-11-29-federation-rounds-before-time.csv",
        "2026-11-29-federation-rounds-before-floor.csv",
        "2026-11-29-federation-rounds-before-bytes.csv",
        "2026-11-29-federation-rounds-tiny-time.csv",
        "2026-11-29-federation-rounds-tiny-bytes.csv",
    ],
    "2026-11-26-h200.md": [
        "2026-11-26-h200-calls.csv",
        "2026-11-26-h200-engine-first-call.csv",
        "2026-11-26-h200-jobs-first-call.csv",
        "2026-11-26-h200-engine-second-call.csv",
        "2026-11-26-h200-between-calls.csv",
        "2026-11-26-h200-checkpoint-gpu.csv",
        "2026-11-26-h200-estimate-calls.csv",
        "2026-11-26-h200-round-first-look.csv",
        "2026-11-26-h200-round-phases-cpu.csv",
        "2026-11-26-h200-round-budget.csv",
    ],
    "2026-11-25-federation-and-simulators.md": [
        "2026-11-25-federation-and-simulators-bytes-methods.csv",
        "2026-11-25-federation-and-simulators-bytes-beyond.csv",
        "2026-11-25-federation-and-simulators-time.csv",
        "2026-11-25-federation-and-simulators-warm.csv",
        "2026-11-25-federation-and-simulators-latency.csv",
        "2026-11-25-federation-and-simulators-waits.csv",
        "2026-11-25-federation-and-simulators-profile.csv",
        "2026-11-25-federation-and-simulators-split.csv",
        "2026-11-25-federation-and-simulators-ray.csv",
    ],
    "2026-12-02-fair-steps.md": ["2026-12-02-fair-steps.csv"],
}
for _record, _tables in RECORD_TABLES.items():
    BLOCKS.update({t.removesuffix(".csv"): (t, _record, []) for t in _tables})

BLOCK = re.compile(r"(<!-- generated:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)


def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may hold generated blocks: README.md, every page under docs/ and the benchmark records."""
    return [
        root / "README.md",
        *sorted((root / "docs").rglob("*.md")),
        *sorted((root / "benchmarks" / "results").glob("*.md")),
    ]


def render(name: str, page: Path, results: Path = RESULTS) -> str:
    """The Markdown of block ``name`` as it must appear on ``page`` (links relative to the page)."""
    if name not in BLOCKS:
        raise KeyError(f"{page}: unknown generated block {name!r}; known: {', '.join(sorted(BLOCKS))}")
    csv_name, record, columns = BLOCKS[name]
    with open(results / csv_name, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not columns:  # a record's own table: every column, headed as the CSV heads it
        with open(results / csv_name, newline="", encoding="utf-8") as f:
            columns = [(c, c) for c in next(csv.reader(f), [])]
    for column, _ in columns:
        if rows and column not in rows[0]:
            raise KeyError(f"{results / csv_name}: no column {column!r} (block {name!r})")
    lines = ["| " + " | ".join(header for _, header in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row[column] for column, _ in columns) + " |" for row in rows]
    rel = Path(os.path.relpath(results, page.parent)).as_posix()
    prefix = "" if rel == "." else rel + "/"  # a record links the CSV beside it by its bare name
    if page.name == record and page.parent.resolve() == results.resolve():
        lines += ["", f"Source: [{csv_name}]({prefix}{csv_name})."]  # the record is this page
    else:
        source = f"Source: [{csv_name}]({prefix}{csv_name}), measured as recorded in [{record}]({prefix}{record})."
        lines += ["", source]
    return "\n".join(lines) + "\n"


def update(text: str, page: Path, results: Path = RESULTS) -> str:
    """``text`` with every generated block rewritten from its result file."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name"), page, results) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a block is stale")
    args = parser.parse_args(argv)
    stale = []
    for page in pages():
        if not page.exists():
            continue
        text = page.read_text(encoding="utf-8")
        new = update(text, page)
        if new != text:
            if args.check:
                names = [
                    m.group("name") for m in BLOCK.finditer(text) if m.group("body") != render(m.group("name"), page)
                ]
                stale.append(f"{page.relative_to(ROOT)} (blocks: {', '.join(names)})")
            else:
                page.write_text(new, encoding="utf-8")
                print(f"docs_numbers: wrote {page.relative_to(ROOT)}")
    if stale:
        print("docs_numbers: stale generated numbers in " + "; ".join(stale) + ": run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
