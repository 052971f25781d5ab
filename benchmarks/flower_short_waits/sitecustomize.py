"""BENCHMARK ONLY, never on by default, imported by no product code: Flower 1.42's hard-coded waits
on the path of a message, shortened, to measure what they cost a round (``bench_federation.py
--flower-waits short|both``).

How it gets in: ``bench_federation.py`` puts this folder first on ``PYTHONPATH`` of the federation
it starts (SuperLink, SuperNodes, the SuperExecs they spawn, the warm app server and its forks, the
``flwr`` CLI), so every such interpreter imports this file at start-up (``site`` imports a
``sitecustomize`` module when one is on the path; the venv has none of its own to shadow). Nothing
happens unless ``FMB_FLOWER_SHORT_WAITS_SWITCH`` is set: then ``time.sleep`` is wrapped, and a
call whose caller is one of the functions in ``WAITS`` below sleeps ``min(requested, short)``
while the switch file exists (stock Flower while it does not: the bench flips it between runs on
one federation start). Every other ``time.sleep`` (ours, Flower's retries, log uploads, anything
else) passes through unchanged: the caller is looked up per call, by its module and function name.

Flower 1.42's waits on a message's path (``grep -rn sleep flwr/``), all shortened here:
- ``flwr/supernode/start_client_internal.py`` ``start_client_internal``: 3 s after a pull of the
  SuperLink that found no message (the SuperNode's main loop);
- the same file, ``_push_messages``: the reply of the ClientApp looked for every 0.5 s, and
  ``yield_object_contents``: 0.5 s while an object of the reply is not stored yet;
- ``flwr/supercore/superexec/run_superexec.py`` ``run_superexec``: a SuperExec asks for a task to
  launch every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (1 s by Flower's default; 0.1 s as
  ``federation.local`` starts it);
- ``flwr/superlink/grid/http_grid.py`` ``send_and_receive``: Flower's own ``Grid.send_and_receive``
  waits 3 s between pulls of replies (our ServerApp pushes and pulls itself, so only the
  ``--ab`` leg's app meets it);
- ``flwr/supercore/inflatable/inflatable_utils.py`` ``pull_with_retries`` (inside ``pull_objects``):
  an object asked for before it is stored (a message's objects follow the message: the SuperNode's
  pull from the SuperLink, the ClientApp's from the SuperNode, the ServerApp's pull of replies)
  is asked again after ``PULL_INITIAL_BACKOFF`` = 1 s, doubling up to 10 s (``threading.Event.wait``,
  not ``time.sleep``: that method is wrapped the same way).
Not shortened (not on a message's path; once per run, so they cancel in the bench's
``t(2R) - t(R)``): the ServerApp's log uploader (0.2 s) and its ``flush_logs`` at exit (up to
1 s), the SuperLink's log and event streams to ``flwr run --stream`` (0.5 s), start-up loops.

Proof that it applies: each process appends one line per wait it shortened (the first time, per
process) to ``FMB_FLOWER_SHORT_WAITS_LOG`` and prints it to stderr (the process's own log);
the bench reads the file and refuses to report a short-waits row the patch did not reach.

With ``FMB_FLOWER_PROFILE_LOG`` set (``bench_federation.py --profile``) this file also loads
``fmb_flower_profile`` (same folder), which times the steps of each message in these processes.
"""

import os
import sys
import threading
import time

# (module, function) of each hard-coded wait -> what it is (for the log line)
WAITS = {
    ("flwr.supernode.start_client_internal", "start_client_internal"): "SuperNode: wait after an empty pull (3 s)",
    (
        "flwr.supernode.start_client_internal",
        "_push_messages",
    ): "SuperNode: wait for the ClientApp's reply (0.5 s steps)",
    (
        "flwr.supernode.start_client_internal",
        "yield_object_contents",
    ): "SuperNode: wait for a reply object (0.5 s steps)",
    ("flwr.supercore.superexec.run_superexec", "run_superexec"): "SuperExec: task poll interval",
    ("flwr.superlink.grid.http_grid", "send_and_receive"): "Grid.send_and_receive: wait between pulls (3 s)",
    (
        "flwr.supercore.inflatable.inflatable_utils",
        "pull_with_retries",
    ): "object pull: backoff when not yet stored (1 s, doubling)",
}

_real_sleep = time.sleep
_real_event_wait = threading.Event.wait


def _shortened(frame, seconds):
    """``seconds``, or ``short`` where the caller is one of ``WAITS`` and the switch file exists."""
    key = (frame.f_globals.get("__name__"), frame.f_code.co_name)
    if key in WAITS and seconds is not None and seconds > _SHORT and _SWITCH and os.path.exists(_SWITCH):
        _note(key, seconds)
        return _SHORT
    return seconds


def short_sleep(seconds):
    """``time.sleep`` with the waits of ``WAITS`` cut to ``short`` while the switch file exists."""
    _real_sleep(_shortened(sys._getframe(1), seconds))  # frame 1: the caller, whose wait this is


def short_event_wait(self, timeout=None):
    """``threading.Event.wait`` likewise (Flower's object-pull backoff); with ``--profile`` each such
    backoff is logged (stock or short): how often a message's object was asked for too early."""
    frame = sys._getframe(1)
    if (
        frame.f_code.co_name != "pull_with_retries"
        or frame.f_globals.get("__name__") != "flwr.supercore.inflatable.inflatable_utils"
    ):
        return _real_event_wait(self, timeout)
    t0 = time.time()
    try:
        return _real_event_wait(self, _shortened(frame, timeout))
    finally:
        if _PROFILE:
            import fmb_flower_profile

            fmb_flower_profile.record(
                "flwr.supercore.inflatable.inflatable_utils:pull_with_retries(backoff)", t0, time.time()
            )


_logged: dict[int, set] = {}  # {pid: keys logged}: a fork (the warm app server's) starts afresh


def _note(key, seconds) -> None:
    done = _logged.setdefault(os.getpid(), set())
    if key in done:
        return
    done.add(key)
    line = f"flower_short_waits: pid {os.getpid()} ({os.path.basename(sys.argv[0]) if sys.argv else '?'}) {key[0]}:{key[1]} {seconds:g} s -> {_SHORT:g} s ({WAITS[key]})\n"
    sys.stderr.write(line)
    if _LOG:
        with open(_LOG, "a") as log:  # one short append per line: whole lines from concurrent processes
            log.write(line)


_SWITCH = os.environ.get("FMB_FLOWER_SHORT_WAITS_SWITCH", "")
_SHORT = float(os.environ.get("FMB_FLOWER_SHORT_WAITS_S", "0.02"))
_LOG = os.environ.get("FMB_FLOWER_SHORT_WAITS_LOG", "")
_PROFILE = os.environ.get("FMB_FLOWER_PROFILE_LOG", "")
if _SWITCH or _PROFILE:
    time.sleep = short_sleep
    threading.Event.wait = short_event_wait
if os.environ.get("FMB_FLOWER_PROFILE_LOG"):  # bench_federation.py --profile: time the steps of a message
    import fmb_flower_profile

    fmb_flower_profile.install()
