"""Which method hook is running, so that a stop can name it; and the dtypes of the state a hook hands on.

``fl/hooks.py`` wraps every hook of a method's Server and Client; each call is recorded here while it
runs (:func:`entered` / :func:`left`, per thread). Around a training (the ``train`` command),
:func:`watching` turns SIGTERM and Ctrl-C (SIGINT) into ``errors.HookStopped``, whose one line names
the method, the hook, the round and the client that was running, e.g. ``method 'myfed', Client.train,
round 3, client 'B': stopped by SIGTERM``; with ``hook_timeout_s`` a hook that has not returned after
that many seconds is ended with the same line (SIGALRM, POSIX, the main thread: the engine calls every
hook from it). Without a hook running, SIGTERM and Ctrl-C behave as before.

:func:`non_floating` finds a tensor a hook hands on (the server's global state after ``aggregate``, a
package, a client's reply) that is not floating where the model's is: an int64 aggregate would
otherwise be cast back silently, its weights rounded, in the next ``receive``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

import torch

from fedmedbench.errors import HookStopped

_local = threading.local()  # .calls: the where() of each hook call in progress, innermost last
_timeout_s: float | None = None  # hook_timeout_s of the training being watched (None: off)


def _calls() -> list[Callable[[], str]]:
    calls = getattr(_local, "calls", None)
    if calls is None:
        calls = _local.calls = []
    return calls


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def entered(where: Callable[[], str]) -> None:
    """A hook call starts; ``where()`` names it (formatted only if a stop needs it). The outermost
    call of the main thread starts the timeout's clock: a hook called by another (``train`` calls
    ``loss``) runs within its caller's time."""
    calls = _calls()
    calls.append(where)
    if len(calls) == 1 and _timeout_s and _main_thread():
        signal.setitimer(signal.ITIMER_REAL, _timeout_s)


def left() -> None:
    calls = _calls()
    calls.pop()
    if not calls and _timeout_s and _main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


def running() -> str | None:
    """The innermost hook call in progress in this thread (``method 'x', Client.train, round 3,
    client 'B'``), or None."""
    calls = _calls()
    return calls[-1]() if calls else None


@contextlib.contextmanager
def watching(timeout_s: float | None = None) -> Iterator[None]:
    """Within: SIGTERM or SIGINT while a hook runs raises HookStopped naming it (exit 128 + the
    signal's number), and so does a hook running longer than ``timeout_s`` seconds (exit 1). Outside
    the main thread (no signal handler can be set there) it changes nothing."""
    global _timeout_s
    if not _main_thread():
        yield
        return

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        where = running()
        if where is None:  # between hooks: as before (KeyboardInterrupt; SIGTERM ends the process)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        what = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else name
        raise HookStopped(f"{where}: stopped by {what} while this hook was running", 128 + signum)

    def on_alarm(signum, frame):
        where = running()
        if where is not None:
            raise HookStopped(
                f"{where}: stopped after hook_timeout_s = {_timeout_s:g} s: the hook had not returned (a loop that never ends, or a wait on something that never comes?)",
                1,
            )

    handlers = {signal.SIGTERM: on_signal, signal.SIGINT: on_signal, signal.SIGALRM: on_alarm}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    _timeout_s = timeout_s or None
    try:
        yield
    finally:
        _timeout_s = None
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def dtypes_of(state) -> dict[str, torch.dtype]:
    """{key: dtype} of the tensors of a state dict."""
    return {k: v.dtype for k, v in state.items() if isinstance(v, torch.Tensor)}


def non_floating(state, model_dtypes: dict[str, torch.dtype]) -> tuple[str, torch.dtype, torch.dtype] | None:
    """(key, its dtype, the model's) of the first tensor of ``state`` that is not floating (int64,
    bool, complex) where the model's tensor of that key is; None when every one is."""
    if not isinstance(state, dict):
        return None
    for key, value in state.items():
        want = model_dtypes.get(key)
        if (
            isinstance(value, torch.Tensor)
            and want is not None
            and want.is_floating_point
            and not value.is_floating_point()
        ):
            return key, value.dtype, want
    return None
