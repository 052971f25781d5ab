"""A run's ``final.json`` sealed with a digest of its content, so that a score edited by hand never
reaches a table: the training job writes it through :func:`write_final`, and every report job reads
it through ``report.inputs.read_final``, which checks it (:func:`check_digest`).

The digest is a SHA-256 of the file's content without the ``digest`` key, as canonical JSON (sorted
keys, no spaces): the same value whichever way the file is indented. It detects edits, not forgery
(anyone can compute it): it keeps a slip of the hand from becoming a published number.
No torch import here (report jobs import it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fedmedbench.errors import DataError
from fedmedbench.files import atomic_write_text

DIGEST_KEY = "digest"


def content_digest(final: dict) -> str:
    """``sha256:<hex>`` of ``final`` without its digest, as JSON reads it back (a tuple as a list, an
    integer key as a string: the writer's and the reader's view of one file give one value)."""
    body = json.loads(json.dumps({k: v for k, v in final.items() if k != DIGEST_KEY}))
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def sealed(final: dict) -> dict:
    """``final`` with its digest."""
    return {**final, DIGEST_KEY: content_digest(final)}


def write_final(path: Path | str, final: dict) -> dict:
    """Write ``final`` to ``path`` (atomically) with its digest; returns what was written."""
    final = sealed(final)
    atomic_write_text(Path(path), json.dumps(final, indent=2, sort_keys=True) + "\n")
    return final


def check_digest(path: Path | str, final: dict) -> None:
    """DataError naming ``path`` when ``final`` (its content) lacks its digest or does not match it."""
    recorded = final.get(DIGEST_KEY)
    if recorded is None:
        raise DataError(
            f"{path}: has no digest of its scores (written by hand, or by a fedmedbench before digests); rerun the training job that wrote it"
        )
    if recorded != content_digest(final):
        raise DataError(
            f"{path}: its content does not match its digest (edited after the training job wrote it?); rerun the training job that wrote it"
        )
