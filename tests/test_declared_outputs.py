"""Outputs that cannot go stale: every file a training, evaluation or report job declares is
asked for by `all`, so a deleted one (a model_best.pt, a figure's source CSV) re-runs its job. Snakemake
re-runs a job for a missing output only when some job asks for that very file. Dry runs of the tiny
config, each a second or two."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import CONFIGFILES

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# The data jobs' records, left out on purpose (workflow/rules/common.smk, all_targets): remaking one
# would redo a download or a store, and so every training job after it.
DATA_RECORDS = {("download", ".sha256"), ("preprocess", "counts.json")}


def snakemake(workdir: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(ROOT / "workflow" / "Snakefile"),
        "--directory",
        str(workdir),
        "--cores",
        "1",
        *flags,
        "--configfile",
        *map(str, CONFIGFILES),
    ]
    result = subprocess.run(
        cmd, capture_output=True, text=True, env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(workdir)}, cwd=workdir
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def planned(workdir: Path) -> list[tuple[str, list[str], list[str]]]:
    """(rule, inputs, outputs) of every job a dry run plans."""
    text = snakemake(workdir, "-n").stdout
    jobs = []
    for block in re.split(r"^rule ", text, flags=re.M)[1:]:
        rule = block.split(":", 1)[0]
        files = {key: [] for key in ("input", "output")}
        for key in files:
            found = re.search(rf"^    {key}: (.*)$", block, re.M)
            files[key] = found.group(1).split(", ") if found else []
        jobs.append((rule, files["input"], files["output"]))
    return jobs


def tiny_workdir(tmp_path: Path) -> Path:
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "config.yaml", tmp_path / "config" / "config.yaml")
    return tmp_path


def test_every_output_of_a_training_evaluation_or_report_job_is_asked_for(tmp_path):
    jobs = planned(tiny_workdir(tmp_path))
    assert {rule for rule, _, _ in jobs} >= {
        "train",
        "collect_metrics",
        "table",
        "convergence_figure",
        "reproduction_report",
        "all",
    }
    asked = {f for _, inputs, _ in jobs for f in inputs}
    unasked = sorted((rule, out) for rule, _, outputs in jobs for out in outputs if out not in asked)
    records = [(rule, out) for rule, out in unasked if any(rule == r and out.endswith(end) for r, end in DATA_RECORDS)]
    assert unasked == records, [
        u for u in unasked if u not in records
    ]  # was: 6 model_best.pt, 6 predictions.npz, the convergence CSV


@pytest.mark.slow  # six Snakemake runs: about 30 s on a busy two-core machine
def test_a_deleted_model_best_pt_or_figure_csv_reruns_its_job(tmp_path):
    workdir = tiny_workdir(tmp_path)
    # Every planned output made by hand (empty), then dated in the DAG's order: nothing to be done.
    for rule, _, outputs in planned(workdir):
        for out in outputs:
            path = workdir / out
            if rule in ("synthesize", "extract") or path.name == "store":
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
    snakemake(workdir, "--touch")
    assert "Nothing to be done" in snakemake(workdir, "-n").stdout

    run = workdir / "results" / "e2e" / "train" / "prostate" / "fedavg" / "seed0"
    (run / "model_best.pt").unlink()
    rules = [rule for rule, _, _ in planned(workdir)]
    assert rules.count("train") == 1, rules  # was: "Nothing to be done", and the file never came back
    (run / "model_best.pt").touch()
    snakemake(workdir, "--touch")

    (workdir / "results" / "e2e" / "figures" / "harmofl_table1_prostate_convergence.csv").unlink()
    rules = [rule for rule, _, _ in planned(workdir)]
    assert "convergence_figure" in rules and "train" not in rules, rules
