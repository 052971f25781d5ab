"""House rules a reader of the code relies on: tests and code say what they pin down, not which
tracker entry asked for it (an issue number means nothing to someone who has no tracker)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ISSUE = re.compile(r"\bissue\s*#?\d+", re.IGNORECASE)


def test_no_code_or_test_cites_an_issue_number():
    found = []
    for folder in ("src", "tests", "benchmarks", "workflow", "scripts"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".smk", ".sh", ".yaml") and path.name != "Snakefile":
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                # test_docs.py's sample of a diary line is the one place an issue number must stay (it is what it rejects).
                if ISSUE.search(line) and not (path.name == "test_docs.py" and "sample =" in line):
                    found.append(f"{path.relative_to(ROOT)}:{n}")
    assert not found, f"cite the behaviour, not an issue number: {found}"


# Modules renamed for what they hold; their old names must not come back (a stale import, a page
# pointing a reader at a file that is gone). Dated benchmark records keep the names of their day.
OLD_NAMES = re.compile(
    r"ckpt_io|state_device|fedmedbench\.fl\.state\b|fl/state\.py|fedmedbench\.scaffold|scaffold\.py|"
    r"fl\.transport\b|fl/transport\.py|report\.(?:fairness|ampnorm)\b|report/(?:fairness|ampnorm)\.py"
)


def test_no_old_module_name_is_left():
    pages = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").rglob("*.md")]
    code = [
        p
        for folder in ("src", "tests", "workflow")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".smk", ".yaml")
    ]
    code += [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "benchmarks").glob("*.sh")]
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in [*pages, *code]
        if p != Path(__file__)
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if OLD_NAMES.search(line)
    ]
    assert not found, f"old module names: {found}"
