"""The commands outside the happy path: run outside the checkout, a job's log header, `new-method`
without --out and with a name the file system cannot hold, and what `methods` says of each method."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedmedbench import cli, version
from fedmedbench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def fedmedbench(*args: str, cwd: Path, stderr=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedmedbench", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=stderr, text=True
    )


@pytest.mark.parametrize("command", ["estimate", "check-data"])
def test_outside_the_checkout_a_command_says_what_to_pass(tmp_path, command):
    result = fedmedbench(command, cwd=tmp_path)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.endswith(
        f"ConfigError: --configfile: found no config/config.yaml in {tmp_path}: run the command in the fedmedbench checkout, "
        "or pass --configfile PATH/TO/config/config.yaml [overlay.yaml ...]"
    )
    missing = fedmedbench(command, "--configfile", str(ROOT / "config" / "config.yaml"), "overlay.yaml", cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr.strip().splitlines()[-1].endswith(
        f"ConfigError: --configfile: overlay.yaml: no such file (in {tmp_path})"
    )
    assert "Traceback" not in result.stderr + missing.stderr and not list(tmp_path.iterdir())


def test_a_jobs_log_starts_with_the_version_and_a_terminal_keeps_one_line(tmp_path):
    log = tmp_path / "extract.log"
    with open(log, "w") as handle:  # as a rule's `&> {log}`
        result = fedmedbench("extract", "--archive", "missing.zip", "--out", "x", cwd=tmp_path, stderr=handle)
    assert result.returncode == 1
    first, *rest = log.read_text().splitlines()
    assert (
        first.split(" INFO fedmedbench: ")[1].startswith(f"fedmedbench {version()}")
        and len(rest) == 1
        and "missing.zip" in rest[0]
    )
    piped = fedmedbench("extract", "--archive", "missing.zip", "--out", "x", cwd=tmp_path)
    assert piped.returncode == 1 and len(piped.stderr.strip().splitlines()) == 1 and "missing.zip" in piped.stderr


def test_new_method_writes_dot_name_without_out(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["new-method", "cwdfed"]) == 0
    assert capsys.readouterr().out.startswith(
        "wrote 5 files into ./cwdfed: `pip install -e ./cwdfed` registers 'cwdfed'"
    )
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == [
        "cwdfed/README.md",
        "cwdfed/pyproject.toml",
        "cwdfed/src/cwdfed/__init__.py",
        "cwdfed/src/cwdfed/method.py",
        "cwdfed/tests/test_cwdfed.py",
    ]
    assert oct((tmp_path / "cwdfed").stat().st_mode & 0o777) == oct(
        0o777 & ~_umask()
    )  # not the temporary folder's 0700


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("extra", [1, 85])  # one too many; a name the file system itself refuses (300 on ext4)
def test_a_name_too_long_for_the_file_system_writes_nothing(tmp_path, capsys, monkeypatch, extra):
    monkeypatch.chdir(tmp_path)
    limit = os.pathconf(tmp_path, "PC_NAME_MAX") - 40  # 215 on ext4, tmpfs, xfs
    name = "f" * (limit + extra)
    assert cli.main(["new-method", name]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(
        f"ConfigError: new-method: the name is {len(name)} characters long; at most {limit} here (the file system takes "
        f"{limit + 40} per file name, and pip's files add up to 40 to it); choose a shorter name"
    )
    assert not list(tmp_path.iterdir())
    assert (
        cli.main(["new-method", "f" * limit]) == 0
        and (tmp_path / ("f" * limit) / "tests" / f"test_{'f' * limit}.py").is_file()
    )


def test_a_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    from fedmedbench import new_method as template

    written = []

    def failing(path, text):
        if len(written) == 3:
            raise OSError(28, "No space left on device", str(path))
        written.append(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    monkeypatch.setattr(template, "atomic_write_text", failing)
    with pytest.raises(OSError, match="No space left"):
        template.new_method("halffed", tmp_path / "deep" / "er" / "halffed")
    assert len(written) == 3 and not list(tmp_path.iterdir())  # neither the files nor the parents made for them
    (tmp_path / "empty").mkdir()
    with pytest.raises(OSError):
        template.new_method("halffed", tmp_path / "empty")
    assert not list((tmp_path / "empty").iterdir()) and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_methods_says_what_each_method_is_its_paper_and_where_bn_statistics_live(capsys):
    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    blocks = {}
    for line in out.splitlines():
        if not line.startswith(" "):
            name = line.split()[0]
            blocks[name] = [line]
        else:
            blocks[name].append(line.strip())
    assert len(blocks) >= 18
    bn = {
        name: next(line for line in lines if line.startswith("BN statistics: "))[len("BN statistics: ") :]
        for name, lines in blocks.items()
    }
    assert bn["fedbn"] == bn["prrfl"] == "local (running statistics and affine weights never leave the client)"
    assert bn["silobn"] == "local running statistics; the affine weights are averaged"
    assert bn["solo"] == "local (nothing is sent after the common start: each client keeps its whole model)"
    assert (
        bn["fedavg"]
        == bn["fedprox"]
        == "averaged with the model (a task's aggregation.bn_buffers: local keeps them at each client)"
    )
    assert blocks["fedbn"][1:3] == [
        "FedBN: batch-norm layers stay local, everything else is FedAvg.",
        "paper: Li et al., ICLR 2021",
    ]
    assert blocks["solo"][1].startswith("Solo: every client trains alone") and not blocks["solo"][2].startswith(
        "paper:"
    )
    assert blocks["fedbn"][0].split() == ["fedbn", "global", "built-in,", "fedmedbench.methods.fedbn"]
    # Floats at 6 significant digits, still floats; no path of this machine.
    assert "threshold_coef=0.333333," in out and "eps=1e-12" in out and "mu=1.0," in out
    assert str(ROOT) not in out and not re.search(r"\(/", out)


def test_bn_statistics_come_from_the_methods_key_policy(tmp_path, monkeypatch):
    """A plug-in that keeps only running statistics local is told apart from FedBN by its code alone."""
    from fedmedbench.registry import bn_statistics, forget

    (tmp_path / "statsfed.py").write_text(
        '"""statsfed: a test method.\n"""\nfrom fedmedbench.fl import client\nfrom fedmedbench.fl.server import Server\n'
        "from fedmedbench.ops.aggregate import batchnorm_keys, buffer_keys\nDEFAULTS = {}\nPERSONALIZED = False\n\n\n"
        "class Client(client.Client):\n    def declare_local_keys(self):\n        return buffer_keys(self.model) & batchnorm_keys(self.model)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    forget()
    try:
        assert bn_statistics("statsfed", "statsfed") == "local running statistics; the affine weights are averaged"
        (tmp_path / "statsfed.py").write_text(
            (tmp_path / "statsfed.py")
            .read_text()
            .replace("buffer_keys(self.model) & batchnorm_keys", "self.extra | batchnorm_keys")
        )
        sys.modules.pop("statsfed", None)
        forget()
        assert bn_statistics("statsfed", "statsfed").startswith(
            "not known (its Client.declare_local_keys needs more than the model: AttributeError"
        )
    finally:
        sys.modules.pop("statsfed", None)
        forget()


def test_the_configs_missing_default_is_one_line_in_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^--configfile: found no config/config\.yaml in "):
        cli.config_files(["config/config.yaml"])
