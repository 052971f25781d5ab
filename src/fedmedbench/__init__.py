"""fedmedbench: federated learning on medical images, from raw data to the papers' tables.

``version_line()`` is what ``fedmedbench --version`` prints and what heads every job's log: the
version, and the git commit of the checkout the code runs from (where it is one), so a log says
which code produced it.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

# The checkout holding src/fedmedbench (an editable install or PYTHONPATH=src), if this is one.
CHECKOUT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def version() -> str:
    import importlib.metadata  # noqa: PLC0415  (~20 ms (email, zipfile): only --version and a job's log header need it, not --help)

    try:
        return importlib.metadata.version("fedmedbench")
    except importlib.metadata.PackageNotFoundError:  # run from the source tree without installing
        pyproject = CHECKOUT / "pyproject.toml"
        found = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.MULTILINE) if pyproject.is_file() else None
        return found.group(1) if found else "unknown"


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """``<short hash>`` or ``<short hash>, with local changes`` (tracked files differ from it), or None
    where the code is not a git checkout or git is missing. Two git calls, ~20 ms."""
    if not (CHECKOUT / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(CHECKOUT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        changes = subprocess.run(
            ["git", "-C", str(CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + (", with local changes" if changes.returncode == 0 and changes.stdout.strip() else "")


def version_line() -> str:
    commit = git_commit()
    return f"fedmedbench {version()}" + (f" (git commit {commit})" if commit else "")
