"""The versions fedmedbench installs: compatible ranges in pyproject.toml (so it installs beside a lab's
other packages), the exact tested versions in constraints.txt, which make installs and
workflow/envs/*.yaml (for --use-conda users) pin too."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from fedmedbench.new_method import new_method

ROOT = Path(__file__).resolve().parents[1]


def pins(requirements):
    out = {}
    for req in requirements:
        # An extra (flwr[simulation]) is part of the name in an env file: the pin is the package's.
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[a-z,-]+\])?==([^\s;]+)", req.strip())
        assert match, f"not pinned with ==: {req!r}"
        out[canonicalize_name(match.group(1))] = match.group(2)
    return out


def constraints() -> dict[str, str]:
    lines = [line.split("#")[0].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    return pins([line for line in lines if line])


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in project["dependencies"] + extras["dev"] + extras["flower"]]


def test_pyproject_declares_ranges_that_admit_the_tested_versions():
    tested = constraints()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert not any(s.operator == "==" for s in requirement.specifier), (
            f"pyproject.toml pins {requirement}: declare a range"
        )
        assert name in tested, f"constraints.txt has no version of {name}"
        assert Version(tested[name]) in requirement.specifier, (
            f"{requirement} excludes the tested {name}=={tested[name]}"
        )


def test_envs_pin_the_tested_versions():
    tested = constraints()
    env_files = sorted((ROOT / "workflow" / "envs").glob("*.yaml"))
    assert {p.stem for p in env_files} >= {"torch", "data", "report"}
    for path in env_files:
        env = yaml.safe_load(path.read_text())
        assert env["channels"][-1] == "nodefaults", path
        pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
        for name, version in pins(pip_section).items():
            assert tested.get(name) == version, (
                f"{path.name}: {name}=={version}, constraints.txt has {tested.get(name)}"
            )
        assert "python=3.11" in env["dependencies"], path


def test_the_environment_is_the_tested_one():
    """What make installed is constraints.txt's versions (a lock that drifted from the venv says so)."""
    from importlib.metadata import version

    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert Version(version(name)).public == Version(constraints()[name]).public, name


def test_a_plugin_package_installs_beside_fedmedbench_without_changing_a_version(tmp_path):
    """A package `new-method` writes (it depends on fedmedbench) resolves in this environment with nothing
    but itself to install: no tested version is upgraded or downgraded (pip's own resolver, offline)."""
    package = tmp_path / "labfed"
    new_method("labfed", package)
    report = tmp_path / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-build-isolation",
            "--quiet",
            "--report",
            str(report),
            str(package),
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert result.returncode == 0, result.stderr
    installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installs == ["labfed"]


def test_every_rule_names_an_existing_conda_env():
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        for env in re.findall(r'conda:\s*\n\s*"([^"]+)"', smk.read_text()):
            assert (smk.parent / env).resolve().is_file(), f"{smk.name}: {env}"


def test_the_cpu_torch_install_takes_the_tested_pins_and_the_readme_names_none():
    """The CPU-only torch install (scripts/install_torch.py, run by make) reads torch/torchvision's pins
    from constraints.txt, and the README names no version of its own (a version bump cannot leave either
    behind)."""
    pinned = constraints()
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import install_torch
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert pins(install_torch.torch_pins()) == {"torch": pinned["torch"], "torchvision": pinned["torchvision"]}
    assert not re.search(r"torch(vision)?==", (ROOT / "README.md").read_text())
    assert "scripts/install_torch.py" in (ROOT / "Makefile").read_text()
