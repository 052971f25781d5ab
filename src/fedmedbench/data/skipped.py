"""What a user's data root holds that is not data: the one rule that the reader of a user's own data
(``family: folders``) and the listing digest (``digest.listing_digest``, which decides when
preprocessing re-runs) share, so a file the reader never looks at never re-runs a job.

Skipped, at any depth under the data root: hidden names (starting with ``.``: ``.DS_Store``,
``.git/``, macOS ``._*`` files, ``.ipynb_checkpoints/``), ``__MACOSX/``, ``Thumbs.db`` and
``desktop.ini`` (written by file browsers), and a folder holding ``RESULTS_MARK``: the pipeline's
own results folder, which the workflow marks before it lists the data root, so results written
inside the data root are neither read as data nor re-run preprocessing.

Standard library only: the Snakefile imports it (through ``digest``) when it builds the DAG.
"""

from __future__ import annotations

import os

IGNORED_NAMES = {"__macosx", "thumbs.db", "desktop.ini"}  # compared in lower case

# A hidden file, so the mark itself is skipped wherever it lies.
RESULTS_MARK = ".fedmedbench-results"


def skipped(path: str | os.PathLike) -> bool:
    """True for a file or folder under a data root that is not data (see the module docstring).
    Only a folder is looked into (for ``RESULTS_MARK``): one ``stat`` per folder."""
    name = os.path.basename(os.fspath(path))
    if name.startswith(".") or name.lower() in IGNORED_NAMES:
        return True
    return os.path.isfile(os.path.join(path, RESULTS_MARK))


def mark_results(folder: str | os.PathLike, create: bool = True) -> None:
    """Mark ``folder`` as the pipeline's results, for ``skipped``; a missing folder is created
    (``create``) or left alone. A folder that cannot be written is left unmarked: the mark only keeps
    results out of a data root around them."""
    path = os.path.join(os.fspath(folder), RESULTS_MARK)
    if os.path.isfile(path) or not (create or os.path.isdir(folder)):
        return
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as handle:
            handle.write("fedmedbench results: never read as data (fedmedbench.data.skipped)\n")
    except OSError:
        pass
