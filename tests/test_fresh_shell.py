"""The README's and the user guide's commands as a reader pastes them into a new terminal: no environment
active, nothing on PATH but the system's. The README's install block (make install, then activate) comes
first; after it every command the pages print must resolve: our CLI's subcommands answer ``--help``,
Snakemake and make find what the pages name. (Other tests run the blocks in full; this one catches what
only a fresh shell shows, such as `No module named fedmedbench`.)"""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.test_docs import README, USER_GUIDE, command_blocks, commands

ROOT = Path(__file__).resolve().parents[1]
PAGES = [README, *[p for p in USER_GUIDE if p.exists()]]
PYTHON_WORDS = ("python", "python3", "fedmedbench", "snakemake")


def install_block() -> str:
    """The README's block that installs and activates: the first block a reader pastes."""
    blocks = [body for _line, body, _marker in command_blocks(README)]
    return blocks[0]


def fresh_shell(script: str, home: Path) -> subprocess.CompletedProcess:
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    return subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def resolving(argv: list[str]) -> str | None:
    """A cheap form of a pasted command that still needs the same program and module: ``--help`` of our
    CLI's subcommand, Snakemake's version, a make dry run; None for commands that need nothing of ours."""
    if argv[:3] in (["python", "-m", "fedmedbench"], ["python3", "-m", "fedmedbench"]) or argv[:1] == ["fedmedbench"]:
        head = argv[:3] if argv[0] != "fedmedbench" else argv[:1]
        rest = argv[len(head) :]
        sub = next((w for w in rest if not w.startswith("-")), None)
        return shlex.join([*head, *([sub] if sub else []), "--help"])
    if argv[0] == "snakemake":
        return "snakemake --version"
    if argv[0] in ("python", "python3") and len(argv) > 1 and argv[1].endswith(".py"):
        return shlex.join([argv[0], "-c", "import fedmedbench"])
    return None


def test_the_readme_installs_and_activates_before_any_other_command():
    first = install_block()
    assert "make install" in first and "source .venv/bin/activate" in first
    lines = [line.split("#")[0].strip() for line in first.splitlines()]
    assert lines.index("make install") < lines.index("source .venv/bin/activate")
    for _line, body, _marker in command_blocks(README)[1:]:
        for argv in commands(body):
            assert argv[0] != "make" or argv[1:2] != ["install"], "the install step is in the first block only"


def test_every_page_invokes_check_data_one_way():
    """`--configfile` everywhere (Snakemake's spelling); `--config` is an accepted alias, never printed."""
    found = [
        f"{page.name}:{line}"
        for page in [*PAGES, ROOT / "config" / "README.md"]
        for line, text in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"fedmedbench \S+ .*--config(?!file)\b", text)
    ]
    assert not found, f"--config where the docs say --configfile: {found}"


@pytest.mark.slow
def test_every_command_of_the_pages_resolves_in_a_fresh_shell(tmp_path):
    setup = [
        line
        for line in install_block().splitlines()
        if line.split("#")[0].strip().startswith(("make install", "source "))
    ]
    checks = []
    for page in PAGES:
        for _line, body, _marker in command_blocks(page):
            try:
                argvs = commands(body)
            except ValueError:  # a heredoc or a multi-line quote: its own page's test runs it
                argvs = [
                    shlex.split(line)
                    for line in body.splitlines()
                    if re.match(r"^(python|snakemake|fedmedbench)\b[^'\"]*$", line)
                ]
            for argv in argvs:
                cheap = resolving(argv)
                if cheap and cheap not in checks:
                    checks.append(cheap)
    assert any("fedmedbench" in c for c in checks) and "snakemake --version" in checks
    script = "\n".join([*setup, *[f"{c} >/dev/null" for c in checks]])
    result = fresh_shell(script, tmp_path)
    assert result.returncode == 0, f"in a fresh shell after the README's install block: {result.stderr[-3000:]}"
    # Without the install block's activation the same commands fail: what the block is there for.
    bare = fresh_shell("python -m fedmedbench --help", tmp_path)
    assert bare.returncode != 0
