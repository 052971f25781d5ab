"""docs/extending.md's commands, run exactly as written in a copy of the repository: the baselines on
a user's own three-site data, then a plug-in method beside them (only its job trains)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPIED = ("config", "workflow", "src", "resources", "examples")


def doc_blocks() -> dict[str, list[str]]:
    """The ```bash blocks of docs/extending.md, by section title: their command lines."""
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks: dict[str, list[str]] = {}
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL):
            blocks.setdefault(title, []).extend(line for line in block.splitlines() if line.strip())
    return blocks


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_the_extending_guide_runs_as_written(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(source, repo / name)
    shutil.rmtree(repo / "examples" / "data", ignore_errors=True)  # written by the guide's first command
    blocks = doc_blocks()
    assert set(blocks) == {"Run the baselines on your data", "Add your method"}

    for command in blocks["Run the baselines on your data"]:
        result = run(command, repo)
        assert result.returncode == 0, (command, result.stderr[-3000:])
    out = repo / "results" / "yourdata"
    counts = (out / "logs" / "data" / "preprocess_mysites_default.log").read_text()
    for site, n in (("siteA", 8), ("siteB", 10), ("siteC", 12)):
        assert f"folders {site}: {n} images" in counts
    table = (out / "tables" / "mysites_table.md").read_text()
    assert "FedAvg" in table and "FedProx" in table and "FedXYZ" not in table

    for command in blocks["Add your method"]:
        result = run(command, repo)
        assert result.returncode == 0, (command, result.stderr[-3000:])
        if command.lstrip().startswith("PYTHONPATH="):
            trained = re.search(r"^train\s+(\d+)$", result.stdout + result.stderr, flags=re.MULTILINE)
            assert trained and trained.group(1) == "1", result.stderr[-2000:]  # only the plug-in trains
    table = (out / "tables" / "mysites_table.md").read_text()
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Method")]
    assert rows == ["FedAvg", "FedProx", "FedXYZ (yours)"]
    report = (out / "report.md").read_text()
    assert "## Your data: test Dice (%) per site" in report and "Metric: foreground Dice, in %." in report
    # no published table: our per-site table alone, and no claim to reproduce a paper
    assert report.startswith("# fedmedbench report\n") and "| Method | siteA | siteB | siteC | Avg |" in report
    assert re.search(r"^\| FedXYZ \(yours\) \| \d+\.\d\d \(–\)", report, flags=re.MULTILINE) and "| paper |" not in report
    assert "samples per client (train/val/test): siteA 4/2/2, siteB 6/2/2, siteC 8/2/2" in report
    assert (repo / "my-fed-method" / "src" / "myfed" / "method.py").is_file()
    assert os.path.exists(out / "train" / "mysites" / "fedxyz" / "seed0" / "final.json")
