"""The documentation as its readers meet it: links that resolve, commands that parse, numbers that
match their result files, pages that say whom they are for, and no page that reads as a work log.

Cheap by design: commands are parsed (``--help`` for our CLI, Snakemake's own argument parser), and one
Snakemake dry run (marked slow) plans the README's run step. The pages whose command blocks other tests
run (docs/data.md, docs/extending.md, docs/federation.md) are only checked for being run or marked.
"""

from __future__ import annotations

import csv
import functools
import re
import shlex
import statistics
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import docs_numbers  # noqa: E402

README = ROOT / "README.md"
DOCS = ROOT / "docs"
USER_GUIDE = [
    DOCS / n for n in ("data.md", "extending.md", "federation.md", "troubleshooting.md", "cost.md", "index.md")
]
# Pages whose command blocks their owners' tests run (tests that read the page and execute its blocks).
RUN_BY_OTHER_TESTS = [DOCS / n for n in ("data.md", "extending.md", "federation.md")]
REMOVED = ("docs/decisions.md", "docs/performance.md", "docs/reliability.md")


def doc_pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- Markdown helpers ----------------------------------------------------------------------------------

FENCE = re.compile(r"^(```|~~~)(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^\1[ \t]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
MARK = re.compile(r"<!--\s*(needs|run-by):[^>]*-->\s*$")


def without_code(text: str) -> str:
    """The page with fenced blocks and inline code spans blanked (links and words outside code only)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return re.sub(r"`[^`\n]*`", "``", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


@functools.cache
def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for line in without_code(page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def command_blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """(line, body, marker) of every shell block; marker = the HTML comment right above it, if any."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for m in FENCE.finditer(text):
        if m.group("lang") not in ("bash", "sh", "shell", "console"):
            continue
        above = text[: m.start()].rstrip("\n").splitlines()
        marker = above[-1].strip() if above and MARK.match(above[-1].strip()) else None
        blocks.append((text[: m.start()].count("\n") + 1, m.group("body"), marker))
    return blocks


def commands(body: str) -> list[list[str]]:
    """Each command of a block as argv: continuation lines joined, comments and env settings dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        for part in re.split(r"\s*(?:&&|;)\s*", line.split(" #")[0].strip()):
            if not part or part.startswith("#"):
                continue
            argv = shlex.split(part)
            while argv and re.match(r"^[A-Z_]+=", argv[0]):
                argv = argv[1:]
            if argv and argv[0] != "export":
                out.append(argv)
    return out


# --- links ---------------------------------------------------------------------------------------------


def linked_pages() -> list[Path]:
    return [
        *doc_pages(),
        ROOT / "CHANGELOG.md",
        ROOT / "config" / "README.md",
        *sorted((ROOT / "benchmarks" / "results").glob("*.md")),
    ]


@pytest.mark.parametrize("page", linked_pages(), ids=rel)
def test_every_relative_link_resolves_to_a_file_and_anchor(page):
    broken = []
    for m in LINK.finditer(without_code(page.read_text(encoding="utf-8"))):
        target = m.group("target")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading with anchor #{anchor})")
    assert not broken, f"{rel(page)}: " + "; ".join(broken)


def test_the_slug_rule_is_githubs():
    assert slug("Adapted and official-rule rows") == "adapted-and-official-rule-rows"
    assert slug("Your own data (`family: folders`)") == "your-own-data-family-folders"
    assert slug("Fed-LWR: how the layer similarity δ is measured") == "fed-lwr-how-the-layer-similarity-δ-is-measured"


def test_no_reference_to_a_removed_page_is_left():
    sources = [
        README,
        *DOCS.rglob("*.md"),
        *(ROOT / "src").rglob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "workflow").rglob("*"),
        *(ROOT / "config").rglob("*"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "benchmarks").glob("*.sh"),
        ROOT / "Makefile",
        ROOT / "pyproject.toml",
    ]
    found = []
    for path in sources:
        if not path.is_file() or path == Path(__file__) or path.suffix == ".pyc":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{rel(path)}: {name}" for name in REMOVED if name in text]
    assert not found, "references to removed pages: " + "; ".join(found)


# --- command blocks ------------------------------------------------------------------------------------


def test_the_readme_keeps_the_two_commands_a_new_user_types():
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text


@functools.cache
def cli_help(*subcommand: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "fedmedbench", *subcommand, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert result.returncode == 0, f"fedmedbench {' '.join(subcommand)} --help: {result.stderr[-2000:]}"
    return result.stdout


def _env():
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _fedmedbench_subcommand(argv: list[str]) -> list[str] | None:
    """The subcommand words of `python -m fedmedbench SUB [SUB2] ...` or `fedmedbench ...`, else None."""
    if argv[:3] in (["python", "-m", "fedmedbench"], ["python3", "-m", "fedmedbench"]):
        rest = argv[3:]
    elif argv[:1] == ["fedmedbench"]:
        rest = argv[1:]
    else:
        return None
    while rest and rest[0] in ("-v", "--verbose"):
        rest = rest[1:]
    words = []
    for word in rest:
        if word.startswith("-"):
            break
        words.append(word)
        if len(words) == 1 and f"\n    {word} " not in cli_help() and f"\n    {word}\n" not in cli_help():
            break  # a one-level command: the next word is an argument
        if len(words) == 2:
            break
    return words


def check_command(argv: list[str], where: str) -> None:
    """A command of a page parses: our CLI's subcommand and every option it uses exist (``--help``);
    a snakemake line parses with Snakemake's own argument parser; make targets exist."""
    sub = _fedmedbench_subcommand(argv)
    if sub is not None:
        while sub:
            try:
                text = cli_help(*sub)
                break
            except AssertionError:
                sub = sub[:-1]  # `new-method NAME`: NAME is an argument, not a subcommand
        else:
            raise AssertionError(f"{where}: {' '.join(argv)}: no such fedmedbench command")
        missing = [a.split("=")[0] for a in argv if a.startswith("--") and a.split("=")[0] not in text]
        assert not missing, (
            f"{where}: {' '.join(argv)}: options {missing} are not in `fedmedbench {' '.join(sub)} --help`"
        )
    elif argv[0] == "snakemake":
        from snakemake.cli import get_argument_parser

        try:
            get_argument_parser().parse_args(argv[1:])
        except SystemExit as exit_:
            raise AssertionError(f"{where}: Snakemake cannot parse {' '.join(argv)}") from exit_
    elif argv[0] == "make":
        makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
        for target in [a for a in argv[1:] if "=" not in a and not a.startswith("-")]:
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{where}: make {target}: no such target"
    elif argv[:2] in (["python", "benchmarks/paper_shaped_stores.py"], ["python", "benchmarks/bench_engine.py"]):
        assert (ROOT / argv[1]).exists(), f"{where}: {argv[1]} does not exist"


def guide_pages() -> list[Path]:
    return [README, *[p for p in USER_GUIDE if p not in RUN_BY_OTHER_TESTS and p.exists()]]


@pytest.mark.parametrize("page", guide_pages(), ids=rel)
def test_every_command_of_the_readme_and_the_user_guide_parses(page):
    for line, body, _marker in command_blocks(page):
        for argv in commands(body):
            check_command(argv, f"{rel(page)}:{line}")


@pytest.mark.parametrize("page", guide_pages(), ids=rel)
def test_an_unmarked_block_runs_on_a_fresh_checkout(page):
    """A block without a `<!-- needs: ... -->` mark must be runnable as is: make targets, --help, or a
    dry run; a command that needs real data or a GPU says so."""
    for line, body, marker in command_blocks(page):
        if marker:
            continue
        for argv in commands(body):
            assert argv[0] in ("make", "snakemake") or _fedmedbench_subcommand(argv) is not None, (
                f"{rel(page)}:{line}: `{' '.join(argv)}` is neither run by a test nor marked "
                "(put <!-- needs: real-data --> or <!-- needs: gpu --> above the block)"
            )


@pytest.mark.parametrize("page", [p for p in RUN_BY_OTHER_TESTS if p.exists()], ids=rel)
def test_the_blocks_of_the_pages_other_tests_run_are_run_or_marked(page):
    """Every block of these pages is either run by a test (a test under tests/ reads the page) or marked."""
    readers = [
        t
        for t in (ROOT / "tests").glob("test_*.py")
        if t.name != Path(__file__).name and rel(page) in t.read_text(encoding="utf-8")
    ]
    unmarked = [line for line, _body, marker in command_blocks(page) if marker is None]
    assert readers or not unmarked, (
        f"{rel(page)}: blocks at lines {unmarked} are neither marked nor read by any test under tests/"
    )


@pytest.mark.slow
def test_the_readmes_plan_step_is_a_valid_dry_run(tmp_path):
    """The README's configure step (`snakemake -n --configfile ...`) plans the real config's DAG."""
    overlay = tmp_path / "my_changes.yaml"
    overlay.write_text("selected_experiments: [harmofl_table1_prostate]\n")
    result = subprocess.run(
        ["snakemake", "-n", "-q", "--configfile", "config/config.yaml", str(overlay)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


# --- numbers that cannot go stale ----------------------------------------------------------------------


def test_every_generated_number_equals_its_result_file():
    assert docs_numbers.main(["--check"]) == 0


def test_a_number_edited_by_hand_is_caught(tmp_path):
    page = DOCS / "cost.md"
    text = page.read_text(encoding="utf-8")
    assert "<!-- generated:h200-engine -->" in text
    tampered = text.replace("| prostate | UNet-32 | 384 | 16 | ", "| prostate | UNet-32 | 384 | 32 | ", 1)
    assert tampered != text
    assert docs_numbers.update(tampered, page) == text


def test_every_generated_block_names_a_known_result_file():
    for page in docs_numbers.pages():
        if page.exists():
            for m in docs_numbers.BLOCK.finditer(page.read_text(encoding="utf-8")):
                assert m.group("name") in docs_numbers.BLOCKS, f"{rel(page)}: unknown block {m.group('name')}"
    for csv_name, record, _ in docs_numbers.BLOCKS.values():
        assert (docs_numbers.RESULTS / csv_name).exists() and (docs_numbers.RESULTS / record).exists()


def test_the_demo_wall_time_summary_is_the_median_and_mean_of_its_runs():
    results = ROOT / "benchmarks" / "results"
    with open(results / "2026-12-02-demo-wall-time.csv", newline="", encoding="utf-8") as f:
        runs = list(csv.DictReader(f))
    with open(results / "2026-12-02-demo-wall-time-summary.csv", newline="", encoding="utf-8") as f:
        summary = {row["commit"]: row for row in csv.DictReader(f)}
    assert set(summary) == {run["commit"] for run in runs}
    for commit, row in summary.items():
        walls = [float(r["wall (s)"]) for r in runs if r["commit"] == commit]
        jobs = [float(r["training jobs summed (s)"]) for r in runs if r["commit"] == commit]
        assert int(row["runs"]) == len(walls)
        assert float(row["wall: median (s)"]) == round(statistics.median(walls))
        assert float(row["wall: mean (s)"]) == round(statistics.mean(walls))
        assert row["wall: range (s)"] == f"{min(walls):.0f}–{max(walls):.0f}"
        assert float(row["training jobs summed: median (s)"]) == round(statistics.median(jobs))
        assert float(row["training jobs summed: mean (s)"]) == round(statistics.mean(jobs))


def test_every_benchmark_record_names_its_machine_commit_and_command():
    for record in sorted((ROOT / "benchmarks" / "results").glob("*.md")):
        assert re.match(r"\d{4}-\d{2}-\d{2}-", record.name), f"{record.name}: not dated"
        head = record.read_text(encoding="utf-8")[:3000].lower()
        for word in ("machine", "commit", "command"):
            assert word in head, f"{rel(record)}: does not say its {word}"


# --- pages by reader, sizes, no work log ---------------------------------------------------------------


def test_the_readme_fits_one_screen():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 130, f"README.md has {lines} lines (at most 130)"


def test_the_user_guide_is_under_ten_thousand_words():
    """The pages a reader reads through; troubleshooting.md is looked up by message, one row at a time
    (its rows are bounded instead, below)."""
    words = {
        rel(p): len(re.findall(r"\S+", p.read_text(encoding="utf-8")))
        for p in USER_GUIDE
        if p.exists() and p.name != "troubleshooting.md"
    }
    assert sum(words.values()) < 10_000, words


def test_each_troubleshooting_row_is_short():
    """A row is the message, its cause, what to do and the test that pins it: a paragraph at most."""
    rows = [
        line
        for line in (DOCS / "troubleshooting.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and not line.startswith("| message") and not re.match(r"^\|\s*-", line)
    ]
    long_rows = [row[:60] for row in rows if len(re.findall(r"\S+", row)) > 150]
    assert rows and not long_rows, f"troubleshooting.md rows over 150 words: {long_rows}"


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=rel)
def test_each_page_says_on_its_first_line_whom_it_is_for(page):
    first = page.read_text(encoding="utf-8").splitlines()[0] if page.read_text(encoding="utf-8") else ""
    assert re.match(r"^> \*\*For [^*]+\*\*", first), (
        f"{rel(page)}: the first line must say whom the page is for, e.g. '> **For users** who ...'; got {first!r}"
    )


WORK_LOG = [
    (r"\bsessions?\b", "a work session"),
    (r"\bload averages?\b", "a machine's load while measuring"),
    (r"--against\s+[0-9a-f]{7}", "a commit to compare against"),
    (r"\bagainst [0-9a-f]{7,40}\b", "a commit to compare against"),
    (r"\bissues? #?\d+", "an issue reference"),
    (r"\baudit", "who checked what"),
    (r"\b(?:other|another) helpers?\b|\bhelpers?'s?\b", "who changed what"),
    (r"\b(?:first|second|third|fourth|fifth|sixth) (?:session|work period|call)\b", "a numbered work period"),
    (r"\bwork periods?\b", "a numbered work period"),
    (
        r"(?<![\w/.-])20\d\d-\d\d-\d\d(?![\w.-])",
        "the date of a work period (dated results live in benchmarks/results/)",
    ),
    (r"\b(?:yesterday|this morning|today we|we tried|I tried)\b", "a diary"),
]


@pytest.mark.parametrize("page", doc_pages(), ids=rel)
def test_no_page_reads_as_a_work_log(page):
    """History belongs in CHANGELOG.md and git, measurements in benchmarks/results/ (both exempt)."""
    text = page.read_text(encoding="utf-8")
    hits = []
    for pattern, why in WORK_LOG:
        for m in re.finditer(pattern, text, re.I):
            line = text[: m.start()].count("\n") + 1
            hits.append(f"line {line}: {m.group(0)!r} ({why})")
    assert not hits, f"{rel(page)}: " + "; ".join(hits)


def test_the_work_log_patterns_bite():
    sample = "Fourth session: load average 1.4, bench --against b180df5 (issue 23, an audit on 2026-11-25)."
    assert all(re.search(p, sample, re.I) for p, _ in WORK_LOG[:6])
    assert not re.search(WORK_LOG[9][0], "[2026-11-26-h200.md](../benchmarks/results/2026-11-26-h200.md)")


# --- troubleshooting: each message is the one its test produces ----------------------------------------

TEST_CELL = re.compile(r"`(tests/test_\w+\.py)(?:::(\w+))?`")


def troubleshooting_rows() -> list[tuple[int, str, str, str | None]]:
    page = DOCS / "troubleshooting.md"
    rows = []
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not line.startswith("|") or set(cells[0]) <= {"-"} or cells[0] == "message":
            continue
        m = TEST_CELL.search(cells[-1])
        if m:
            rows.append((n, cells[0], m.group(1), m.group(2)))
    return rows


def test_troubleshooting_cites_a_test_for_most_rows():
    assert len(troubleshooting_rows()) >= 30


@pytest.mark.parametrize("row", troubleshooting_rows(), ids=lambda r: f"line{r[0]}")
def test_each_troubleshooting_message_is_checked_by_the_test_it_cites(row):
    line, message, test_file, test_name = row
    path = ROOT / test_file
    assert path.exists(), f"troubleshooting.md:{line}: {test_file} does not exist"
    source = path.read_text(encoding="utf-8")
    if test_name:
        assert re.search(rf"^\s*def {test_name}\(", source, re.M), (
            f"troubleshooting.md:{line}: no test {test_file}::{test_name}"
        )
    plain = source.replace("\\", "")
    quoted = re.findall(r"`([^`]+)`", message)
    # The page's message is the example a user sees; the test checks it with placeholders ({client},
    # regular expressions), so its literal phrases (between quotes, brackets, numbers, …) are compared.
    pieces = [p.strip(" .,") for q in quoted for p in re.split(r"…|<[^>]*>|[(){}\[\];:'\"=0-9]", q)]
    pieces = [p for p in pieces if len(p) >= 8]
    assert pieces, f"troubleshooting.md:{line}: no message text to check"
    assert any(p in plain for p in pieces), (
        f"troubleshooting.md:{line}: none of {pieces} appears in {test_file}: the message the page quotes is not the one the test checks"
    )


# --- the reviewer's guide names keys that exist ---------------------------------------------------------


def _method_defaults() -> dict[str, dict]:
    import ast

    found = {}
    for path in (ROOT / "src" / "fedmedbench" / "methods").glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DEFAULTS":
                found[path.stem] = ast.literal_eval(node.value)
    return found


@pytest.mark.parametrize("page", sorted((DOCS / "reviewers").glob("*.md")), ids=rel)
def test_every_switch_the_reviewers_guide_names_is_a_real_key(page):
    """`methods.<m>.<param>` against the method's DEFAULTS, `tasks.<t>.<key>` and `key: value` switches
    against the schema and every method's parameters."""
    defaults = _method_defaults()
    schema = (ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8")
    text = page.read_text(encoding="utf-8")
    unknown = []
    for meth, key in re.findall(r"`methods\.([a-z]+)\.([a-z_]+)", text):
        if meth not in defaults or (key not in defaults[meth] and key != "variants"):
            unknown.append(f"methods.{meth}.{key}")
    for key in re.findall(r"`tasks\.(?:<t>|<task>|[a-z_]+)\.([a-z_]+)", text):
        if not re.search(rf"\b{key}:", schema):
            unknown.append(f"tasks.<t>.{key}")
    for key in re.findall(r"`([a-z_]+): [^`]+`", text):
        if not (any(key in d for d in defaults.values()) or re.search(rf"\b{key}:", schema)):
            unknown.append(key)
    assert not unknown, f"{rel(page)}: keys that neither a method nor the schema has: {unknown}"
