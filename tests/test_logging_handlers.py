"""No logging handler outlives its stream: ``cli.main`` runs in-process in many tests (each under its
own capture of stderr), and a handler bound to one test's stderr made every later record print
``--- Logging error --- ValueError: I/O operation on closed file``."""

from __future__ import annotations

import io
import logging
import sys

from fedmedbench import cli


def test_the_cli_handler_writes_to_the_stderr_of_the_moment_and_a_second_setup_replaces_it(monkeypatch):
    root = logging.getLogger()
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    cli._setup_logging()
    logging.getLogger("fedmedbench.test").info("to the first stream")
    first.close()  # as pytest closes a test's capture
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)  # handleError would print its "--- Logging error ---" here
    logging.getLogger("fedmedbench.test").info("to the second stream")
    cli._setup_logging(verbose=True)  # a second main() in the same process
    ours = [h for h in root.handlers if isinstance(h, cli._CurrentStderr)]
    try:
        assert "Logging error" not in second.getvalue()
        assert second.getvalue().count("to the second stream") == 1
        assert len(ours) == 1 and root.level == logging.DEBUG
    finally:
        for handler in ours:
            root.removeHandler(handler)


def test_the_cli_setup_leaves_other_handlers_installed(monkeypatch):
    root = logging.getLogger()
    stream = io.StringIO()
    other = logging.StreamHandler(stream)
    root.addHandler(other)
    try:
        cli._setup_logging()
        assert other in root.handlers  # basicConfig(force=True) removed it (pytest's caplog handler too)
    finally:
        root.removeHandler(other)
        for handler in [h for h in root.handlers if isinstance(h, cli._CurrentStderr)]:
            root.removeHandler(handler)
