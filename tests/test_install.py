"""The install step's choice of torch build (scripts/install_torch.py), without internet and without
touching torch: a made-up one-file package stands in for torch, served by a local PEP 503 index."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install_torch.py"
FAKE = "fmbfaketorch"


def fake_wheel(folder: Path) -> Path:
    """A valid pure-Python wheel of ``fmbfaketorch`` 1.0 (one module with VERSION = 1)."""
    files = {
        f"{FAKE}/__init__.py": b"VERSION = 1\n",
        f"{FAKE}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {FAKE}\nVersion: 1.0\n".encode(),
        f"{FAKE}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in files.items()
    ]
    files[f"{FAKE}-1.0.dist-info/RECORD"] = ("\n".join([*record, f"{FAKE}-1.0.dist-info/RECORD,,"]) + "\n").encode()
    path = folder / f"{FAKE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


@pytest.fixture()
def index(tmp_path):
    """http://127.0.0.1:<port>/simple: a PEP 503 index holding only the fake package."""
    root = tmp_path / "index"
    (root / "files").mkdir(parents=True)
    wheel = fake_wheel(root / "files")
    (root / "simple" / FAKE).mkdir(parents=True)
    (root / "simple" / FAKE / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="../../files/{wheel.name}">{wheel.name}</a></body></html>\n'
    )
    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no request lines in the test's output
        pass


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def install(tmp_path: Path, *args: str, gpu: bool | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """The script installing the fake package into tmp_path/target; PATH holds a fake nvidia-smi that
    lists a GPU (gpu=True), fails (gpu=False), or none at all (None). pip reads no config file and no
    PIP_* variable of this machine, and no proxy stands between it and 127.0.0.1."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.unlink(missing_ok=True)
    if gpu is not None:
        smi.write_text(
            "#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\n"
            if gpu
            else "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"
        )
        smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and not k.lower().endswith("_proxy")}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    command = [
        sys.executable,
        str(SCRIPT),
        "--packages",
        f"{FAKE}==1.0",
        *args,
        "--",
        "--target",
        str(tmp_path / "target"),
        "--no-deps",
    ]
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    return result, time.monotonic() - start


def installed(tmp_path: Path) -> bool:
    return (tmp_path / "target" / FAKE / "__init__.py").is_file()


def lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("install_torch:")]


def test_without_a_gpu_it_installs_from_the_cpu_index(tmp_path, index):
    result, _ = install(tmp_path, "--cpu-index", index, gpu=None)
    assert result.returncode == 0, result.stderr
    assert installed(tmp_path)
    assert lines(result) == [
        f"install_torch: no NVIDIA GPU (nvidia-smi is not on PATH): {FAKE}==1.0 from PyTorch's CPU index {index} "
        "(~0.2 GB instead of ~3 GB of downloads; TORCH_INDEX=default for PyPI's)"
    ]


def test_a_failing_nvidia_smi_counts_as_no_gpu(tmp_path, index):
    result, _ = install(tmp_path, "--cpu-index", index, gpu=False)
    assert result.returncode == 0, result.stderr
    assert installed(tmp_path)
    assert lines(result)[0].startswith("install_torch: no NVIDIA GPU (nvidia-smi -L lists no GPU (exit 9))")


def test_with_a_gpu_it_leaves_torch_to_pypi(tmp_path, index):
    result, _ = install(tmp_path, "--cpu-index", index, gpu=True)
    assert result.returncode == 0, result.stderr
    assert not installed(tmp_path)
    assert lines(result) == [
        f"install_torch: NVIDIA GPU found (GPU 0: NVIDIA H100 (UUID: GPU-0)): {FAKE}==1.0 from PyPI's default wheels (the CUDA build)"
    ]


@pytest.mark.parametrize("why", ["refused", "silent"])
def test_an_unreachable_cpu_index_falls_back_in_one_line_and_quickly(tmp_path, why):
    with contextlib.ExitStack() as stack:
        if why == "refused":
            url = f"http://127.0.0.1:{closed_port()}/simple"
        else:  # a server that accepts the connection and never answers: the probe's timeout ends it
            silent = stack.enter_context(socket.socket())
            silent.bind(("127.0.0.1", 0))
            silent.listen(4)
            url = f"http://127.0.0.1:{silent.getsockname()[1]}/simple"
        result, _ = install(tmp_path, "--cpu-index", url, "--probe-timeout", "1")
    assert result.returncode == 0, result.stderr
    assert not installed(tmp_path)
    [line] = lines(result)
    assert line.startswith(
        f"install_torch: no NVIDIA GPU (nvidia-smi is not on PATH) but PyTorch's CPU index cannot be reached ({url}/{FAKE}/: "
    )
    assert line.endswith(f"): {FAKE}==1.0 from PyPI's default wheels instead (with CUDA libraries)")
    assert ("refused" in line) if why == "refused" else ("timed out" in line)


def test_torch_index_overrides_the_choice(tmp_path, index):
    result, _ = install(tmp_path, "--index", index, gpu=True)  # a GPU, and still the index given
    assert result.returncode == 0, result.stderr
    assert installed(tmp_path)
    assert lines(result) == [f"install_torch: {FAKE}==1.0 from {index} (TORCH_INDEX)"]
    for default in ("default", ""):  # PyPI's wheels, which `pip install -e .` brings: nothing here
        result, _ = install(tmp_path / f"index-{default}", "--index", default, "--cpu-index", index)
        assert result.returncode == 0, result.stderr
        assert not installed(tmp_path / f"index-{default}")
        assert lines(result) == [f"install_torch: TORCH_INDEX={default}: {FAKE}==1.0 from PyPI's default wheels"]


def test_the_packages_are_the_tested_torch_pins():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from install_torch import torch_pins
    finally:
        sys.path.remove(str(SCRIPT.parent))
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = torch_pins()
    assert [p.split("==")[0] for p in pins] == ["torch", "torchvision"]
    assert all(p in lines for p in pins)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, ""),
        ("", ' --index ""'),
        ("default", ' --index "default"'),
        ("http://idx/simple", ' --index "http://idx/simple"'),
    ],
)
def test_the_makefile_passes_torch_index_only_when_set(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX"}
    command = [
        "make",
        "-n",
        "-B",
        "-C",
        str(ROOT),
        ".venv/.installed",
        *([f"TORCH_INDEX={given}"] if given is not None else []),
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    script_lines = [line.strip() for line in result.stdout.splitlines() if "install_torch.py" in line]
    assert script_lines == [f".venv/bin/python scripts/install_torch.py{expected}"]
