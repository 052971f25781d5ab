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
