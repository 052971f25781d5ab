"""The reader of every YAML file a user gives (config, overlays, profiles' config files): a key given
twice and an alias bomb are refused in one line naming the file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fedmedbench import config as cfgmod
from fedmedbench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]

# Nine levels of nine aliases: 9**9 (387 million) "lol" once expanded, from a 600-byte file,
# referenced from a real key of the config.
BOMB = "\n".join(
    ['lol0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    + ["tasks:", "  prostate:", "    clients: *l8", ""]
)


def write(tmp_path: Path, text: str, name: str = "overlay.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "key", "lines"),
    [
        ("run_name: a\nresults_dir: r\nrun_name: b\n", "run_name", (1, 3)),
        ("tasks:\n  prostate:\n    rounds: 5\n    local_epochs: 1\n    rounds: 50\n", "rounds", (3, 5)),
        ("methods: {fedprox: {mu: 0.1, mu: 0.01}}\n", "mu", (1, 1)),
        ("data:\n  mine:\n    mask_values:\n      0: 0\n      255: 1\n      0: 2\n", 0, (4, 6)),
    ],
)
def test_a_key_given_twice_is_refused_naming_file_key_and_both_lines(tmp_path, text, key, lines):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        cfgmod.read_yaml(path)
    assert str(err.value).startswith(
        f"{path}: key {key!r} is given twice in the same mapping, on lines {lines[0]} and {lines[1]}"
    ), err.value
    # not a duplicate: the same key in two mappings, and a key after a merge key (`<<`) that overrides the merged one
    path = write(tmp_path, "a: {x: 1}\nb: {x: 2}\nbase: &base {lr: 1, rounds: 2}\nc:\n  <<: *base\n  lr: 3\n")
    assert cfgmod.read_yaml(path) == {
        "a": {"x": 1},
        "b": {"x": 2},
        "base": {"lr": 1, "rounds": 2},
        "c": {"lr": 3, "rounds": 2},
    }


def test_a_duplicate_key_stops_load_config_and_the_cli(tmp_path, capsys):
    from fedmedbench import cli

    path = write(tmp_path, "tasks:\n  prostate:\n    rounds: 5\n    rounds: 50\n")
    with pytest.raises(ConfigError, match="key 'rounds' is given twice"):
        cfgmod.load_config(ROOT / "config" / "config.yaml", path)
    assert cli.main(["estimate", "--config", str(ROOT / "config" / "config.yaml"), str(path)]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"{path}: key 'rounds' is given twice in the same mapping, on lines 3 and 4" in line


def test_an_alias_bomb_is_refused_within_a_second_naming_the_file_and_key(tmp_path):
    path = write(tmp_path, BOMB)
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        cfgmod.load_config(ROOT / "config" / "config.yaml", path)
    assert time.perf_counter() - started < 1.0
    prefix = f"{path}: tasks.prostate.clients: its aliases (*name) expand to "
    assert str(err.value).startswith(prefix), err.value
    assert (
        int(str(err.value)[len(prefix) :].split()[0].replace(",", "")) > 9**9
    )  # every "lol", and the lists holding them
    assert f"more than the {cfgmod.MAX_YAML_VALUES:,} a config file may hold" in str(err.value)


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path):
    path = write(tmp_path, "tasks: &t {prostate: {clients: *t}}\n")
    with pytest.raises(ConfigError, match=f"^{path}: an alias \\(\\*name\\) inside its own anchor"):
        cfgmod.read_yaml(path)


def test_every_shipped_yaml_file_is_far_below_the_bound():
    """The bound leaves room: the largest config we ship (about 2,000 values) is 40 times smaller."""
    shipped = [ROOT / "config" / "config.yaml", *ROOT.glob("workflow/profiles/*/*.yaml"), *ROOT.glob("examples/*.yaml")]
    for path in shipped:
        cfgmod.read_yaml(path)  # no duplicate key either
    assert cfgmod.MAX_YAML_VALUES >= 40 * 2019
