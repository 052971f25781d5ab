"""`fedmedbench --help` for people: the commands a person types listed apart from the
pipeline's internal steps, a help line for every subcommand and option, plain text (no reST)."""

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest

from fedmedbench.cli import build_parser

COMMANDS = ["check-data", "methods", "new-method", "estimate", "train", "with-jobserver", "federation"]
# Every internal step the Snakefile's rules run (a subset check: a new step needs a help line, not an edit here).
SOME_STEPS = {
    "fetch",
    "extract",
    "synthesize",
    "preprocess",
    "split",
    "collect",
    "table",
    "figure",
    "report",
    "ood-table",
}


def help_of(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*argv, "--help"])
    assert exit_.value.code == 0
    return out.getvalue()


def sections(text: str) -> dict[str, list[str]]:
    """Heading (a line ending in ':' at column 0, as argparse and our steps list write them) -> its lines."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = out.setdefault(line, [])
        elif not line.strip():
            current = None
        elif current is not None:
            current.append(line)
    return out


def entries(lines: list[str], indent: int) -> dict[str, str]:
    """Entries at exactly `indent` spaces -> their help, joined with its continuation lines (deeper
    indented; argparse puts a long name's help on the next line)."""
    out: dict[str, str] = {}
    name = None
    for line in lines:
        depth = len(line) - len(line.lstrip())
        if depth == indent:
            name, *text = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            out[name] = text[0] if text else ""
        elif depth > indent and name is not None:
            out[name] = f"{out[name]} {line.strip()}".strip()
    return out


@pytest.fixture(autouse=True)
def fixed_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal: one layout for the test


def top_level() -> tuple[dict[str, str], dict[str, str]]:
    parts = sections(help_of())
    commands = entries(parts["commands:"], 4)
    steps_heading = next(h for h in parts if h.startswith("pipeline steps"))
    return commands, entries(parts[steps_heading], 2)


def test_help_lists_a_persons_commands_apart_from_the_pipeline_steps():
    commands, steps = top_level()
    assert list(commands) == COMMANDS
    assert SOME_STEPS <= set(steps)
    assert not set(commands) & set(steps)
    # Every subcommand argparse knows (its error for an unknown one lists them) is in one of the two groups.
    known = re.search(
        r"invalid choice: 'nonexistent-command' \(choose from (.*)\)", _error_of("nonexistent-command")
    ).group(1)
    assert set(commands) | set(steps) == set(re.findall(r"'([^']+)'", known))
    assert all(commands.values()) and all(steps.values()), (commands, steps)


def _error_of(*argv: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        build_parser().parse_args(list(argv))
    return err.getvalue()


def subcommands() -> list[str]:
    commands, steps = top_level()
    return [*commands, *steps]


def test_every_subcommand_and_option_has_a_help_line():
    checked = 0
    for name in subcommands():
        text = help_of(name)
        # The description (after the usage block): the subcommand's own help line.
        description = text.split("\n\n")[1].strip()
        assert description and not description.endswith(":"), f"{name}: no description\n{text}"
        parts = sections(text)
        options = {**entries(parts.get("positional arguments:", []), 2), **entries(parts["options:"], 2)}
        assert "-h, --help" in options
        for option, help_line in options.items():
            assert help_line, f"fedmedbench {name}: {option} has no help line\n{text}"
            checked += 1
    assert checked > 80  # every subcommand's options were read (26 subcommands, ~3-12 options each)


def test_help_is_plain_text_without_rest_markup():
    texts = {"fedmedbench": help_of(), **{name: help_of(name) for name in subcommands()}}
    for name, text in texts.items():
        assert "``" not in text, name
        assert "`" not in text, name  # not even Markdown/reST interpreted text: a terminal shows the backticks
        assert not re.search(r":[a-z]+:`", text), name
        assert not re.search(r"^\s*\.\. ", text, re.M), name


def test_python_m_fedmedbench_help_shows_the_groups():
    result = subprocess.run(
        [sys.executable, "-m", "fedmedbench", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert result.returncode == 0, result.stderr
    assert "commands:" in result.stdout and "pipeline steps" in result.stdout
    # The person's commands come first, the steps after them.
    assert (
        result.stdout.index("with-jobserver") < result.stdout.index("\n  fetch ") < result.stdout.index("\n  report ")
    )


def test_a_step_still_parses_as_before():
    """Listing steps apart changes no parsing: a step's arguments read as Snakemake passes them."""
    args = build_parser().parse_args(
        ["split", "prostate", "--protocol", "harmofl", "--store", "s", "--out", "o.csv", "--seed", "3"]
    )
    assert (args.command, args.dataset, args.protocol, args.store, args.out, args.seed, args.permutation) == (
        "split",
        "prostate",
        "harmofl",
        "s",
        "o.csv",
        3,
        "default",
    )
    args = build_parser().parse_args(["with-jobserver", "snakemake", "--cores", "2", "-n"])
    assert args.cmd == ["snakemake", "--cores", "2", "-n"]


# --- the habits of other tools: Snakemake's --configfile, --version, defaults, unknown options ---------


def test_every_config_option_is_also_configfile_and_shows_its_default_as_a_value():
    with_config = [name for name in subcommands() if "--config" in help_of(name)]
    assert sorted(with_config) == ["check-data", "estimate", "methods", "train"]
    for name in with_config:
        text = help_of(name)
        assert re.search(r"^  --configfile \S*FILE .*, --config ", text, re.MULTILINE), name
        for spelling in ("--configfile", "--config"):
            extra = ["--out", "o"] if name == "train" else []
            args = build_parser().parse_args([name, spelling, "a.yaml", "b.yaml", *extra])
            assert args.config == ["a.yaml", "b.yaml"], (name, spelling)
    assert build_parser().parse_args(["estimate"]).config == ["config/config.yaml"]
    assert "(default: config/config.yaml)" in " ".join(help_of("estimate").split())
    for name in subcommands():  # a list default would print as ['...']
        assert "['" not in help_of(name) and "default: [" not in help_of(name), name


def test_version_prints_the_version_and_the_git_commit():
    from fedmedbench import CHECKOUT, version

    result = subprocess.run([sys.executable, "-m", "fedmedbench", "--version"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"fedmedbench {version()}") and version() == "0.1.0"
    if (CHECKOUT / ".git").exists():
        head = subprocess.run(
            ["git", "-C", str(CHECKOUT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        assert f"(git commit {head}" in result.stdout and len(head) == 12


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["estimate", "--sharing_gain", "2"], "--sharing-gain"),
        (["train", "--out", "o", "--seeds", "2"], "--seed"),
        (["new-method", "x", "--output", "y"], "--out"),
        (["check-data", "--datasets", "d"], "--dataset"),
    ],
)
def test_an_unknown_option_gets_the_commands_usage_and_closest_option(argv, suggestion):
    err = _error_of(*argv)
    assert err.startswith(f"usage: fedmedbench {argv[0]} "), err
    [error] = [line for line in err.splitlines() if "error:" in line]
    assert error.startswith(f"fedmedbench {argv[0]}: error: unrecognized arguments: ") and error.endswith(
        f"(did you mean '{suggestion}'?)"
    )
    assert "usage: fedmedbench [-h]" not in err  # not the top level's usage
    assert "did you mean" not in _error_of("estimate", "--zzzzzzzz")  # nothing close: no suggestion
