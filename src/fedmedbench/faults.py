"""A test hook that kills the process (SIGKILL, like the OOM killer or ``scancel``) at a chosen moment,
to prove that a job resumes from anywhere with the same numbers.

``FEDMEDBENCH_KILL_AT=<point>:<n>`` kills at the n-th time ``point`` is reached. Points:
``round_end`` (after round n's checkpoint), ``round_trained`` (round n's training replies in, nothing aggregated), ``train_step``, ``eval_batch`` and ``checkpoint_write``
(a checkpoint's payload written to its temporary, the checksum not yet: a torn temporary, before
the rename); for the data steps ``extract_member`` (before
the n-th archive member is written; ``safe_extract`` arms itself) and ``store_write`` (a store
client folder half written: images saved, labels not yet). Unset: every call is one dict lookup.

It sits below both the data steps and the engine (both arm it and reach its points), so that the data
layer imports nothing of training.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "FEDMEDBENCH_KILL_AT"
POINTS = ("round_end", "round_trained", "train_step", "eval_batch", "checkpoint_write", "extract_member", "store_write")
_armed: dict = {}


def arm() -> None:
    """Read the environment (once per training run)."""
    _armed.clear()
    spec = os.environ.get(KILL_AT_ENV)
    if spec:
        point, _, count = spec.partition(":")
        if point not in POINTS or not count.isdigit():
            raise ValueError(f"{KILL_AT_ENV}={spec!r}: expected <point>:<n> with point in {POINTS}")
        _armed.update(point=point, at=int(count), seen=0)


def reached(point: str) -> None:
    if _armed and _armed["point"] == point:
        _armed["seen"] += 1
        if _armed["seen"] == _armed["at"]:
            os.kill(os.getpid(), signal.SIGKILL)
