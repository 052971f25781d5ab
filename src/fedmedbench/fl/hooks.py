"""Every call into a method's hooks, named when it fails.

A method's ``Server`` and ``Client`` (a built-in's or a plug-in's) run as subclasses made here
(``guard``, ``load_method``) whose hooks are wrapped: an exception leaving a hook becomes one
``MethodError`` line naming the method, the hook, the round and the client, then the original error
(its ``__cause__``, so ``-v`` shows the traceback down to the method's line), e.g.
``method 'myfed', Client.train, round 3, client 'site2': KeyError: 'x'``. The project's own errors
(``FedmedbenchError``: a divergence, a config key, a site's refusal) name what they are about
already and pass unchanged, as do KeyboardInterrupt and SystemExit (not ``Exception``s).

The wrappers sit on the class, not at the call sites, so every caller gets them: the round loop
(fl/rounds.py), the checkpoints (fl/runfolder.py), the scoring (fl/evaluation.py) and a Flower
site's ClientApp, which builds its client through ``load_method`` too: both runtimes say the same
line. A hook called by another (the base ``train`` calls ``loss``) is named itself.

``state_dict``'s value is also checked for what a checkpoint cannot hold (fl/checkpoint.py), so a numpy
array in a method's state is named with its hook and client before anything is written. The state a
hook hands on (the server's global state after ``aggregate``, a package, a client's reply) is checked
for integer or boolean tensors where the model's are floating (``wrong_dtype``). Each call is recorded
in fl/hookwatch.py while it runs, so that SIGTERM, Ctrl-C or ``hook_timeout_s`` name the hook.
"""

from __future__ import annotations

import types

import torch

from fedmedbench import registry
from fedmedbench.errors import FedmedbenchError, MethodError
from fedmedbench.fl import checkpoint, hookwatch

# Every hook the engine calls (fl/engine.py, rounds.py, runfolder.py, evaluation.py) and the ones
# the base Client.train calls (before_epoch, loss, after_backward, train_step).
CLIENT_HOOKS = (
    "__init__",
    "receive",
    "before_epoch",
    "loss",
    "after_backward",
    "train_step",
    "train",
    "reply",
    "answer",
    "eval_model",
    "state_dict",
    "load_state_dict",
)
SERVER_HOOKS = ("__init__", "package", "query", "aggregate", "round_log", "state_dict", "load_state_dict")
# Run outside any round (building, resuming): named without one.
NO_ROUND = ("__init__", "load_state_dict")


def _client_name(role: str, hook: str, obj, args: tuple) -> str | None:
    """The client a call concerns: a Client's own, or the one a Server packages for."""
    try:
        if role == "Client":
            return obj.name if hook != "__init__" else args[0].clients[args[1]]  # Client(cfg, index, ...)
        if hook == "package":
            return obj.cfg.clients[args[0]]  # package(client_index, round_index)
    except (AttributeError, IndexError, TypeError):  # a method that set up less than the base does
        pass
    return None


def where(method: str, role: str, hook: str, obj, args: tuple = ()) -> str:
    """``method 'x', Client.train, round 3, client 'B'`` (the round and client where known)."""
    parts = [f"method {method!r}", f"{role}.{hook}"]
    round_index = getattr(obj, "round_index", None) if hook not in NO_ROUND else None
    if round_index is not None:
        parts.append(f"round {round_index}")
    client = _client_name(role, hook, obj, args)
    if client is not None:
        parts.append(f"client {client!r}")
    return ", ".join(parts)


def described(err: BaseException) -> str:
    """``KeyError: 'x'``: the error's type and message, on one line."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# What a checkpoint holds: tensors, these leaves, and these containers (exact types: a defaultdict
# or a namedtuple is refused there too). tests/test_method_errors.py checks that the two agree.
CHECKPOINT_LEAVES, CHECKPOINT_MAPPINGS, CHECKPOINT_SEQUENCES = (
    checkpoint.LEAVES,
    checkpoint.MAPPINGS,
    checkpoint.SEQUENCES,
)


def uncheckpointable(value, at: str = "", seen: set | None = None) -> tuple[str, str] | None:
    """(where, type name) of the first value in ``value`` a checkpoint cannot hold, or None."""
    kind = type(value)
    if isinstance(value, (torch.Tensor, float)) or kind in CHECKPOINT_LEAVES:  # numpy's float64 is a float
        return None
    seen = set() if seen is None else seen
    if id(value) in seen:  # a container met before (the checkpoint keeps it as a reference)
        return None
    if kind in CHECKPOINT_MAPPINGS:
        seen.add(id(value))
        for key, item in value.items():
            found = uncheckpointable(key, f"{at}[{key!r}]", seen) or uncheckpointable(item, f"{at}[{key!r}]", seen)
            if found:
                return found
        return None
    if kind in CHECKPOINT_SEQUENCES:
        seen.add(id(value))
        for index, item in enumerate(value):
            found = uncheckpointable(item, f"{at}[{index!r}]", seen)
            if found:
                return found
        return None
    return at, f"{kind.__module__}.{kind.__qualname__}"


def _hook(method: str, role: str, base: type, hook: str):
    def call(self, *args, **kwargs):
        hookwatch.entered(lambda: where(method, role, hook, self, args))  # what a SIGTERM or a timeout names
        try:
            # Looked up at each call: a hook patched on the method's class later (a benchmark's
            # timer, a test) is the one that runs.
            value = getattr(base, hook)(self, *args, **kwargs)
        except FedmedbenchError:
            raise
        except Exception as err:
            raise MethodError(f"{where(method, role, hook, self, args)}: {described(err)}") from err
        finally:
            hookwatch.left()
        if role == "Server" and hook == "__init__":  # Server(cfg, model, num_clients): the dtypes its state keeps
            model = args[1] if len(args) > 1 else kwargs.get("model")
            if isinstance(model, torch.nn.Module):
                self._model_dtypes = hookwatch.dtypes_of(model.state_dict())
        wrong_dtype(method, role, hook, self, args, value)
        if hook == "state_dict":
            found = uncheckpointable(value)
            if found:
                at, what = found
                raise MethodError(
                    f"{where(method, role, hook, self)}: the value at {at or 'the top'} is a {what}, which a checkpoint cannot hold "
                    "(it holds tensors, numbers, strings, bytes and dicts/lists/tuples/sets of them: torch.as_tensor turns an array into a tensor)"
                )
        return value

    call.__name__, call.__qualname__, call.__doc__ = hook, f"{base.__qualname__}.{hook}", getattr(base, hook).__doc__
    return call


def wrong_dtype(method: str, role: str, hook: str, obj, args: tuple, value) -> None:
    """A MethodError naming the key when the state a hook hands on (the server's global state after
    ``aggregate``, a package, a client's reply) holds a non-floating tensor (int64, bool) where the
    model's is floating: the next ``receive`` would cast it back without a word, its weights rounded."""
    if role == "Server" and hook == "aggregate":
        state, what = getattr(obj, "global_state", None), "the global state"
    elif role == "Server" and hook == "package" and isinstance(value, dict):
        state, what = value.get("state"), "the package"
    elif (
        role == "Client"
        and hook == "reply"
        and isinstance(value, dict)
        and isinstance(getattr(obj, "model", None), torch.nn.Module)
    ):
        state, what = value.get("state"), "the reply"
    else:
        return
    model_dtypes = (
        getattr(obj, "_model_dtypes", None) if role == "Server" else hookwatch.dtypes_of(obj.model.state_dict())
    )
    found = hookwatch.non_floating(state, model_dtypes or {})
    if found:
        key, got, want = found
        raise MethodError(
            f"{where(method, role, hook, obj, args)}: {what}'s tensor {key!r} is {got}, the model's is {want}: keep the model's "
            f"floating dtype (integer arithmetic rounds the weights; divide with / or cast back with .to({want}))"
        )


def guard(cls: type, method: str, role: str) -> type:
    """``cls`` (a method's ``Server`` or ``Client``: ``role``) with its hooks wrapped; the same name,
    module and behaviour otherwise."""
    hooks = CLIENT_HOOKS if role == "Client" else SERVER_HOOKS
    namespace = {hook: _hook(method, role, cls, hook) for hook in hooks if hasattr(cls, hook)}
    namespace.update(__module__=cls.__module__, __qualname__=cls.__qualname__, __doc__=cls.__doc__)
    return type(cls.__name__, (cls,), namespace)


def load_method(name: str, module: str | None = None) -> types.SimpleNamespace:
    """``registry.load_method``'s method (its contract: Server, Client, DEFAULTS, PERSONALIZED) with
    its Server and Client guarded."""
    loaded = registry.load_method(name, module)
    return types.SimpleNamespace(
        Server=guard(loaded.Server, name, "Server"),
        Client=guard(loaded.Client, name, "Client"),
        DEFAULTS=loaded.DEFAULTS,
        PERSONALIZED=loaded.PERSONALIZED,
        __name__=loaded.__name__,
    )
