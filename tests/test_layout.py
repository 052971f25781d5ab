"""The Snakemake workflow catalog's standardized layout (workflow/Snakefile, config/config.yaml with
config/README.md, workflow/envs/, .snakemake-workflow-catalog.yml)."""

import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(workdir)}
    return subprocess.run(
        [str(BIN / "snakemake"), *args], capture_output=True, text=True, cwd=workdir, env=env, timeout=300
    )


def test_the_catalog_layout_and_nothing_left_at_the_old_places():
    for path in (
        "workflow/Snakefile",
        "config/config.yaml",
        "config/README.md",
        ".snakemake-workflow-catalog.yml",
        "workflow/schemas/config.schema.yaml",
        "workflow/report/workflow.rst",
        "workflow/profiles/default/config.yaml",
    ):
        assert (ROOT / path).is_file(), path
    assert {p.stem for p in (ROOT / "workflow" / "envs").glob("*.yaml")} >= {"torch", "data", "report", "flower"}
    for old in ("Snakefile", "config.yaml", "envs", "profiles"):
        assert not (ROOT / old).exists(), old


def test_every_path_the_snakefile_and_rules_name_exists_relative_to_their_file():
    snakefile = (ROOT / "workflow" / "Snakefile").read_text()
    named = [(ROOT / "workflow", p) for p in re.findall(r'^(?:include|report): "([^"]+)"', snakefile, re.MULTILINE)]
    assert len(named) == 6  # the report text and five rule files
    rules = ROOT / "workflow" / "rules"
    conda = []
    for smk in rules.glob("*.smk"):
        # conda: and caption= paths are relative to the rule file (Snakemake's rule.basedir)
        found = re.findall(r'conda:\s*\n\s*"([^"]+)"', smk.read_text()) + re.findall(
            r'caption="([^"]+)"', smk.read_text()
        )
        named += [(rules, p) for p in found]
        conda += [p for p in found if p.endswith(".yaml")]
    assert len(conda) >= 18 and all(p.startswith("../envs/") for p in conda)
    for base, path in named:
        assert (base / path).is_file(), f"{base}: {path}"


def test_config_readme_describes_every_top_level_section():
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    readme = (ROOT / "config" / "README.md").read_text()
    sections = set(schema["properties"]) | set(config)
    assert sections >= {"run_name", "data", "tasks", "methods", "experiments"}
    for key in sections:
        assert f"| `{key}` |" in readme, key  # a row of the sections table
    for key in ("data", "tasks", "methods", "experiments"):
        assert f"### `{key}`" in readme, key
    # every experiment kind the schema allows is named
    kinds = schema["properties"]["experiments"]["additionalProperties"]["properties"]["kind"]["enum"]
    assert all(f"`{kind}`" in readme for kind in kinds)


def test_catalog_file_has_the_documented_keys():
    catalog = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text())
    assert set(catalog) == {"usage"}
    usage = catalog["usage"]
    assert set(usage) <= {"mandatory-flags", "software-stack-deployment"}
    assert set(usage["mandatory-flags"]) == {"desc", "flags"}
    stack = usage["software-stack-deployment"]
    assert set(stack) <= {"conda", "singularity", "singularity+conda", "apptainer", "apptainer+conda", "report"}
    assert stack["conda"] is True and stack["report"] is True


def test_a_workflow_using_this_one_as_a_module_finds_its_sources_and_resources(tmp_path):
    """As `snakedeploy deploy-workflow` writes it (a `module` of workflow/Snakefile, config/ beside it),
    from a local checkout: the workflow imports this checkout's src/ and its rules read its resources/."""
    (tmp_path / "workflow").mkdir()
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    (tmp_path / "workflow" / "Snakefile").write_text(
        f'configfile: "config/config.yaml"\n\n\nmodule fedmedbench:\n    snakefile:\n        "{ROOT / "workflow" / "Snakefile"}"\n'
        "    config:\n        config\n\n\nuse rule * from fedmedbench\n"
    )
    result = snakemake(tmp_path, "-n", "-p", "--cores", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert str(ROOT / "resources" / "paper_tables") in result.stdout
