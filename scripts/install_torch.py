#!/usr/bin/env python3
"""torch and torchvision (constraints.txt's pins) into the environment of ``--python``, before the rest of
the project (the Makefile's install step runs this, then ``pip install -e .``, which keeps what is here).

Which build:
- ``--index URL``: from that index (the Makefile's ``TORCH_INDEX=URL``).
- ``--index default`` or ``--index ""``: PyPI's default wheels; nothing is installed here.
- no ``--index``: PyPI's default wheels (the CUDA build) where ``nvidia-smi -L`` finds an NVIDIA GPU;
  elsewhere PyTorch's CPU-only index (~0.2 GB instead of ~3 GB of downloads: the CUDA libraries),
  after a short probe of that index; where it cannot be reached, one line says so and PyPI's default
  wheels come with the rest of the project.

Standard library only: it runs in a fresh virtual environment.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"
# The default wheels of torch 2.14.1 for Linux x86-64: torch 0.55 GB, nvidia-* 2.2 GB, triton 0.25 GB (5.3 GB
# installed); the CPU build's torch wheel is 0.19 GB (0.7 GB installed).
SIZES = "~0.2 GB instead of ~3 GB of downloads"


def torch_pins(constraints: Path = CONSTRAINTS) -> list[str]:
    """constraints.txt's pins of torch and torchvision, e.g. ['torch==2.14.1', 'torchvision==0.29.1']."""
    lines = [line.split("#")[0].strip() for line in constraints.read_text().splitlines()]
    return [line for line in lines if re.match(r"^(torch|torchvision)\s*==", line)]


def gpu_found() -> tuple[bool, str]:
    """(whether an NVIDIA GPU answers, in words how we know): ``nvidia-smi -L`` lists one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False, "nvidia-smi is not on PATH"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"nvidia-smi -L failed ({err})"
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return False, f"nvidia-smi -L lists no GPU (exit {listed.returncode})"
    return True, listed.stdout.splitlines()[0].strip()


def unreachable(index: str, project: str, timeout: float) -> str | None:
    """Why ``index`` cannot serve ``project`` (its PEP 503 page, what pip reads first), or None."""
    url = f"{index.rstrip('/')}/{project}/"
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return None
    except urllib.error.HTTPError as err:
        return f"{url} answered HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:  # DNS, refused, timeout, TLS
        return f"{url}: {getattr(err, 'reason', err)}"


def pip_install(python: str, packages: list[str], index: str, pip_args: list[str]) -> int:
    return subprocess.call([python, "-m", "pip", "install", *packages, "--index-url", index, *pip_args])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--index",
        default=None,
        help="the index to install from; 'default' or empty: PyPI's default wheels (default: chosen as described above)",
    )
    parser.add_argument("--python", default=sys.executable, help="the Python whose pip installs (default: this one)")
    parser.add_argument(
        "--packages",
        nargs="+",
        default=None,
        help="what to install (default: constraints.txt's torch and torchvision pins)",
    )
    parser.add_argument("--cpu-index", default=CPU_INDEX, help="the CPU-only index (default: %(default)s)")
    parser.add_argument(
        "--probe-timeout", type=float, default=5.0, help="seconds to wait for the CPU index (default: %(default)s)"
    )
    parser.add_argument("pip_args", nargs="*", help="after --: more arguments for pip install")
    args = parser.parse_args(argv)
    packages = args.packages or torch_pins()
    wanted = " ".join(packages)

    if args.index is not None:
        if args.index.strip() in ("", "default"):
            print(f"install_torch: TORCH_INDEX={args.index.strip()}: {wanted} from PyPI's default wheels", flush=True)
            return 0
        print(f"install_torch: {wanted} from {args.index} (TORCH_INDEX)", flush=True)
        return pip_install(args.python, packages, args.index, args.pip_args)

    gpu, how = gpu_found()
    if gpu:
        print(
            f"install_torch: NVIDIA GPU found ({how}): {wanted} from PyPI's default wheels (the CUDA build)", flush=True
        )
        return 0
    project = re.split(r"[=<>!~\[; ]", packages[0], maxsplit=1)[0]
    why = unreachable(args.cpu_index, project, args.probe_timeout)
    if why is not None:
        # One line, then the default wheels come with `pip install -e .`: a slower install, not a failed one.
        print(
            f"install_torch: no NVIDIA GPU ({how}) but PyTorch's CPU index cannot be reached ({why}): {wanted} from PyPI's default wheels instead (with CUDA libraries)",
            flush=True,
        )
        return 0
    print(
        f"install_torch: no NVIDIA GPU ({how}): {wanted} from PyTorch's CPU index {args.cpu_index} ({SIZES}; TORCH_INDEX=default for PyPI's)",
        flush=True,
    )
    code = pip_install(args.python, packages, args.cpu_index, args.pip_args)
    if code != 0:
        print(
            f"install_torch: pip could not install {wanted} from {args.cpu_index} (exit {code}): PyPI's default wheels instead (with CUDA libraries)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
