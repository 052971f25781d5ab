"""Your own data, split as a clinician splits it: two masks swapped with their sizes and times kept
(fixing swapped labels in data unpacked from an archive) re-run the preprocessing of that dataset and
everything after it, and nothing of another dataset; a tree left as it was re-runs nothing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from fedmedbench.data.folders import write_example

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ARCHIVE_TIME = 1_600_000_000 * 10**9  # every file unpacked from one archive: one modification time


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


def as_unpacked(data: Path) -> None:
    for path in data.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(ARCHIVE_TIME, ARCHIVE_TIME))


def swap_by_rename(a: Path, b: Path) -> None:
    spare = a.with_name(a.name + ".swap")
    os.rename(a, spare)
    os.rename(b, a)
    os.rename(spare, b)
    for path in (a, b):
        os.utime(path, ns=(ARCHIVE_TIME, ARCHIVE_TIME))


def swap_in_place(a: Path, b: Path) -> None:
    content_a, content_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(content_b)
    b.write_bytes(content_a)
    for path in (a, b):
        os.utime(path, ns=(ARCHIVE_TIME, ARCHIVE_TIME))


@pytest.mark.slow
def test_swapped_masks_re_run_exactly_their_datasets_jobs(tmp_path):
    (tmp_path / "config").mkdir()
    shutil.copy(
        ROOT / "config" / "config.yaml", tmp_path / "config" / "config.yaml"
    )  # the Snakefile's default configfile
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    write_example(mine, counts=(5, 5, 5))
    write_example(theirs, counts=(5, 5, 5), seed=1)
    masks = sorted((mine / "siteA" / "masks").iterdir())
    for mask in masks:  # stored without compression: every mask has the same byte count
        Image.open(mask).save(mask, compress_level=0)
    a, b = masks[:2]
    assert a.stat().st_size == b.stat().st_size and a.read_bytes() != b.read_bytes()
    as_unpacked(mine)
    as_unpacked(theirs)

    section = {"family": "folders", "kind": "segmentation", "mask_values": {0: 0, 128: 1, 255: 2}}
    task = {"kind": "segmentation", "model": {"init_features": 2}, "rounds": 1, "batch_size": 2}
    experiment = {"runs": ["fedavg"], "seeds": [0], "metric": "dice_paper"}
    overlay = {
        "run_name": "swap",
        "selected_experiments": ["mine_table", "theirs_table"],
        "data": {"mine": {**section, "root": str(mine)}, "theirs": {**section, "root": str(theirs)}},
        "tasks": {"mine": {**task, "dataset": "mine"}, "theirs": {**task, "dataset": "theirs"}},
        "experiments": {"mine_table": {**experiment, "title": "Mine", "task": "mine"}, "theirs_table": {**experiment, "title": "Theirs", "task": "theirs"}},
    }  # fmt: skip
    (tmp_path / "swap.yaml").write_text(yaml.safe_dump(overlay))
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
            "swap.yaml",
        ]
        if "-n" not in flags:
            cmd = [str(BIN / "python"), "-m", "fedmedbench", "with-jobserver", *cmd]  # as `make demo`
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)

    def reruns() -> list[str]:
        dry = snakemake("-n")
        assert dry.returncode == 0, dry.stderr[-3000:]
        return planned(dry)

    built = snakemake()
    assert built.returncode == 0, built.stderr[-4000:]
    assert reruns() == []

    mine_jobs = sorted([
        "preprocess[dataset=mine, protocol=default]", "split[dataset=mine, protocol=default]",
        "train[task=mine, run=fedavg, seed=0]", "collect_metrics[experiment=mine_table]",
        "convergence_figure[experiment=mine_table]", "table[experiment=mine_table]", "reproduction_report[]",
    ])  # fmt: skip
    stat_a, stat_b = a.stat(), b.stat()
    swap_by_rename(a, b)  # the fix: each mask now at the other's name, sizes and times as they were
    assert [(p.stat().st_size, p.stat().st_mtime_ns) for p in (a, b)] == [
        (stat_a.st_size, stat_a.st_mtime_ns),
        (stat_b.st_size, stat_b.st_mtime_ns),
    ]
    swapped = reruns()
    assert len(swapped) == 7 and swapped == mine_jobs
    assert not [job for job in swapped if "theirs" in job]

    swap_by_rename(a, b)  # back as built: the same contents, nothing to do
    assert reruns() == []

    swap_in_place(a, b)  # the same files rewritten, times put back
    assert reruns() == mine_jobs

    # The content hashes are cached under the run's results, not in the data.
    cached = sorted(p.name for p in (tmp_path / "results" / "swap" / ".cache" / "listing").iterdir())
    assert cached == ["mine.json", "theirs.json"]
    assert not [p for p in (*mine.rglob("*"), *theirs.rglob("*")) if p.suffix not in (".png",) and p.is_file()]
