"""docs/extending.md's commands, run exactly as written in a copy of the repository: the baselines on
a user's own three-site data, then a method of one's own written by new-method, installed, listed and put in the
table beside FedAvg and FedBN (only the new jobs train). The guide's ```bash blocks are read from the
Markdown, never copied here."""

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from fedmedbench import version

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPIED = ("config", "workflow", "src", "resources", "examples")


def doc_blocks(kind: str = "bash") -> dict[str, list[str]]:
    """The ```<kind> blocks of docs/extending.md, by section title (## level), each block whole."""
    text = (ROOT / "docs" / "extending.md").read_text()
    blocks: dict[str, list[str]] = {}
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        title = section.splitlines()[0].strip()
        blocks[title] = re.findall(rf"```{kind}\n(.*?)```", section, flags=re.DOTALL)
    return blocks


def federation_block() -> str:
    """docs/federation.md's block on one's own data and method, the one this test runs."""
    text = (ROOT / "docs" / "federation.md").read_text()
    [block] = re.findall(r"<!-- run-by: tests/test_extending\.py[^>]*-->\n```bash\n(.*?)```", text, flags=re.DOTALL)
    return block


def private_venv(where: Path) -> Path:
    """A virtual environment whose own site-packages come first and which sees this one's packages
    (fedmedbench, snakemake, pip) behind them: the guide's `pip install -e ./myfed` goes there, not
    into the environment every other test uses. Its bin/ holds python and this environment's console
    scripts (pip, snakemake) re-pointed at its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # addsitedir, not a plain path line: this environment's own .pth files (the editable fedmedbench) count too.
    (Path(purelib) / "_outer_environment.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    # Flower's commands too: docs/federation.md's federation of the guide's data and plug-in starts them
    # beside its python, and their apps must import the plug-in installed here.
    flower = sorted(p.name for p in BIN.iterdir() if p.name.startswith(("flwr", "flower-")))
    for script in ("pip", "snakemake", *flower):
        text = (BIN / script).read_text()
        (where / "bin" / script).write_text(re.sub(r"^#!.*", f"#!{python}", text, count=1))
        (where / "bin" / script).chmod(0o755)
    return where / "bin"


def run(block: str, cwd: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    env = {
        "PATH": f"{bin_dir}:{BIN}:/usr/bin:/bin",
        "HOME": str(cwd),
        # pip offline: no index, no build isolation (setuptools comes from the environment), none of
        # this machine's pip configuration. (PIP_NO_BUILD_ISOLATION=0 turns isolation off: pip reads
        # the variable as the value of --no-build-isolation's negation.)
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    return subprocess.run(["bash", "-e", "-c", block], cwd=cwd, env=env, capture_output=True, text=True)


def table_rows(path: Path) -> list[str]:
    return [
        line.split("|")[1].strip()
        for line in path.read_text().splitlines()
        if line.startswith("| ") and not line.startswith("| Method")
    ]


def trained(result: subprocess.CompletedProcess) -> int:
    """Training jobs Snakemake planned (its job-stats table), 0 when it had none."""
    found = re.search(r"^train\s+(\d+)$", result.stdout + result.stderr, flags=re.MULTILINE)
    return int(found.group(1)) if found else 0


def test_the_guide_has_the_blocks_this_test_runs():
    blocks = doc_blocks()
    assert set(blocks) == {"Run the baselines on your data", "Add your method"}
    assert len(blocks["Run the baselines on your data"]) == 1 and len(blocks["Add your method"]) == 2
    add = "\n".join(blocks["Add your method"])
    for command in ("new-method myfed", "pip install -e ./myfed", "fedmedbench methods", "myfed.yaml"):
        assert command in add, command
    assert "fedxyz" not in add  # the guide follows the package new-method writes
    federated = federation_block()  # docs/federation.md's federation of the same data and plug-in
    assert "federation local" in federated and "--task mysites" in federated and "--run myfed" in federated


@pytest.mark.slow
def test_the_extending_guide_runs_as_written(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in COPIED:
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.rmtree(repo / "examples" / "data", ignore_errors=True)  # written by the guide's first command
    bin_dir = private_venv(tmp_path / "venv")
    blocks = doc_blocks()

    [baselines] = blocks["Run the baselines on your data"]
    result = run(baselines, repo, bin_dir)
    assert result.returncode == 0, (baselines, result.stderr[-3000:])
    assert trained(result) == 2
    out = repo / "results" / "yourdata"
    counts = (out / "logs" / "data" / "preprocess_mysites_default.log").read_text()
    for site, n in (("siteA", 8), ("siteB", 10), ("siteC", 12)):
        assert f"folders {site}: {n} images" in counts
    assert table_rows(out / "tables" / "mysites_table.md") == ["FedAvg", "FedProx"]

    install, table = blocks["Add your method"]
    result = run(install, repo, bin_dir)
    assert result.returncode == 0, (install, result.stderr[-3000:])
    package = repo / "myfed"
    for path in ("pyproject.toml", "README.md", "src/myfed/method.py", "tests/test_myfed.py"):
        assert (package / path).is_file(), path
    # The listing the guide shows for the new method is the one printed.
    [listing] = doc_blocks("text")["Add your method"]
    printed = result.stdout.splitlines()
    start = printed.index(listing.splitlines()[0])
    assert printed[start : start + len(listing.splitlines())] == listing.splitlines()
    listed = printed[
        printed.index(next(line for line in printed if line.startswith("Successfully installed myfed"))) + 1 :
    ]
    assert len(listed) > 50 and not any(
        str(tmp_path) in line or str(ROOT) in line for line in listed
    )  # no path of this machine

    result = run(table, repo, bin_dir)
    assert result.returncode == 0, (table, result.stderr[-3000:])
    assert trained(result) == 2  # FedBN and MyFed; FedAvg's run is reused
    assert (repo / "myfed.yaml").is_file()
    assert table_rows(out / "tables" / "mysites_table.md") == ["FedAvg", "FedBN", "MyFed (yours)"]
    report = (out / "report.md").read_text()
    assert "## Your data: test Dice (%) per site" in report and "Metric: foreground Dice, in %." in report
    # no published table: our per-site table alone, and no claim to reproduce a paper
    assert report.startswith("# fedmedbench report\n") and "| Method | siteA | siteB | siteC | Avg |" in report
    assert (
        re.search(r"^\| MyFed \(yours\) \| \d+\.\d\d \(–\)", report, flags=re.MULTILINE) and "| paper |" not in report
    )
    assert "samples per client (train/val/test): siteA 4/2/2, siteB 6/2/2, siteC 8/2/2" in report
    final = out / "train" / "mysites" / "myfed" / "seed0" / "final.json"
    assert final.is_file()
    log = (out / "logs" / "train" / "mysites" / "myfed" / "seed0.log").read_text()
    assert log.splitlines()[0].split(" INFO fedmedbench: ")[1].startswith(f"fedmedbench {version()}")

    # docs/federation.md: the same data and plug-in over Flower, one SuperNode per site, the engine's numbers.
    result = run(federation_block(), repo, bin_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    federated = out / "federation" / "mysites" / "myfed" / "seed0"
    for name in ("final.json", "history.csv"):
        assert (federated / name).read_bytes() == (final.parent / name).read_bytes(), name
