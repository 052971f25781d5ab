"""The Snakemake workflow end to end on a tiny synthetic run, plus lint and formatting."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

TINY = {
    "run_name": "e2e",
    "data": {
        "prostate": {
            "synthetic": True,
            "synthetic_options": {"cases_per_site": 3, "depth": 8, "size": 32},
            "protocols": {
                "harmofl": {"image_size": 32, "expect_real_counts": False, "split": {"permutation": "seeded"}},
                "fedlwr": {"image_size": 32, "expect_real_counts": False},
            },
        },
        "skin": {"synthetic": True, "protocols": {"prrfl": {"image_size": 16, "expect_real_counts": False, "split": {"permutation": "seeded"}}}},
        "fundus": {"synthetic": True, "protocols": {"fedlwr": {"image_size": 32, "expect_real_counts": False}}},
    },
    "tasks": {
        "prostate": {
            "model": {"init_features": 2},
            "rounds": 2,
            "batch_size": 4,
        }
    },
    "experiments": {"harmofl_table1_prostate": {"seeds": [0, 1]}},
}


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    configs = [str(ROOT / "config.yaml"), str(workdir / "tiny.yaml"), *[str(workdir / a) for a in args if a.endswith(".yaml")]]
    flags = [a for a in args if not a.endswith(".yaml")]
    cmd = [str(BIN / "snakemake"), "-s", str(ROOT / "Snakefile"), "--directory", str(workdir), "--cores", "2", "--configfile", *configs, *flags]
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(workdir)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run."""
    table = result.stdout.split("Job stats:")[-1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE) if m.group(1) != "total"}


@pytest.mark.slow
def test_tiny_pipeline_runs_then_has_nothing_to_do_and_reruns_only_what_changed(tmp_path):
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")  # the Snakefile's default configfile
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))

    run = snakemake(tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "results" / "e2e"
    table = (out / "tables" / "harmofl_table1_prostate.md").read_text()
    assert all(name in table for name in ("FedAvg", "FedProx", "Solo"))
    for ext in ("csv", "tex"):
        assert (out / "tables" / f"harmofl_table1_prostate.{ext}").stat().st_size > 0
    for ext in ("png", "pdf"):
        assert (out / "figures" / f"harmofl_table1_prostate_convergence.{ext}").stat().st_size > 1000
    assert "SYNTHETIC" in (out / "report.md").read_text()
    final = json.loads((out / "train" / "prostate" / "fedprox" / "seed1" / "final.json").read_text())
    assert final["config"]["method_params"] == {"mu": 0.01} and final["synthetic"] is True
    assert (out / "logs" / "train" / "prostate" / "fedavg" / "seed0.log").stat().st_size > 0
    assert (out / "benchmarks" / "train" / "prostate" / "fedavg" / "seed0.tsv").exists()

    again = snakemake(tmp_path, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr

    (tmp_path / "mu.yaml").write_text(yaml.safe_dump({"methods": {"fedprox": {"mu": 0.1}}}))
    changed = planned_jobs(snakemake(tmp_path, "mu.yaml", "-n"))
    assert changed.pop("train") == 2  # the two FedProx seeds, nothing else
    assert set(changed) <= {"collect_metrics", "table", "convergence_figure", "qualitative_figure", "reproduction_report", "all"}


def test_lint_and_format_are_clean():
    lint = subprocess.run([str(BIN / "snakemake"), "--lint"], capture_output=True, text=True, cwd=ROOT)
    assert "Congratulations" in lint.stdout + lint.stderr, lint.stdout[-2000:]
    fmt = subprocess.run([str(BIN / "snakefmt"), "--check", "."], capture_output=True, text=True, cwd=ROOT)
    assert fmt.returncode == 0, fmt.stderr
