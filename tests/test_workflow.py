"""The Snakemake workflow end to end on a tiny synthetic run, plus lint and formatting."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.tiny import (
    CONFIGFILES,  # config.yaml, the demo overlay, tests/tiny.yaml: shared with tests/slurm/run_tiny.sh
)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    configs = [*map(str, CONFIGFILES), *[str(workdir / a) for a in args if a.endswith(".yaml")]]
    flags = [a for a in args if not a.endswith(".yaml")]
    snakemake_cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(ROOT / "workflow" / "Snakefile"),
        "--directory",
        str(workdir),
        "--cores",
        "2",
        *flags,
        "--configfile",
        *configs,
    ]
    dry = {"-n", "--dry-run"} & set(flags)
    cmd = (
        snakemake_cmd if dry else [str(BIN / "python"), "-m", "fedmedbench", "with-jobserver", *snakemake_cmd]
    )  # as `make demo`
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(workdir)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)


def readme_demo_command() -> list[str]:
    """The README quick start's `make demo`, as the page prints it (the line of its first block that runs it)."""
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    [argv] = [shlex.split(line.split(" #")[0]) for line in block.splitlines() if line.startswith("make demo")]
    assert argv == ["make", "demo"], argv
    return argv


def make_demo(workdir: Path, *targets: str) -> subprocess.CompletedProcess:
    """The README's `make demo`, on the tiny settings (DEMO_ARGS, the Makefile's hook) in ``workdir``.
    `-o` keeps make from installing .venv when pytest runs in another environment: the recipe then
    finds this interpreter on PATH."""
    options = [*targets, "--directory", str(workdir), "--cores", "2", "--configfile", *map(str, CONFIGFILES)]
    cmd = [*readme_demo_command(), "-o", ".venv/.installed", f"DEMO_ARGS={shlex.join(options)}"]
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(workdir)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run."""
    table = result.stdout.split("Job stats:")[-1]
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)
        if m.group(1) != "total"
    }


# `make test`'s one end-to-end Snakemake run (not marked slow on purpose), started as the README's `make demo`.
def test_tiny_pipeline_runs_then_has_nothing_to_do_and_reruns_only_what_changed(tmp_path):
    # Every path of the run holds a space: each one is quoted in the rules' shell commands.
    tmp_path = tmp_path / "with space"
    tmp_path.mkdir()
    (tmp_path / "config").mkdir()
    shutil.copy(
        ROOT / "config" / "config.yaml", tmp_path / "config" / "config.yaml"
    )  # the Snakefile's default configfile

    # `all` builds the data the selected experiments read; every family's split is asked for too, so
    # that each synthetic twin goes through download, extraction, parsing and splitting.
    families = (
        ("prostate", "harmofl"),
        ("prostate", "fedlwr"),
        ("camelyon17", "harmofl"),
        ("nuclei", "harmofl"),
        ("skin", "prrfl"),
        ("fundus", "fedlwr"),
    )
    splits = [f"results/e2e/data/{dataset}/{protocol}/split.csv" for dataset, protocol in families]
    run = make_demo(tmp_path, "all", *splits)  # the README's quick start, on tiny settings
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "workflow/profiles/demo" in run.stdout and "Tables, figures and the report are in" in run.stdout
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
    # Every family's synthetic twin went through download, extraction, parsing and splitting.
    for dataset, protocol in families:
        assert (out / "data" / dataset / protocol / "split.csv").stat().st_size > 0, (dataset, protocol)

    again = snakemake(tmp_path, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-4000:]
    # The checkpoint cadence cannot change a number: changing it re-runs nothing.
    (tmp_path / "cadence.yaml").write_text(yaml.safe_dump({"tasks": {"prostate": {"checkpoint_every": 2}}}))
    cadence = snakemake(tmp_path, "cadence.yaml", "-n")
    assert "Nothing to be done" in cadence.stdout + cadence.stderr
    # Nor can the reader threads of a GPU job (an execution setting, like the cadence).
    workers = snakemake(tmp_path, "--set-resources", "train:data_workers=2", "-n")
    assert "Nothing to be done" in workers.stdout + workers.stderr
    assert not list(tmp_path.parent.glob("*.log")), "a log was written outside the workdir"

    (tmp_path / "mu.yaml").write_text(yaml.safe_dump({"methods": {"fedprox": {"mu": 0.1}}}))
    changed = planned_jobs(snakemake(tmp_path, "mu.yaml", "-n"))
    assert changed.pop("train") == 2  # the two FedProx seeds, nothing else
    assert set(changed) <= {"collect_metrics", "table", "convergence_figure", "reproduction_report", "all"}


def test_real_config_plans_every_download_and_preprocessing(tmp_path):
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "config.yaml", tmp_path / "config" / "config.yaml")
    cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(ROOT / "workflow" / "Snakefile"),
        "--directory",
        str(tmp_path),
        "-n",
        "-p",
        "--cores",
        "1",
    ]
    dry = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path)}
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    jobs = planned_jobs(dry)
    # prostate 1 + camelyon17 1 + nuclei 5 + skin 5 + fundus 1 raw files; 6 (dataset, protocol) pairs.
    assert jobs["download"] == 13 and jobs["preprocess"] == 6 and jobs["split"] == 6
    assert "gdrive:1TtrjnlnJ1yqr5m4LUGMelKTQXtvZaru-" in dry.stdout  # the real sources, not synthetic twins
    assert "synthesize" not in jobs
    # A plain `snakemake` uses the default profile (rerun-incomplete, show-failed-logs).
    assert f"workflow specific profile {ROOT / 'workflow' / 'profiles' / 'default'}" in dry.stdout + dry.stderr


def test_lint_and_format_are_clean():
    lint = subprocess.run([str(BIN / "snakemake"), "--lint"], capture_output=True, text=True, cwd=ROOT)
    assert "Congratulations" in lint.stdout + lint.stderr, lint.stdout[-2000:]
    fmt = subprocess.run([str(BIN / "snakefmt"), "--check", "."], capture_output=True, text=True, cwd=ROOT)
    assert fmt.returncode == 0, fmt.stderr
