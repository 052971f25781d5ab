"""What the reader of a user's data skips, the listing digest skips too (one predicate,
``fedmedbench.data.skipped``): a ``.DS_Store``, a ``.git/`` folder, ``__MACOSX/`` or the pipeline's
own results folder inside the data root re-run no job, and a file the reader does read still does.
A file name that is not valid UTF-8 is refused in one line naming it, escaped."""

from __future__ import annotations

import os
import shutil
import sys

import numpy as np
import pytest
from PIL import Image

from fedmedbench.data import digest, skipped
from fedmedbench.data.digest import listing_digest
from fedmedbench.data.folders import FoldersDataError, discover_sites, list_pairs, preprocess, reading, write_example
from fedmedbench.data.skipped import RESULTS_MARK, mark_results


def add_junk(root):
    """What a Mac, git, a file browser and a run inside the data root leave there; none of it is data."""
    images = root / "siteA" / "images" if (root / "siteA" / "images").is_dir() else root / "siteA"
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (images / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (images / "._siteA_001.png").write_bytes(b"\0\5\26\7junk")
    (images / "Thumbs.db").write_bytes(b"thumbs")
    (images / "desktop.ini").write_bytes(b"[.ShellClassInfo]")
    (root / ".git" / "objects" / "ab").mkdir(parents=True)
    (root / ".git" / "objects" / "ab" / "cdef").write_bytes(b"blob")
    (root / "__MACOSX" / "siteA").mkdir(parents=True)
    (root / "__MACOSX" / "siteA" / "._images").write_bytes(b"junk")
    results = root / "results"
    mark_results(results)
    (results / "demo" / "figures").mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(results / "demo" / "figures" / "dice.png")
    (results / "demo" / ".cache" / "listing").mkdir(parents=True)
    (results / "demo" / ".cache" / "listing" / "mine.json").write_text("{}")


def test_the_reader_and_the_listing_digest_share_one_predicate():
    assert digest.skipped is skipped.skipped and reading.skipped is skipped.skipped


@pytest.mark.parametrize("kind", ["segmentation", "classification"])
def test_junk_and_the_runs_own_results_change_neither_the_digest_nor_what_is_read(tmp_path, kind):
    data = tmp_path / "data"
    example = write_example(data, kind=kind, counts=(2, 2, 2))
    before = listing_digest(data)
    sites = discover_sites(data, kind)
    counts = preprocess({}, tmp_path / "store1", options=example["options"], log=lambda line: None)
    add_junk(data)

    assert listing_digest(data) == before
    assert discover_sites(data, kind) == sites == ["siteA", "siteB", "siteC"]
    if kind == "segmentation":
        assert [p[0] for p in list_pairs(data, "siteA")] == ["siteA_000", "siteA_001"]
    assert preprocess({}, tmp_path / "store2", options=example["options"], log=lambda line: None) == counts

    # The results change at every call (logs, the digest's own cache): still nothing re-runs.
    (data / "results" / "demo" / ".cache" / "listing" / "mine.json").write_text('{"files": {}}')
    (data / "results" / "demo" / "log.txt").write_text("round 1")
    (data / ".git" / "index").write_bytes(b"new index")
    assert listing_digest(data) == before

    # What the reader does read still counts: an edited image changes the digest.
    image = data / "siteA" / "images" / "siteA_000.png" if kind == "segmentation" else data / "siteA" / "img_000.png"
    Image.fromarray(255 - np.asarray(Image.open(image))).save(image)
    assert listing_digest(data) != before


def test_a_results_folder_without_its_mark_is_data(tmp_path):
    """The mark, not the name, makes a folder the run's results: a site named results is read."""
    data = tmp_path / "data"
    write_example(data, counts=(2, 2, 2))
    before = listing_digest(data)
    shutil.copytree(data / "siteA", data / "results")
    assert "results" in discover_sites(data, "segmentation")
    assert listing_digest(data) != before
    mark_results(data / "results")
    assert (data / "results" / RESULTS_MARK).is_file()
    assert listing_digest(data) == before and "results" not in discover_sites(data, "segmentation")


def test_mark_results_creates_only_when_asked(tmp_path):
    mark_results(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()
    mark_results(tmp_path / "made")
    assert skipped.skipped(tmp_path / "made") and not skipped.skipped(tmp_path)


def test_an_image_listed_inside_a_skipped_folder_is_refused(tmp_path):
    data = tmp_path / "data"
    example = write_example(data, kind="classification", counts=(2, 2, 2))
    labels = (data / "labels.csv").read_text().splitlines()
    first = labels[1].split(",")
    image = data / first[1]
    hidden = data / ".hidden" / image.name
    hidden.parent.mkdir()
    image.rename(hidden)
    first[1] = f".hidden/{image.name}"
    (data / "labels.csv").write_text("\n".join([labels[0], ",".join(first), *labels[2:]]) + "\n")
    with pytest.raises(FoldersDataError) as err:
        preprocess({}, tmp_path / "store", options=example["options"], log=lambda line: None)
    assert str(err.value) == (
        f"{data / 'labels.csv'} line 2: image .hidden/{image.name} lies in .hidden, which fedmedbench "
        "skips (a hidden name, __MACOSX or the pipeline's results); move it to a plain folder"
    )


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS refuses file names that are not valid UTF-8")
def test_a_file_name_that_is_not_utf8_is_named_escaped(tmp_path):
    data = tmp_path / "data"
    example = write_example(data, counts=(2, 2, 2))
    for folder in ("images", "masks"):
        os.rename(data / "siteA" / folder / "siteA_001.png", os.fsencode(data / "siteA" / folder) + b"/caf\xe9.png")
    listing_digest(data)  # the DAG is built: such a name is listed, not a crash
    with pytest.raises(FoldersDataError) as err:
        preprocess({}, tmp_path / "store", options=example["options"], log=lambda line: None)
    assert str(err.value) == (
        f"{data}/siteA/images/caf\\xe9.png: the name is not valid UTF-8 text (the bytes shown as "
        "\\x..); rename it with UTF-8 characters only"
    )
    assert not (tmp_path / "store").exists()


@pytest.mark.slow
def test_a_run_with_its_results_inside_the_data_root_re_runs_nothing_and_neither_does_junk(tmp_path):
    """The whole pipeline on a data root holding its own results folder: a second look plans no job,
    and neither do a .DS_Store, a .git/ folder or a __MACOSX/ folder added to the data root."""
    import subprocess

    import yaml

    from .test_listing_reruns import BIN, ROOT, planned

    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "config.yaml", tmp_path / "config" / "config.yaml")
    data = tmp_path / "data"
    write_example(data, counts=(4, 4, 4))
    section = {"family": "folders", "kind": "segmentation", "mask_values": {0: 0, 128: 1, 255: 2}, "root": str(data)}
    overlay = {
        "run_name": "inside", "results_dir": "data/results", "selected_experiments": ["mine_table"],
        "data": {"mine": section},
        "tasks": {"mine": {"kind": "segmentation", "dataset": "mine", "model": {"init_features": 2}, "rounds": 1, "batch_size": 2}},
        "experiments": {"mine_table": {"runs": ["fedavg"], "seeds": [0], "metric": "dice_paper", "title": "Mine", "task": "mine"}},
    }  # fmt: skip
    (tmp_path / "inside.yaml").write_text(yaml.safe_dump(overlay))
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp_path)}

    def snakemake(*flags: str) -> subprocess.CompletedProcess:
        cmd = [
            str(BIN / "snakemake"),
            "-s",
            str(ROOT / "workflow" / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--cores",
            "2",
            *flags,
            "--configfile",
            "inside.yaml",
        ]
        if "-n" not in flags:
            cmd = [str(BIN / "python"), "-m", "fedmedbench", "with-jobserver", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)

    built = snakemake()
    assert built.returncode == 0, built.stderr[-4000:]
    assert (data / "results" / RESULTS_MARK).is_file() and (data / "results" / "inside" / "report.md").is_file()
    dry = snakemake("-n")
    assert dry.returncode == 0 and planned(dry) == [], dry.stdout[-3000:]
    add_junk(data)
    dry = snakemake("-n")
    assert dry.returncode == 0 and planned(dry) == [], dry.stdout[-3000:]
