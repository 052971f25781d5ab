"""A result follows everything it depends on: every file a user's option names is in
Snakemake's view of the job that reads it, so an edit re-runs exactly the jobs that depend on it
and an unrelated edit re-runs nothing.

- a ``split_csv`` (its content, not its path) -> the split and what follows;
- every source file of a plug-in (its package, the user's modules it imports) -> its runs only;
- a file behind a symlinked site folder -> preprocessing and what follows (a link loop: one line);
- an archive downloaded by hand (``files.<f>.archive``) -> its download;
- a paper table an experiment compares with -> the report.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from fedmedbench import sources
from fedmedbench.data import download
from fedmedbench.data.digest import listing_digest
from fedmedbench.data.folders import FoldersDataError, discover_sites, list_pairs, write_example
from fedmedbench.registry import find_method, forget

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COPIED = ("config", "workflow", "src", "resources")

CONTRACT = """
from fedmedbench.fl.client import Client
from fedmedbench.fl.server import Server

DEFAULTS = {"strength": 0.5}
PERSONALIZED = False
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def edit(path: Path) -> None:
    with open(path, "a") as handle:
        handle.write("# an edit\n")


# --- a plug-in's sources ----------------------------------------------------------------------


@pytest.fixture()
def plugin_tree(tmp_path, monkeypatch):
    """A plug-in package ``my_lab`` (contract in my_lab.method) that imports a helper of its package,
    a module beside it (which imports another), a package of the user's installed in editable mode
    (a .pth in a site-packages folder points at its source tree), a third-party package, the standard
    library and fedmedbench; and a plug-in that is one module outside any package."""
    plugins, editable = tmp_path / "plugins", tmp_path / "editable"
    third_party = tmp_path / "venv" / "lib" / "python3" / "site-packages"
    files = {
        "my_lab/__init__.py": write(plugins / "my_lab" / "__init__.py", ""),
        "my_lab/method.py": write(
            plugins / "my_lab" / "method.py",
            "from .helpers import SCALE\nimport flat_helper\nimport my_utils.maths\n"
            "import thirdparty\nimport os\nimport numpy\n" + CONTRACT,
        ),
        "my_lab/helpers.py": write(plugins / "my_lab" / "helpers.py", "SCALE = 1\n"),
        "my_lab/unused.py": write(plugins / "my_lab" / "unused.py", "# in the package: part of the plug-in\n"),
        "flat_helper.py": write(plugins / "flat_helper.py", "from deeper_helper import VALUE\n"),
        "deeper_helper.py": write(plugins / "deeper_helper.py", "VALUE = 2\n"),
        "my_utils/__init__.py": write(editable / "my_utils" / "__init__.py", ""),
        "my_utils/maths.py": write(editable / "my_utils" / "maths.py", "def twice(x):\n    return 2 * x\n"),
        "flat_method.py": write(plugins / "flat_method.py", "import flat_helper\n" + CONTRACT),
    }
    outside = {
        "not_imported.py": write(plugins / "not_imported.py", "X = 1\n"),
        "my_utils/other.py": write(editable / "my_utils" / "other.py", "Y = 1\n"),
        "thirdparty/__init__.py": write(third_party / "thirdparty" / "__init__.py", "Z = 1\n"),
    }
    write(third_party / "__editable__.my_utils-0.1.pth", f"{editable}\n")
    monkeypatch.setattr(sys, "path", [str(plugins), *sys.path])
    site.addsitedir(str(third_party))  # processes the .pth: my_utils resolves to its source tree
    for name in [
        m
        for m in sys.modules
        if m.split(".")[0] in ("my_lab", "flat_helper", "deeper_helper", "my_utils", "thirdparty", "flat_method")
    ]:
        monkeypatch.delitem(sys.modules, name)
    forget()
    yield files, outside
    forget()


def test_a_plugins_digest_covers_its_package_and_the_users_modules_it_imports(plugin_tree):
    files, outside = plugin_tree
    ref = find_method("fedxyz", "my_lab.method")
    found = sources.local_sources(ref.module, str(ref.path))
    assert [key for key, _ in found] == [
        "deeper_helper.py", "flat_helper.py", "my_lab/__init__.py", "my_lab/helpers.py", "my_lab/method.py",
        "my_lab/unused.py", "my_utils/__init__.py", "my_utils/maths.py",
    ]  # fmt: skip
    assert [key for key, _ in sources.local_sources("flat_method", str(files["flat_method.py"]))] == [
        "deeper_helper.py", "flat_helper.py", "flat_method.py",
    ]  # fmt: skip
    before = ref.digest()
    misses = sources.local_sources.cache_info().misses
    assert find_method("fedxyz", "my_lab.method").digest() == before  # once per process
    assert sources.local_sources.cache_info().misses == misses
    for key in [k for k, _ in found]:
        original = files[key].read_bytes()
        edit(files[key])
        forget()
        assert find_method("fedxyz", "my_lab.method").digest() != before, key
        files[key].write_bytes(original)
        forget()
        assert find_method("fedxyz", "my_lab.method").digest() == before, key
    for key, path in outside.items():
        edit(path)
        forget()
        assert find_method("fedxyz", "my_lab.method").digest() == before, key


def test_a_builtin_method_has_no_digest_in_the_run_config():
    from fedmedbench import config as cfgmod

    run = cfgmod.resolve_run(cfgmod.load_config(ROOT / "config" / "config.yaml"), "prostate", "fedavg", 0)
    assert run["method_digest"] is None and run["method_module"] is None


# --- symlinked site folders -----------------------------------------------------------------------


def test_the_listing_follows_a_symlinked_site_folder_and_refuses_a_loop(tmp_path):
    data = tmp_path / "data"
    write_example(data)
    before = listing_digest(data)
    stems = [stem for stem, *_ in list_pairs(data, "siteC")]
    (tmp_path / "elsewhere").mkdir()
    os.rename(data / "siteC", tmp_path / "elsewhere" / "siteC")  # a rename keeps the files' times
    (data / "siteC").symlink_to(tmp_path / "elsewhere" / "siteC", target_is_directory=True)
    # The link is transparent: same names, sizes and times, same digest; preprocessing sees the site.
    assert listing_digest(data) == before
    assert discover_sites(data) == ["siteA", "siteB", "siteC"]
    assert [stem for stem, *_ in list_pairs(data, "siteC")] == stems
    image = tmp_path / "elsewhere" / "siteC" / "images" / f"{stems[0]}.png"
    pixels = np.asarray(Image.open(image))
    Image.fromarray(255 - pixels).save(image)  # an edit behind the link
    edited = listing_digest(data)
    assert edited != before

    # The split_csv inside the root is the split's, not preprocessing's.
    write(data / "split.csv", "site,image,split\n")
    assert listing_digest(data, exclude=[data / "split.csv"]) == edited != listing_digest(data)
    (data / "split.csv").unlink()

    (data / "dangling").symlink_to(tmp_path / "nowhere")  # counted by its target, no crash
    assert listing_digest(data) != edited
    (data / "dangling").unlink()

    loop = data / "siteB" / "masks" / "back"
    loop.symlink_to(data, target_is_directory=True)
    with pytest.raises(FoldersDataError) as err:
        listing_digest(data)
    assert str(err.value).startswith(f"{loop}: a symbolic link loop (it leads back to {data.resolve()}")
    assert "\n" not in str(err.value)


# --- the jobs check they read what the DAG saw ----------------------------------------------------


def test_a_local_archive_replaced_after_planning_is_refused(tmp_path):
    from fedmedbench.data.digest import file_stamp

    archive = write(tmp_path / "mine.zip", "PK fake archive")
    stamp = file_stamp(archive)
    download.fetch(str(archive), tmp_path / "raw" / "a.zip", source_stamp=stamp, log=lambda _: None)
    assert (tmp_path / "raw" / "a.zip").read_bytes() == archive.read_bytes()
    archive.write_text("PK another archive")
    with pytest.raises(
        download.DownloadError,
        match=rf"local archive {re.escape(str(archive))} changed after the workflow planned this job",
    ):
        download.fetch(str(archive), tmp_path / "raw" / "b.zip", source_stamp=stamp, log=lambda _: None)
    assert not (tmp_path / "raw" / "b.zip").exists()
    assert (
        download.local_source(f"file://{archive}") == archive
        and download.local_source("gdrive:abcdefghijklmnopqrstu") is None
    )


def test_a_split_csv_edited_after_planning_is_refused(tmp_path):
    split_csv = write(tmp_path / "split.csv", "site,image,split\n")
    planned = hashlib.sha256(split_csv.read_bytes()).hexdigest()[:16]
    split_csv.write_text("site,image,split\nsiteA,a.png,train\n")
    options = f'{{"root": "{tmp_path}", "split_csv": "{split_csv}"}}'
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedmedbench",
            "split",
            "folders",
            "--protocol",
            "default",
            "--store",
            str(tmp_path / "store"),
            "--out",
            str(tmp_path / "out.csv"),
            "--options",
            options,
            "--split-csv-digest",
            planned,
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 1
    assert f"{split_csv}: split_csv changed after the workflow planned this job" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.csv").exists()


# --- Snakemake's view, end to end ------------------------------------------------------------------


def planned(result: subprocess.CompletedProcess) -> list[str]:
    """The jobs of a dry run, as ``rule[wildcards]`` (the `all` target left out), sorted."""
    jobs = []
    for block in re.split(r"^(?=(?:local)?rule \w+:$)", result.stdout, flags=re.MULTILINE):
        head = re.match(r"(?:local)?rule (\w+):$", block, flags=re.MULTILINE)
        if head is None or head.group(1) == "all":
            continue
        wildcards = re.search(r"^\s+wildcards: (.*)$", block, flags=re.MULTILINE)
        jobs.append(f"{head.group(1)}[{wildcards.group(1) if wildcards else ''}]")
    return sorted(jobs)


def split_rows(data: Path) -> str:
    lines = ["site,image,split"]
    for site_name in discover_sites(data):
        stems = [stem for stem, *_ in list_pairs(data, site_name)]
        parts = ["train"] * (len(stems) - 2) + ["val", "test"]
        lines += [f"{site_name},images/{stem}.png,{part}" for stem, part in zip(stems, parts)]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_an_edit_re_runs_exactly_the_jobs_that_read_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(source, repo / name)
    data, elsewhere, plugins = tmp_path / "data", tmp_path / "elsewhere", tmp_path / "plugins"
    write_example(data, counts=(4, 4, 4))
    elsewhere.mkdir()
    os.rename(data / "siteC", elsewhere / "siteC")
    (data / "siteC").symlink_to(elsewhere / "siteC", target_is_directory=True)
    split_csv = write(data / "split.csv", split_rows(data))
    write(plugins / "my_lab" / "__init__.py", "")
    write(plugins / "my_lab" / "method.py", "from .helpers import SCALE\n" + CONTRACT)
    helper = write(plugins / "my_lab" / "helpers.py", "SCALE = 1\n")
    write(plugins / "flat_method.py", "from flat_helper import VALUE\n" + CONTRACT)
    flat_helper = write(plugins / "flat_helper.py", "VALUE = 2\n")
    unrelated = write(plugins / "unrelated.py", "W = 1\n")
    archive = write(tmp_path / "downloads" / "Processed_data_nii.zip", "PK a hand-downloaded archive")
    paper = write(
        repo / "resources" / "paper_tables" / "mine.csv",
        "paper,table,task,method,method_id,client,metric,mean,std\n"
        + "".join(f"mine,1,mysites,FedAvg,fedavg,{s},dice,50.0,\n" for s in ("siteA", "siteB", "siteC")),
    )
    overlay = {
        "run_name": "deps",
        "selected_experiments": ["mine"],
        "data": {
            "mysites": {"family": "folders", "root": str(data), "kind": "segmentation", "mask_values": {0: 0, 128: 1, 255: 2}, "split_csv": str(split_csv)},
            "prostate": {"files": {"Processed_data_nii.zip": {"archive": str(archive)}}},
        },
        "tasks": {"mysites": {"dataset": "mysites", "kind": "segmentation", "model": {"init_features": 2}, "rounds": 1, "batch_size": 4}},
        "methods": {"fedxyz": {"module": "my_lab.method"}, "flatxyz": {"module": "flat_method"}},
        "experiments": {"mine": {"title": "Mine", "task": "mysites", "runs": ["fedavg", "fedxyz", "flatxyz"], "seeds": [0], "metric": "dice_paper", "paper_table": "mine.csv"}},
    }  # fmt: skip
    write(repo / "deps.yaml", yaml.safe_dump(overlay))
    targets = ["all", "results/deps/data/prostate/raw/Processed_data_nii.zip"]
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(plugins)}

    def snakemake(*flags: str) -> subprocess.CompletedProcess:
        cmd = [str(BIN / "snakemake"), "--cores", "2", *flags, *targets, "--configfile", "deps.yaml"]
        if "-n" not in flags:
            cmd = [str(BIN / "python"), "-m", "fedmedbench", "with-jobserver", *cmd]  # as `make demo`
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo)

    built = snakemake()
    assert built.returncode == 0, built.stderr[-4000:]
    assert (repo / "results" / "deps" / "report.md").is_file()
    assert not list((repo / "results" / "deps" / "train").rglob(".train.lock"))  # no lock left behind

    def reruns() -> list[str]:
        dry = snakemake("-n")
        assert dry.returncode == 0, dry.stderr[-3000:]
        return planned(dry)

    assert reruns() == []
    after_train = [
        "collect_metrics[experiment=mine]",
        "convergence_figure[experiment=mine]",
        "reproduction_report[]",
        "table[experiment=mine]",
    ]
    train = {run: f"train[task=mysites, run={run}, seed=0]" for run in ("fedavg", "fedxyz", "flatxyz")}

    edit(unrelated)  # a module no plug-in imports
    write(tmp_path / "notes.txt", "beside the data, not in it\n")
    assert reruns() == []

    edit(helper)  # a helper of the plug-in's package: its runs only
    assert reruns() == sorted([train["fedxyz"], *after_train])
    helper.write_text("SCALE = 1\n")  # back as it was: nothing to do again
    assert reruns() == []

    edit(flat_helper)  # the module beside a one-module plug-in
    assert reruns() == sorted([train["flatxyz"], *after_train])
    flat_helper.write_text("VALUE = 2\n")

    lines = split_csv.read_text().splitlines()
    swapped = [
        line.replace(",val", ",tmp").replace(",test", ",val").replace(",tmp", ",test")
        if line.startswith("siteA,")
        else line
        for line in lines
    ]
    split_csv.write_text("\n".join(swapped) + "\n")  # the split's content; preprocessing does not read it
    everything_after_split = sorted(["split[dataset=mysites, protocol=default]", *train.values(), *after_train])
    assert reruns() == everything_after_split
    split_csv.write_text("\n".join(lines) + "\n")
    assert reruns() == []  # the same content again: nothing (its time changed, its content did not)

    image = elsewhere / "siteC" / "images" / sorted(os.listdir(elsewhere / "siteC" / "images"))[0]
    original, times = image.read_bytes(), image.stat()
    Image.fromarray(255 - np.asarray(Image.open(image))).save(image)  # behind the symlinked site folder
    assert reruns() == sorted(["preprocess[dataset=mysites, protocol=default]", *everything_after_split])
    image.write_bytes(original)
    os.utime(image, ns=(times.st_atime_ns, times.st_mtime_ns))  # as it was, time included

    paper.write_text(paper.read_text().replace("50.0", "51.0"))  # a paper table the report compares with
    assert reruns() == ["reproduction_report[]"]
    paper.write_text(paper.read_text().replace("51.0", "50.0"))

    with open(archive, "ab") as handle:  # a corrected archive downloaded by hand, at the same path
        handle.write(b" and more")
    assert reruns() == ["download[dataset=prostate, file=Processed_data_nii.zip]"]
