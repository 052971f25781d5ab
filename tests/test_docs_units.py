"""No number with a unit in the README, docs/ or a benchmark record that a run produced, unless a generated
block holds it.

A measurement goes stale the day the code changes, so the pages quote one only inside a generated block
(``<!-- generated:NAME -->``, written from its result file by ``scripts/docs_numbers.py`` and checked by
``tests/test_docs.py``). This test scans README.md, docs/**/*.md and the benchmark records
(``benchmarks/results/*.md``) for numbers with a unit (ms, s, min, h, kB, MB, GB, TB, MiB, GiB, ×, %)
outside those blocks and outside code, and fails on any not in ``ALLOWED``: constants that no run of ours
produces (paper values, defaults, settings, published sizes), each with its reason. A measurement is never
allow-listed.

A record is held to the same rule: its summary tables are blocks written from the CSV beside it (the CSV is
the measurement; the record says how it was taken), and its prose points at those tables rather than
repeating their values. One narrow exception: the row of a record's header table whose first cell is
``machine`` (``| machine | ... 2 CPUs, 23 GiB ... |``) describes the machine, not a run's result, and is not
scanned; only that row, so a measurement elsewhere in the record is still caught.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

GENERATED = re.compile(r"<!-- generated:[a-z0-9-]+ -->\n.*?<!-- /generated -->", re.S)
FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?^[ \t]*\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
NUMBER = re.compile(
    r"(?<![\w.])(?:~|≈|about |under |up to |< ?)?\d[\d,]*(?:\.\d+)?(?:\s?[–-]\s?\d[\d,]*(?:\.\d+)?)?\s?"
    r"(?:min|ms|s|h|kB|KB|MB|GB|TB|MiB|GiB|×|%)(?!\w)"
)
# The machine row of a record's header table (a fact about the machine, not a run's result).
MACHINE_ROW = re.compile(r"^\|\s*machine\s*\|[^\n]*$", re.M | re.I)
RECORDS = ROOT / "benchmarks" / "results"

# (page, the number as written, why it may stay). Keep it short: a number a run produced is generated or removed.
ALLOWED: list[tuple[str, str, str]] = [
    ("README.md", "24 GB", "the SLURM profile's memory request (a default)"),
    ("README.md", "~35 GB", "Camelyon17's archive, extraction and store (docs/data/camelyon17.md: sizes, not timings)"),
    ("README.md", "~10 GB", "HAM10000 and ISIC 2017 archives' published sizes"),
    ("README.md", "~1–2 GB", "the other datasets' archives and stores (sizes)"),
    ("docs/cost.md", "up to 3.5 s", "Flower 1.42's fixed waits (its source)"),
    ("docs/cost.md", "3 s", "Flower 1.42's SuperNode sleep (its source)"),
    ("docs/cost.md", "0.1 s", "the benchmark patch's wait (a setting)"),
    ("docs/data/camelyon17.md", "about 10.7 GB", "WILDS' published archive size"),
    ("docs/data/camelyon17.md", "10.7 GB", "WILDS' published archive size"),
    ("docs/data/camelyon17.md", "455,954 ×", "the store's shape (arithmetic)"),
    ("docs/data/camelyon17.md", "96 ×", "the store's shape (arithmetic)"),
    ("docs/data/camelyon17.md", "12.6 GB", "455,954 × 96 × 96 × 3 bytes (arithmetic)"),
    ("docs/data/camelyon17.md", "35 GB", "archive + extraction + store (sizes)"),
    ("docs/data/camelyon17.md", "6.7 MB", "the seeded synthetic twin's size at its defaults (deterministic)"),
    ("docs/data/camelyon17.md", "6 MB", "the seeded synthetic archive's size at its defaults (deterministic)"),
    ("docs/data/fundus.md", "≈0.8 GB", "the store's shape at 384 px (arithmetic)"),
    ("docs/data/fundus.md", "25 %", "MAX_OFF_LEVEL_FRACTION (a default)"),
    (
        "docs/data/fundus.md",
        "3–6 %",
        "off-level pixels of the seeded synthetic twin's masks (deterministic, not a timing)",
    ),
    ("docs/data/fundus.md", "under 1 %", "off-level pixels at 384 px (deterministic)"),
    ("docs/data/fundus.md", "1 %", "the alternative threshold discussed"),
    ("docs/data/nuclei.md", "about 600 MB", "MoNuSAC's published zip sizes (eva's docs)"),
    ("docs/data/nuclei.md", "about 25 MB", "TNBC's published archive size"),
    ("docs/data/nuclei.md", "about 80 MB", "the store's shape, 388 × 256 × 256 × 3 bytes (arithmetic)"),
    ("docs/data/nuclei.md", "about 5 MB", "the seeded synthetic archive's size at its defaults (deterministic)"),
    ("docs/data/skin.md", "≈540 MB", "the store's shape at 128 px (arithmetic)"),
    ("docs/data/skin.md", "≈1.3 GB", "the archive's published size"),
    ("docs/data/skin.md", "≈1.4 GB", "the archive's published size"),
    ("docs/data.md", "~10 GB", "Camelyon17's published download size"),
    ("docs/data/nuclei.md", "0.5–1.3×", "MoNuSAC's image sizes against the default 256 px (data property)"),
    ("docs/engineering.md", "2×", "a test's growth factor"),
    ("docs/engineering.md", "4×", "a test's growth factor"),
    ("docs/engineering.md", "50 ms", "the ServerApp's first polling wait (a constant)"),
    ("docs/engineering.md", "2 s", "the hashing guard's window (a constant)"),
    ("docs/engineering.md", "0.1 s", "the ServerApp's polling bound (a constant)"),
    ("docs/engineering.md", "3 s", "Flower's Grid.send_and_receive wait (its source)"),
    ("docs/extending.md", "~30 %", "Dice incl. background of an all-background model (arithmetic of the metric)"),
    ("docs/federation.md", "30 s", "Flower's heartbeat interval (its default)"),
    ("docs/reviewers/fedlwr.md", "10 %", "CFFL's θ_u = 0.1 (a default)"),
    ("docs/reviewers/fedlwr.md", "0.3–0.5×", "the movement test's thresholds (constants of the test)"),
    ("docs/troubleshooting.md", "up to 10 s", "the SLURM plugin's timeout (its default)"),
    ("benchmarks/results/2026-11-23-dag-time.md", "10 s", "the SLURM plugin's scontrol timeout (its default)"),
    (
        "benchmarks/results/2026-11-28-test-tiers.md",
        "23 GiB",
        "the second machine's memory, in its heading (a machine fact)",
    ),
    (
        "benchmarks/results/2026-11-29-install.md",
        "about 3 GB",
        "the published size of the torch, torchvision and CUDA wheels",
    ),
    ("benchmarks/results/2026-11-29-install.md", "~0.2 GB", "the published size of PyTorch's CPU wheels"),
    ("benchmarks/results/2026-11-29-install.md", "~0.7 GB", "PyTorch's CPU wheels installed (their published sizes)"),
    ("benchmarks/results/2026-11-25-paper-scale-cpu.md", "256 MB", "bench_reader.py's synthetic store (a setting)"),
    (
        "benchmarks/results/2026-11-25-paper-scale-cpu.md",
        "2×",
        "tests/test_memory.py's growth factor (a constant of the test)",
    ),
    (
        "benchmarks/results/2026-11-25-paper-scale-cpu.md",
        "4×",
        "tests/test_memory.py's growth factor (a constant of the test)",
    ),
    (
        "benchmarks/results/2026-11-29-federation-rounds.md",
        "50 ms",
        "our ServerApp's first reply-polling wait (a setting)",
    ),
    (
        "benchmarks/results/2026-11-29-federation-rounds.md",
        "0.5 s",
        "the former polling bound and Flower's SuperNode wait step (settings, its source)",
    ),
    (
        "benchmarks/results/2026-11-29-federation-rounds.md",
        "0.1 s",
        "the polling bound and SuperExec interval we set (settings)",
    ),
    ("benchmarks/results/2026-11-29-federation-rounds.md", "100 ms", "the benchmark patch's wait (a setting)"),
    ("benchmarks/results/2026-11-29-federation-rounds.md", "up to 0.1 s", "the benchmark patch's wait (a setting)"),
    (
        "benchmarks/results/2026-11-29-federation-rounds.md",
        "1.3×",
        "the goal for ours ÷ engine (a constant of the issue)",
    ),
    ("benchmarks/results/2026-11-29-federation-rounds.md", "up to 0.5 s", "Flower 1.42's wait steps (its source)"),
    ("benchmarks/results/2026-11-29-federation-rounds.md", "up to 3 s", "Flower 1.42's SuperNode sleep (its source)"),
    ("benchmarks/results/2026-11-29-federation-rounds.md", "3 s", "Flower 1.42's sleeps (its source)"),
    ("benchmarks/results/2026-11-29-federation-rounds.md", "1 s", "Flower's SuperExec poll interval (its default)"),
    (
        "benchmarks/results/2026-12-02-checkpoint.md",
        "1.1 ×",
        "the target for file ÷ unique bytes (a goal, not a result)",
    ),
    (
        "benchmarks/results/2026-12-02-checkpoint.md",
        "1.5 ×",
        "the target for a write against torch.save (a goal, not a result)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "1.05×",
        "the goal for encoded ÷ floor bytes (a constant of the issue)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "1.3×",
        "the goal for federation ÷ engine time per round (a constant of the issue)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "3 s",
        "Flower 1.42's SuperNode sleep and Grid.send_and_receive wait (its source)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "up to 3 s",
        "Flower 1.42's SuperNode sleep (its source)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "1 s",
        "Flower's SuperExec poll interval and object-pull backoff (its source)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "0.5 s",
        "our ServerApp's polling bound and Flower's reply wait step (settings, its source)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "0.1 s",
        "the SuperExec poll interval we set (a setting)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "50 ms",
        "our ServerApp's first polling wait and the benchmark patch's wait (settings)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "1.0–2.5×",
        "the issue's expected range for Ray ÷ engine time per round (a constant of the issue)",
    ),
    (
        "benchmarks/results/2026-11-25-federation-and-simulators.md",
        "2.1–2.4×",
        "the issue's expected range for Ray ÷ engine memory (a constant of the issue)",
    ),
    (
        "benchmarks/results/2026-11-26-h200.md",
        "1.05×",
        "the goal for engine ÷ plain loop (a constant of the issue)",
    ),
    (
        "benchmarks/results/2026-11-26-h200.md",
        "2.5×",
        "the goal for several jobs per GPU (a constant of the issue)",
    ),
    (
        "benchmarks/results/2026-11-29-federation-rounds.md",
        "7 s",
        "two steps × (3 s + 0.5 s): the floor's bound from Flower's source (arithmetic)",
    ),
]
# Paper values: the papers' split fractions (20 % test, 80/20 train/validation, the last 20 % of rounds).
PAPER_PERCENT = {"20 %", "20%", "80 %"}


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(RECORDS.glob("*.md"))]


def numbers_with_units(text: str) -> list[str]:
    """The numbers with a unit of ``text`` outside generated blocks, fenced code and inline code."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = MACHINE_ROW.sub("", INLINE_CODE.sub("``", FENCE.sub(blank, GENERATED.sub(blank, text))))
    return [m.group(0) for m in NUMBER.finditer(text)]


def test_the_scanner_finds_numbers_with_units_and_skips_generated_blocks_and_code():
    page = (
        "A round takes 4.7 s, 2 min, 6.7 GB, 1.15×, 12 % and 3 h.\n<!-- generated:x -->\n| 9.9 s |\n"
        "<!-- /generated -->\n```bash\nsleep 5 s\n```\nSee `--wait 3 s`.\n"
    )
    assert numbers_with_units(page) == ["4.7 s", "2 min", "6.7 GB", "1.15×", "12 %", "3 h"]
    assert numbers_with_units("python 3.11 and 455,954 images, 1e-4, model 5.3") == []


def test_a_record_is_scanned_and_only_its_machine_row_is_exempt():
    assert RECORDS / "2026-11-29-install.md" in pages()
    record = (
        "# A benchmark (2026-12-09)\n\n| | |\n|---|---|\n| machine | AMD EPYC, 2 CPUs, 23 GiB, 16 GB swap |\n"
        "| commit | abc1234 |\n\n| task | s/round |\n|---|---|\n| prostate | 4.21 s |\n\n"
        "<!-- generated:x -->\n| prostate | 4.21 s |\n<!-- /generated -->\n\nA round took 38.5 ms, 55.7 MB.\n"
    )
    assert numbers_with_units(record) == ["4.21 s", "38.5 ms", "55.7 MB"]


@pytest.mark.parametrize("page", pages(), ids=lambda page: page.relative_to(ROOT).as_posix())
def test_no_page_quotes_a_measured_number_outside_a_generated_block(page):
    rel = page.relative_to(ROOT).as_posix()
    allowed = {re.sub(r"\s+", " ", number) for where, number, _ in ALLOWED if where == rel} | PAPER_PERCENT
    found = [n for n in numbers_with_units(page.read_text(encoding="utf-8")) if re.sub(r"\s+", " ", n) not in allowed]
    assert not found, (
        f"{rel}: numbers with units outside generated blocks: {found}. A number a run produced goes in a "
        "generated block (scripts/docs_numbers.py) or goes; a constant goes in ALLOWED with its reason"
    )


def test_every_allowed_number_is_still_on_its_page():
    """The allow-list stays small: an entry whose number left its page is removed."""
    stale = [
        f"{where}: {number}"
        for where, number, _ in ALLOWED
        if re.sub(r"\s+", " ", number)
        not in {re.sub(r"\s+", " ", n) for n in numbers_with_units((ROOT / where).read_text(encoding="utf-8"))}
    ]
    assert not stale, f"ALLOWED entries no longer on their page: {stale}"
