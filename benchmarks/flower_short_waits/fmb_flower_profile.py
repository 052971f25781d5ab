"""BENCHMARK ONLY (``bench_federation.py --profile``): where a federated round's time goes. Loaded by
this folder's ``sitecustomize`` when ``FMB_FLOWER_PROFILE_LOG`` is set; imported by no product code.

An import hook wraps the functions of ``TIMED`` when their module is first imported, in every
process of the federation (SuperNodes, SuperExecs, the warm app server before it forks the app
processes): each call, however it ends, appends one JSON line ``{"pid", "where" (the process's working
folder: ``site-<name>`` for a site's processes), "what" (module:function), "t0", "t1"}`` (wall
clock, seconds) to the log. A pull of the SuperLink that found nothing is not logged (the SuperNode
pulls every few milliseconds with short waits). Functions that are missing (renamed in another
version) are skipped: the profile has fewer rows, the run is unchanged.
"""

import functools
import importlib.abc
import json
import os
import sys
import time

LOG = os.environ.get("FMB_FLOWER_PROFILE_LOG", "")

TIMED = {
    # The SuperNode: a message pulled from the SuperLink and stored; the reply waited for and pushed.
    "flwr.supernode.start_client_internal": ("_pull_and_store_message", "_push_messages"),
    # The SuperExec: starting an app process (here: the warm launcher, which has the app forked).
    "flwr.supercore.superexec.plugin.base_exec_plugin": ("BaseExecPlugin.launch_task",),
    # The app process: Flower's ClientApp runtime (whole, and its steps), then the app itself.
    "flwr.supernode.runtime.run_clientapp": ("run_clientapp", "pull_task_input", "install_from_fab", "push_message"),
    "flwr.clientapp.client_app": ("ClientApp.__call__",),
    # Ours, inside the app: the site's state read and written, a step's work, the reply packed.
    "fedmedbench.federation.clientapp": (
        "load_site",
        "save_site",
        "build_site",
        "take_snapshot",
        "handle",
        "reply",
        "unpack",
    ),
    # The ServerApp: one step, from pushing its messages to the last reply.
    "fedmedbench.federation.serverapp": ("send_and_receive",),
}


def record(what, t0, t1, **more) -> None:
    line = (
        json.dumps(
            {"pid": os.getpid(), "where": os.path.basename(os.getcwd()), "what": what, "t0": t0, "t1": t1, **more}
        )
        + "\n"
    )
    with open(LOG, "a") as log:  # one append per line: whole lines from concurrent processes
        log.write(line)


def timed(function, what: str):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        t0, result = time.time(), None
        try:
            result = function(*args, **kwargs)
            return result
        finally:  # also when it ends the process (run_clientapp exits through SystemExit)
            if not (what.endswith("_pull_and_store_message") and result is None):
                more = {}
                if what.endswith(
                    "ClientApp.__call__"
                ):  # which step of the protocol (train, evaluate, query.hello, ...)
                    message = kwargs.get("message", args[1] if len(args) > 1 else None)
                    more["kind"] = getattr(getattr(message, "metadata", None), "message_type", None)
                record(what, t0, time.time(), **more)

    wrapper.__fmb_timed__ = True
    return wrapper


def wrap_module(module) -> None:
    for name in TIMED.get(module.__name__, ()):
        owner, _, attribute = name.rpartition(".")
        holder = getattr(module, owner, None) if owner else module
        function = getattr(holder, attribute, None) if holder is not None else None
        if callable(function) and not getattr(function, "__fmb_timed__", False):
            setattr(holder, attribute, timed(function, f"{module.__name__}:{name}"))


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the wrapping, before any ``from module import name`` binds."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        wrap_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in TIMED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    for name in TIMED:  # already imported (not the case at interpreter start-up): wrap in place
        if name in sys.modules:
            wrap_module(sys.modules[name])
    sys.meta_path.insert(0, _Finder())
