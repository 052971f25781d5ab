"""Names and paths a user controls: a name that would lead an output outside the results
folder is refused when the config is validated; HTML in a site or run name is text in every Markdown
and LaTeX output; a config asking Snakemake to run Python (`__use_yte__`) is refused by our entry
points; `new-method` refuses a name that would replace or shadow a package, and its test survives a
rename of the template's parameters."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fedmedbench import cli
from fedmedbench import config as fmb
from fedmedbench.errors import ConfigError
from fedmedbench.finals import write_final
from fedmedbench.registry import forget
from fedmedbench.report import escape
from fedmedbench.report.compare import compare, empty_paper_table, write_report
from fedmedbench.report.tables import seed_summary, write_table

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
BASE = fmb.load_config(ROOT / "config" / "config.yaml")
XSS = "<img src=x onerror=alert(1)>"


def refused(change: dict | None = None, edit=None) -> str:
    """The one-line ConfigError that validating config.yaml with this change raises."""
    config = fmb.deep_merge(BASE, change or {})
    if edit is not None:
        edit(config)
    with pytest.raises(ConfigError) as err:
        fmb.validate(config, "config")
    message = str(err.value)
    assert "\n" not in message
    return message


def renamed(section: str, old: str, new: str):
    """An edit that renames one entry of a top-level section (and what refers to it)."""

    def edit(config):
        config[section] = {(new if k == old else k): v for k, v in config[section].items()}
        if section == "tasks":
            for spec in config["experiments"].values():
                if spec.get("task") == old:
                    spec["task"] = new
        if section == "data":
            for spec in config["tasks"].values():
                if spec["dataset"] == old:
                    spec["dataset"] = new

    return edit


# --- 1. names that become paths ------------------------------------------------------------------
@pytest.mark.parametrize("value", ["..", ".", ".hidden"])
def test_a_run_name_that_leaves_the_results_folder_is_refused(value):
    message = refused({"run_name": value})
    assert message.startswith(f"config: run_name: the run name {value!r} must be a plain name")
    assert "under results/" in message


@pytest.mark.parametrize("value", ["a/b", "/etc", "../x"])
def test_a_run_name_with_a_separator_is_refused_by_the_schema(value):
    assert refused({"run_name": value}).startswith(f"config: invalid config at run_name: {value!r} does not match")


@pytest.mark.parametrize("value", [".", "", "..", "/", str(ROOT), str(ROOT.parent)])
def test_a_results_dir_that_is_the_checkout_or_above_it_is_refused(value, monkeypatch):
    monkeypatch.chdir(ROOT)
    message = refused({"results_dir": value})
    assert (
        message.startswith(f"config: results_dir: {value!r} is the working directory")
        or f"is the fedmedbench checkout ({ROOT})" in message
    )


def test_a_results_dir_elsewhere_is_the_root_of_every_output_path(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert (
        refused({"results_dir": "res{x}"})
        == "config: results_dir: 'res{x}' holds a brace, which Snakemake reads as a wildcard in every output path"
    )
    config = fmb.deep_merge(BASE, {"results_dir": str(tmp_path / "scratch"), "run_name": "v1.0..b"})
    fmb.validate(config, "config")  # a dot inside a name is a plain name
    root = fmb.results_root(config)
    assert root == tmp_path / "scratch" / "v1.0..b"
    paths = [fmb.task_data_dir(config, task) for task in config["tasks"]]
    paths += [
        fmb.train_dir(config, task, run, seed)
        for exp in config["experiments"]
        for task, run, seed in fmb.experiment_runs(config, exp)
    ]
    assert len(paths) > 100
    assert all(Path(os.path.normpath(p)).is_relative_to(root) for p in paths)


@pytest.mark.parametrize(
    "section, old, new, key",
    [
        ("tasks", "prostate", "../prostate", "tasks: the task name '../prostate'"),
        ("tasks", "prostate", "/abs", "tasks: the task name '/abs'"),
        ("tasks", "prostate", "..", "tasks: the task name '..'"),
        ("data", "nuclei", "../nuclei", "data: the data section name '../nuclei'"),
        ("experiments", "harmofl_table1_prostate", "../../x", "experiments: the experiment name '../../x'"),
        ("experiments", "harmofl_table1_prostate", "a{b}", "experiments: the experiment name 'a{b}'"),
        ("methods", "fedprox", "../fedprox", "methods: the method name '../fedprox'"),
        ("methods", "fedprox", "fed-prox", "methods: the method name 'fed-prox'"),
    ],
)
def test_a_section_name_that_is_not_one_folder_name_is_refused(section, old, new, key):
    message = refused(edit=renamed(section, old, new))
    assert message.startswith(f"config: {key} must be a plain name"), message


@pytest.mark.parametrize("site", ["../BIDMC", ".hidden", "a\\b", ""])
def test_a_site_of_a_task_that_is_not_one_folder_of_the_store_is_refused(site):
    clients = ["BIDMC", site, "I2CVB", "UCL", "RUNMC", "BMC"]
    message = refused({"tasks": {"prostate": {"clients": clients}}})
    assert (
        message
        == f"config: tasks.prostate.clients: the site {site!r} is not one folder name of the store (no '/', not starting with '.')"
    )


def test_a_paper_table_and_a_series_run_that_lead_elsewhere_are_refused():
    message = refused({"experiments": {"harmofl_table1_prostate": {"paper_table": "../../config.yaml"}}})
    assert message.startswith(
        "config: experiments.harmofl_table1_prostate.paper_table: the paper table '../../config.yaml' must be a plain name"
    )
    assert "under resources/paper_tables/" in message

    def edit(config):
        config["experiments"]["harmofl_fig5b_local_epochs"]["series"]["FedAvg"]["1"] = "../fedavg"

    assert refused(edit=edit).startswith(
        "config: experiments.harmofl_fig5b_local_epochs.series.FedAvg: the run '../fedavg' must be a plain name"
    )


def test_train_by_hand_refuses_the_run_name_in_one_line(tmp_path, capsys):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("run_name: '..'\n")
    code = cli.main(
        [
            "train",
            "--config",
            str(ROOT / "config" / "config.yaml"),
            str(overlay),
            "--task",
            "prostate",
            "--run",
            "fedavg",
            "--seed",
            "0",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "ConfigError: " in lines[0] and "run_name: the run name '..'" in lines[0]
    assert not (tmp_path / "run").exists()


# --- 1. HTML in a site or run name ---------------------------------------------------------------
def test_the_escapes_by_hand():
    assert escape.markdown(XSS) == "&lt;img src=x onerror=alert(1)&gt;"
    assert (
        escape.markdown("a|b *c* [d](e) `f` \\ & site_A\nx") == "a\\|b \\*c\\* \\[d\\](e) \\`f\\` \\\\ &amp; site_A x"
    )
    assert escape.latex(XSS) == r"\textless{}img src=x onerror=alert(1)\textgreater{}"
    assert escape.latex("a|b_c 10%") == r"a\textbar{}b\_c 10\%"


def finals_with(sites: list[str], run: str = "fedavg") -> list[dict]:
    scores = {site: {"dice_paper": 0.5 + 0.1 * i} for i, site in enumerate(sites)}
    return [
        {
            "task": "t",
            "method": run.split("-")[0],
            "run": run,
            "seed": 0,
            "clients": sites,
            "client_labels": sites,
            "test": scores,
        }
    ]


def test_html_in_a_site_name_is_text_in_the_tables(tmp_path):
    sites = [XSS, "siteB"]
    summary = seed_summary(finals_with(sites), "dice_paper")
    write_table(summary, tmp_path / "t", [("fedavg", "Fed<b>Avg</b> | *mine*")], caption="<script>alert(1)</script>")
    md = (tmp_path / "t.md").read_text()
    assert "<img" not in md and "<script" not in md and "<b>" not in md
    assert md.splitlines()[0] == "**&lt;script&gt;alert(1)&lt;/script&gt;**"
    assert "| Method | &lt;img src=x onerror=alert(1)&gt; | siteB | Avg |" in md
    assert "| Fed&lt;b&gt;Avg&lt;/b&gt; \\| \\*mine\\* | 50.00 (–) | 60.00 (–) | **55.00 (7.07)** |" in md
    tex = (tmp_path / "t.tex").read_text()
    assert "<" not in tex and r"Method & \textless{}img src=x onerror=alert(1)\textgreater{} & siteB & Avg \\" in tex
    assert pd.read_csv(tmp_path / "t.csv")["client"].tolist() == [XSS, "siteB", "Avg"]  # the data keep the name


def test_html_in_site_run_title_and_note_is_text_in_the_report(tmp_path):
    sites = [XSS, "siteB"]
    summary = seed_summary(finals_with(sites, run="fedavg"), "dice_paper")
    section = {
        "title": "Mine <iframe src=evil>", "labels": {"fedavg": "<b>FedAvg</b>"}, "metric_note": "`dice_paper`: Dice",
        "notes": [f"samples per client (train/val/test): {XSS} 6/2/2"],
        "comparison": compare(summary, empty_paper_table(), {"fedavg": "fedavg"}),
        "figure": str(tmp_path / "figures" / "a (b).png"),
    }  # fmt: skip
    text = write_report([section], tmp_path / "report.md", False, {"seeds": [0], "rounds": [2]}).read_text()
    assert not re.search(r"<(img|iframe|b)\b", text)
    assert "## Mine &lt;iframe src=evil&gt;" in text
    assert "Note: samples per client (train/val/test): &lt;img src=x onerror=alert(1)&gt; 6/2/2" in text
    assert "| &lt;b&gt;FedAvg&lt;/b&gt; | &lt;img src=x onerror=alert(1)&gt; | 50.00 (–) | n/a | – |" in text
    assert "](figures/a%20%28b%29.png)" in text  # a space or parenthesis does not end the link


def test_a_site_folder_named_with_html_reaches_the_table_as_text(tmp_path, capsys):
    """The `table` step as the pipeline runs it, on final.json files naming a site `<img ...>`."""
    run = tmp_path / "train" / "t" / "fedavg" / "seed0"
    run.mkdir(parents=True)
    final = finals_with([XSS, "siteB"])[0]
    final.update(synthetic=True, primary_metric="dice_paper", val=final["test"], metric_descriptions={"dice_paper": "Dice"},
                 selection={"split": "val", "metric": "dice_paper", "per_client": False, "best_round": 2, "rounds": 2})  # fmt: skip
    write_final(run / "final.json", final)
    experiment = {"title": "T", "seeds": [0], "task": "t", "runs": ["fedavg"], "metric": "dice_paper"}
    assert (
        cli.main(
            [
                "table",
                "--experiment",
                json.dumps(experiment),
                "--out-prefix",
                str(tmp_path / "tab"),
                str(run / "final.json"),
            ]
        )
        == 0
    )
    md = (tmp_path / "tab.md").read_text()
    assert "<img" not in md and "| Method | &lt;img src=x onerror=alert(1)&gt; | siteB | Avg |" in md


# --- 3. a config that asks Snakemake to run Python -----------------------------------------------
YTE = """__use_yte__: true
run_name: ?__import__("pathlib").Path({marker!r}).write_text("ran") and "yte"
"""


def yte_overlay(folder: Path) -> tuple[Path, Path]:
    marker = folder / "MARKER"
    overlay = folder / "overlay.yaml"
    overlay.write_text(YTE.format(marker=str(marker)))
    return overlay, marker


def test_read_yaml_and_load_config_refuse_a_yte_template(tmp_path, capsys):
    overlay, marker = yte_overlay(tmp_path)
    expected = f"{overlay}: __use_yte__: asks Snakemake to run the Python in this file (a YTE template)"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        fmb.read_yaml(overlay)
    with pytest.raises(ConfigError, match=re.escape(expected)):
        fmb.load_config(ROOT / "config" / "config.yaml", overlay)
    code = cli.main(
        [
            "train",
            "--config",
            str(ROOT / "config" / "config.yaml"),
            str(overlay),
            "--task",
            "prostate",
            "--run",
            "fedavg",
            "--seed",
            "0",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and expected in lines[0]
    (tmp_path / "off.yaml").write_text(
        "__use_yte__: false\nrun_name: x\n"
    )  # present at all: refused, whatever its value
    with pytest.raises(ConfigError, match="__use_yte__"):
        fmb.read_yaml(tmp_path / "off.yaml")
    assert not marker.exists()


def test_with_jobserver_refuses_a_yte_overlay_or_profile_before_snakemake_runs_it(tmp_path, capsys):
    overlay, marker = yte_overlay(tmp_path)
    code = cli.main(["with-jobserver", str(BIN / "snakemake"), "-n", "--cores", "1", "--configfile", str(overlay)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and f"{overlay}: __use_yte__" in lines[0]
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "config.yaml").write_text(YTE.replace("run_name", "cores").format(marker=str(marker)))
    code = cli.main(["with-jobserver", "snakemake", "-n", "--workflow-profile", str(profile)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and f"{profile / 'config.yaml'}: __use_yte__" in lines[0]
    assert not marker.exists()  # nothing ran the template


def test_plain_snakemake_runs_a_yte_overlay_before_the_snakefile_which_then_stops(tmp_path):
    """What docs/engineering.md says: Snakemake evaluates the template while reading its arguments,
    before our Snakefile exists for it; the Snakefile refuses the overlay, so no job runs."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text((ROOT / "config" / "config.yaml").read_text())
    overlay, marker = yte_overlay(tmp_path)
    cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(ROOT / "workflow" / "Snakefile"),
        "--directory",
        str(tmp_path),
        "-n",
        "--cores",
        "1",
        "--configfile",
        str(overlay),
    ]
    result = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path)}
    )
    assert result.returncode != 0
    assert f"{overlay}: __use_yte__: asks Snakemake to run the Python in this file" in result.stdout + result.stderr
    assert marker.read_text() == "ran"  # Snakemake ran it first: only our entry points can refuse in time
    assert not (tmp_path / "results").exists()


def test_the_snakefile_refuses_a_yte_config_yaml_before_snakemake_reads_it(tmp_path):
    marker = tmp_path / "MARKER"
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(
        YTE.format(marker=str(marker))
        + (ROOT / "config" / "config.yaml").read_text().replace("run_name:", "old_run_name:", 1)
    )
    cmd = [
        str(BIN / "snakemake"),
        "-s",
        str(ROOT / "workflow" / "Snakefile"),
        "--directory",
        str(tmp_path),
        "-n",
        "--cores",
        "1",
        "--workflow-profile",
        "none",
    ]
    result = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path)}
    )
    assert result.returncode != 0 and "config.yaml: __use_yte__" in result.stdout + result.stderr
    assert not marker.exists()  # `configfile:` never read it


# --- 2. new-method NAME --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, why",
    [
        ("os", "'os' is a module of Python's standard library"),
        ("json", "'json' is a module of Python's standard library"),
        ("numpy", "'numpy' is the name of the installed distribution numpy"),
        ("pyyaml", "'pyyaml' is the name of the installed distribution PyYAML"),  # not its import name
        ("fedmedbench", "'fedmedbench' is the name of the installed distribution fedmedbench"),
        ("yaml", "'yaml' is an importable module"),  # PyYAML's import name
        ("class", "'class' is a Python keyword"),
        ("fedavg", "'fedavg' is a built-in method"),
        ("Fed", "'Fed' is not a valid method name"),
    ],
)
def test_new_method_refuses_a_name_that_would_replace_or_shadow_a_package(name, why, tmp_path):
    from fedmedbench.new_method import new_method

    with pytest.raises(ConfigError, match=re.escape(f"new-method: {why}")):
        new_method(name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_new_method_refuses_an_installed_plugin_distribution_and_its_method_name(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site"
    (site / "labpkg").mkdir(parents=True)
    (site / "labpkg" / "__init__.py").write_text("")
    info = site / "lab_methods-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-methods\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedmedbench.methods]\nfedlab = labpkg.method\n")
    monkeypatch.syspath_prepend(str(site))
    forget()
    try:
        code = cli.main(
            ["new-method", "lab_methods", "--out", str(tmp_path / "a")]
        )  # pip compares lab-methods == lab_methods
        lines = capsys.readouterr().err.strip().splitlines()
        assert (
            code == 1
            and len(lines) == 1
            and "'lab_methods' is the name of the installed distribution lab-methods 0.1" in lines[0]
        )
        assert cli.main(["new-method", "labpkg", "--out", str(tmp_path / "b")]) == 1
        assert f"'labpkg' is an importable module ({site / 'labpkg' / '__init__.py'})" in capsys.readouterr().err
        assert cli.main(["new-method", "fedlab", "--out", str(tmp_path / "c")]) == 1
        assert "'fedlab' is already a method (entry point of lab-methods)" in capsys.readouterr().err
        assert not any((tmp_path / d).exists() for d in "abc")
    finally:
        forget()


def load_test_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"generated_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_test_passes_after_the_template_parameter_is_renamed(tmp_path, monkeypatch):
    from fedmedbench.new_method import new_method

    out = tmp_path / "pkg"
    new_method("renamedfed", out)
    method = out / "src" / "renamedfed" / "method.py"
    source = method.read_text()
    assert source.count('"mu"') == 3  # DEFAULTS, PARAM_SCHEMA and its use in after_backward
    method.write_text(
        source.replace('"mu"', '"strength"').replace('{"strength": 0.0}', '{"strength": 0.01, "warmup": 1}')
    )
    monkeypatch.syspath_prepend(str(out / "src"))
    forget()
    try:
        generated = load_test_module(out / "tests" / "test_renamedfed.py")
        generated.test_renamedfed_trains_two_rounds(tmp_path / "t")  # what `pytest` in the package runs
        final = json.loads((tmp_path / "t" / "run" / "final.json").read_text())
        assert final["config"]["method_params"] == {"strength": 0.01, "warmup": 1}
        assert final["config"]["method"] == "renamedfed" and final["config"]["method_module"] == "renamedfed.method"
    finally:
        for name in [m for m in sys.modules if m == "renamedfed" or m.startswith("renamedfed.")]:
            del sys.modules[name]
        forget()


def test_tiny_run_config_takes_the_methods_defaults_and_checks_params(tmp_path, monkeypatch):
    from fedmedbench.new_method import new_method
    from fedmedbench.testing import tiny_run_config

    new_method("tinyfed", tmp_path / "pkg")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg" / "src"))
    forget()
    try:
        cfg = tiny_run_config("tinyfed.method", tmp_path / "data", rounds=3, model={"init_features": 4})
        assert cfg["method_params"] == {"mu": 0.0} and cfg["rounds"] == 3 and cfg["model"]["init_features"] == 4
        assert cfg["model"]["name"] == "unet" and cfg["clients"] == ["siteA", "siteB", "siteC"]
        split = pd.read_csv(cfg["data"]["split"])
        assert split.groupby(["client", "split"]).size().to_dict() == {
            (s, p): n for s in cfg["clients"] for p, n in (("test", 2), ("train", 6), ("val", 2))
        }
        assert tiny_run_config("tinyfed.method", tmp_path / "data", params={"mu": 0.5})["method_params"] == {"mu": 0.5}
        with pytest.raises(ConfigError, match="mu"):
            tiny_run_config("tinyfed.method", tmp_path / "data", params={"mu": -1.0})  # PARAM_SCHEMA: minimum 0
        with pytest.raises(ConfigError, match="roundz"):
            tiny_run_config("tinyfed.method", tmp_path / "data", roundz=3)
    finally:
        forget()


def test_the_generated_readme_runs_the_method_on_a_folders_task(tmp_path, monkeypatch):
    """The README's overlay, with the data its command writes, is a valid config whose table trains
    the new method beside FedAvg and FedProx on the `folders` sites found."""
    from fedmedbench.data.folders import write_example
    from fedmedbench.new_method import new_method

    out = tmp_path / "pkg"
    new_method("readmefed", out)
    readme = (out / "README.md").read_text()
    assert "write_example('mydata')" in readme and "family: folders" in readme
    block = readme.split("with `readmefed.yaml`:\n\n", 1)[1].split("\n\n", 1)[0]
    overlay = yaml.safe_load("\n".join(line[4:] for line in block.splitlines()))
    # `pip install -e .` as the README says: the package and its entry point on the path.
    info = out / "src" / "readmefed-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: readmefed\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[fedmedbench.methods]\nreadmefed = readmefed.method\n")
    monkeypatch.syspath_prepend(str(out / "src"))
    monkeypatch.chdir(tmp_path)
    write_example("mydata")
    (tmp_path / "readmefed.yaml").write_text(yaml.safe_dump(overlay))
    forget()
    try:
        config = fmb.load_config(ROOT / "config" / "config.yaml", tmp_path / "readmefed.yaml")
        assert config["data"]["mydata"]["family"] == "folders" and config["tasks"]["mydata"]["clients"] == [
            "siteA",
            "siteB",
            "siteC",
        ]
        jobs = fmb.experiment_runs(config, "mydata_table")
        assert [run for _, run, _ in jobs] == ["fedavg", "fedprox", "readmefed"]
        resolved = fmb.resolve_run(config, "mydata", "readmefed", 0)
        assert resolved["method_module"] == "readmefed.method" and resolved["method_params"] == {"mu": 0.0}
        assert str(fmb.results_root(config)) == "results/readmefed"
    finally:
        forget()
