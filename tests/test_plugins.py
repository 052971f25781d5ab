"""A method of one's own: found by module path or entry point, checked like a built-in at DAG time,
trained by the same engine (a plug-in equal to FedAvg gives FedAvg's numbers bit for bit)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedmedbench import config as cfgmod
from fedmedbench.errors import ConfigError
from fedmedbench.fl import engine
from fedmedbench.registry import forget
from tests.conftest import strip, tiny_run_config

ROOT = Path(__file__).resolve().parents[1]
BASE = cfgmod.load_config(ROOT / "config" / "config.yaml")

FEDAVG_TWIN = '''
"""FedAvg again, through nothing but the contract."""
from fedmedbench.fl.client import Client
from fedmedbench.fl.server import Server

DEFAULTS = {"strength": 0.5, "flag": False}
PARAM_SCHEMA = {"strength": {"type": "number", "minimum": 0, "maximum": 1}}
PERSONALIZED = False
'''


@pytest.fixture()
def plugin(tmp_path, monkeypatch):
    """A package ``my_lab`` with the module ``my_lab.fedtwin`` on sys.path."""
    package = tmp_path / "plugins" / "my_lab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "fedtwin.py").write_text(FEDAVG_TWIN)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    for name in [m for m in sys.modules if m == "my_lab" or m.startswith("my_lab.")]:
        monkeypatch.delitem(sys.modules, name)  # another test's my_lab, in another folder
    forget()
    yield package / "fedtwin.py"
    forget()


def with_plugin(section: dict, runs=("fedavg", "fedtwin")) -> dict:
    change = {
        "methods": {"fedtwin": {"module": "my_lab.fedtwin", **section}},
        "experiments": {"harmofl_table1_prostate": {"runs": list(runs)}},
    }
    return cfgmod.deep_merge(BASE, change)


def test_a_plugin_equal_to_fedavg_gives_fedavgs_numbers_bit_for_bit(tmp_path, tiny_task, plugin):
    store, split = tiny_task
    ours = engine.run_training(tiny_run_config(store, split, "fedavg"), tmp_path / "fedavg", progress=False)
    cfg = tiny_run_config(store, split, "fedtwin", method_module="my_lab.fedtwin")
    theirs = engine.run_training(cfg, tmp_path / "fedtwin", progress=False)
    assert strip(theirs) == strip(ours)
    assert (tmp_path / "fedtwin" / "history.csv").read_bytes() == (tmp_path / "fedavg" / "history.csv").read_bytes()
    assert theirs["config"]["method_params"] == {"strength": 0.5, "flag": False}


def test_a_plugin_is_validated_at_dag_time_like_a_builtin(plugin):
    cfgmod.validate(with_plugin({"strength": 0.2, "variants": {"strong": {"strength": 1.0}}}), "config.yaml")
    with pytest.raises(ConfigError, match=r"methods\.fedtwin: unknown key 'strenght' \(did you mean 'strength'\?\)"):
        cfgmod.validate(with_plugin({"strenght": 0.2}), "config.yaml")
    with pytest.raises(ConfigError, match=r"methods\.fedtwin\.strength: expected number >= 0 and <= 1, got 2"):
        cfgmod.validate(with_plugin({"strength": 2}), "config.yaml")
    with pytest.raises(ConfigError, match=r"methods\.fedtwin\.variants\.x \(run fedtwin-x\)\.flag: expected boolean"):
        cfgmod.validate(with_plugin({"variants": {"x": {"flag": "no"}}}), "config.yaml")


def test_a_missing_module_or_contract_or_a_clash_is_one_line(plugin):
    with pytest.raises(ConfigError, match=r"methods\.fedtwin\.module: cannot find module 'my_lab\.nope'"):
        cfgmod.validate(cfgmod.deep_merge(BASE, {"methods": {"fedtwin": {"module": "my_lab.nope"}}}), "config.yaml")
    with pytest.raises(ConfigError, match=r"cannot find module 'no_such_lab\.x'"):
        cfgmod.validate(cfgmod.deep_merge(BASE, {"methods": {"fedtwin": {"module": "no_such_lab.x"}}}), "config.yaml")
    plugin.write_text(FEDAVG_TWIN.replace("from fedmedbench.fl.client import Client\n", ""))
    forget()
    with pytest.raises(
        ConfigError, match=r"method 'fedtwin' \(my_lab\.fedtwin, .*fedtwin\.py\): the module lacks Client"
    ):
        cfgmod.validate(with_plugin({}), "config.yaml")
    with pytest.raises(ConfigError, match=r"methods\.fedavg\.module: 'fedavg' is a built-in method"):
        cfgmod.validate(cfgmod.deep_merge(BASE, {"methods": {"fedavg": {"module": "my_lab.fedtwin"}}}), "config.yaml")


def test_editing_the_plugin_changes_only_its_runs(plugin):
    config = with_plugin({})
    before = {run: cfgmod.resolve_run(config, "prostate", run, 0) for run in ("fedavg", "fedtwin")}
    assert before["fedtwin"]["method_module"] == "my_lab.fedtwin" and before["fedavg"]["method_module"] is None
    plugin.write_text(FEDAVG_TWIN + "\n# a change\n")
    forget()
    after = {run: cfgmod.resolve_run(config, "prostate", run, 0) for run in ("fedavg", "fedtwin")}
    assert after["fedavg"] == before["fedavg"]
    assert after["fedtwin"]["method_digest"] != before["fedtwin"]["method_digest"]


def run_cli(*args, pythonpath=()):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(ROOT / "src")])}
    return subprocess.run([sys.executable, "-m", "fedmedbench", *args], capture_output=True, text=True, env=env)


def installed_plugin(root: Path, name: str, entry_name: str) -> Path:
    """What `pip install` leaves: the package and a dist-info with the entry point."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "method.py").write_text(FEDAVG_TWIN)
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[fedmedbench.methods]\n{entry_name} = {name}.method\n")
    return root


def test_an_installed_entry_point_is_a_method_name_and_is_listed(tmp_path):
    site = installed_plugin(tmp_path / "site", "fedxyz_pkg", "fedxyz")
    listing = run_cli("methods", pythonpath=[site])
    assert listing.returncode == 0, listing.stderr
    line = next(line for line in listing.stdout.splitlines() if line.startswith("fedxyz "))
    assert "global" in line and "entry point of fedxyz_pkg" in line
    assert "parameters: strength=0.5, flag=False" in listing.stdout
    assert "fedavg " in listing.stdout and "built-in" in listing.stdout
    clash = run_cli("methods", pythonpath=[installed_plugin(tmp_path / "clash", "clash_pkg", "fedavg")])
    assert (
        clash.returncode == 1
        and "entry point 'fedavg' of clash_pkg (fedmedbench.methods) has the name of a built-in method" in clash.stderr
    )


def test_new_method_writes_a_package_that_passes_its_own_test(tmp_path):
    out = tmp_path / "fedxyz"
    made = run_cli("new-method", "fedxyz", "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert (
        '[project.entry-points."fedmedbench.methods"]\nfedxyz = "fedxyz.method"' in (out / "pyproject.toml").read_text()
    )
    method = (out / "src" / "fedxyz" / "method.py").read_text()
    for hook in (
        "receive(package)",
        "loss(x, y)",
        "after_backward()",
        "aggregate(round_index, replies)",
        "package(client_index, round_index)",
    ):
        assert hook in method, hook
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(out / "src"), str(ROOT / "src")])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out / "tests")],
        capture_output=True,
        text=True,
        env=env,
        cwd=out,
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert "1 passed" in result.stdout
    # examples/fedxyz is this command's output, kept in the repository; it must not drift from what the command writes.
    written = {
        f.relative_to(out): f.read_bytes() for f in out.rglob("*") if f.is_file() and "__pycache__" not in f.parts
    }
    example = ROOT / "examples" / "fedxyz"
    assert {f: (example / f).read_bytes() for f in written if (example / f).is_file()} == written
    again = run_cli("new-method", "fedxyz", "--out", str(out))
    assert again.returncode == 1 and "exists and is not empty" in again.stderr
    assert run_cli("new-method", "fedprox", "--out", str(tmp_path / "x")).returncode == 1


def test_the_methods_listing_includes_config_plugins(tmp_path, plugin):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        textwrap.dedent("""
        methods:
          fedtwin: {module: my_lab.fedtwin, strength: 0.1}
    """)
    )
    listing = run_cli(
        "methods", "--config", str(ROOT / "config" / "config.yaml"), str(overlay), pythonpath=[plugin.parents[1]]
    )
    assert listing.returncode == 0, listing.stderr
    assert any(line.startswith("fedtwin ") and "config: my_lab.fedtwin" in line for line in listing.stdout.splitlines())


def test_an_installed_plugin_needs_no_section_and_a_missing_one_says_what_to_add(tmp_path, monkeypatch):
    site = installed_plugin(tmp_path / "site", "sectionless_pkg", "fedsectionless")
    monkeypatch.syspath_prepend(str(site))
    forget()
    try:
        config = cfgmod.deep_merge(
            BASE, {"experiments": {"harmofl_table1_prostate": {"runs": ["fedavg", "fedsectionless"]}}}
        )
        assert "fedsectionless" not in config["methods"]
        cfgmod.validate(config, "config.yaml")
        resolved = cfgmod.resolve_run(config, "prostate", "fedsectionless", 0)
        assert (
            resolved["method_params"] == {"strength": 0.5, "flag": False}
            and resolved["method_module"] == "sectionless_pkg.method"
        )
        # Neither built in, nor installed, nor a section: the YAML to add, in one line.
        unknown = cfgmod.deep_merge(BASE, {"experiments": {"harmofl_table1_prostate": {"runs": ["fedavg", "myfed"]}}})
        with pytest.raises(ConfigError) as err:
            cfgmod.validate(unknown, "config.yaml")
        assert "\n" not in str(err.value)
        assert str(err.value).startswith(
            "config.yaml: experiments.harmofl_table1_prostate: run 'myfed': method 'myfed' is neither built in nor an installed plug-in"
        )
        assert str(err.value).endswith("`methods: {myfed: {module: <its import path, e.g. myfed.method>}}`")
        # A variant needs a section: the message shows where it goes.
        variant = cfgmod.deep_merge(
            BASE, {"experiments": {"harmofl_table1_prostate": {"runs": ["fedsectionless-strong"]}}}
        )
        with pytest.raises(
            ConfigError,
            match=re.escape(
                "(a variant is added as `methods: {fedsectionless: {variants: {strong: {<parameter or task key>: <value>}}}}`)"
            ),
        ):
            cfgmod.validate(variant, "config.yaml")
    finally:
        forget()
