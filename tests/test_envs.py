"""workflow/envs/*.yaml (for --use-conda users) pin the same versions as pyproject.toml."""

import re
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def pins(requirements):
    out = {}
    for req in requirements:
        # An extra (flwr[simulation]) is part of the name: the pin must name the same extras everywhere.
        match = re.fullmatch(r"([A-Za-z0-9_.-]+(?:\[[a-z,-]+\])?)==([^\s;]+)", req.strip())
        assert match, f"not pinned with ==: {req!r}"
        out[match.group(1).lower().replace("_", "-")] = match.group(2)
    return out


def test_every_dependency_is_pinned_and_envs_match():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = pins(project["dependencies"] + project["optional-dependencies"]["dev"] + project["optional-dependencies"]["flower"])
    env_files = sorted((ROOT / "workflow" / "envs").glob("*.yaml"))
    assert {p.stem for p in env_files} >= {"torch", "data", "report"}
    for path in env_files:
        env = yaml.safe_load(path.read_text())
        assert env["channels"][-1] == "nodefaults", path
        pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
        for name, version in pins(pip_section).items():
            assert pinned.get(name) == version, f"{path.name}: {name}=={version}, pyproject has {pinned.get(name)}"
        assert "python=3.11" in env["dependencies"], path


def test_every_rule_names_an_existing_conda_env():
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        for env in re.findall(r'conda:\s*\n\s*"([^"]+)"', smk.read_text()):
            assert (smk.parent / env).resolve().is_file(), f"{smk.name}: {env}"


def test_the_cpu_torch_install_takes_pyproject_pins_and_the_readme_names_none():
    """The CPU-only torch install (scripts/install_torch.py, run by make) reads torch/torchvision's pins
    from pyproject.toml, and the README names no version of its own (a version bump cannot leave either
    behind)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = pins(project["dependencies"])
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import install_torch
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert pins(install_torch.torch_pins()) == {"torch": pinned["torch"], "torchvision": pinned["torchvision"]}
    assert not re.search(r"torch(vision)?==", (ROOT / "README.md").read_text())
    assert "scripts/install_torch.py" in (ROOT / "Makefile").read_text()

