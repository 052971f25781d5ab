"""The method registry: methods found by name, without importing them. One module per method, built in
(``fedmedbench.methods.<name>``) or a plug-in, with the same contract: ``Server``, ``Client``,
``DEFAULTS`` (its hyperparameters, a literal dict) and ``PERSONALIZED`` (whether each client keeps
its own model, which switches model selection to per-client).

A plug-in is named in the config (``methods: {fedxyz: {module: my_lab.fedxyz, ...}}``) or by an
entry point of group ``fedmedbench.methods`` of an installed package (``fedxyz = "my_lab.fedxyz"``);
its name may not be a built-in's. A parameter's type is its default's (bool, int, float, str);
``PARAM_SCHEMA`` (optional, a literal dict of JSON-Schema fragments) declares ranges, choices and
parameters whose default is ``None``. Both are read from the source without importing the module,
so the config is checked when Snakemake builds the DAG, without torch.

It lives beside, not inside, the ``methods`` package: the engine, the config and the CLI find a
method here by name and import it with ``importlib`` (``load_method``), so none of them imports a
method's module, and the engine knows no method.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import re
import types
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from fedmedbench import sources, values
from fedmedbench.errors import ConfigError, closest, unknown_key
from fedmedbench.sources import source_digest

ENTRY_POINT_GROUP = "fedmedbench.methods"
BUILTIN_PACKAGE = "fedmedbench.methods"
# The built-ins' folder, listed without importing the package (nor any method in it).
BUILTIN_FOLDER = Path(__file__).parent / "methods"
CONTRACT = ("DEFAULTS", "Server", "Client", "PERSONALIZED")


@dataclass(frozen=True)
class MethodRef:
    """Where a method lives: its name in the config, its module and source file, and its origin."""

    name: str
    module: str
    path: Path
    origin: str  # "built-in" | "config: <module>" | "entry point of <distribution>"

    @property
    def builtin(self) -> bool:
        return self.origin == "built-in"

    def digest(self) -> str:
        """Every source file the plug-in depends on (its package's .py files and the user's modules
        they import, fedmedbench.sources), hashed: in its runs' config, so editing any of them re-runs
        exactly its jobs. Computed once per process (Snakemake asks for it once per job)."""
        return source_digest(self.module, str(self.path))


@functools.lru_cache(maxsize=None)
def builtin_methods() -> tuple[str, ...]:
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(BUILTIN_FOLDER)]) if not m.name.startswith("_")))


@functools.lru_cache(maxsize=1)
def entry_point_methods() -> dict[str, tuple[str, str]]:
    """{name: (module, distribution)} of the installed plug-ins."""
    found = {}
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = point.dist.name if point.dist is not None else "an unnamed distribution"
        if point.name in builtin_methods():
            raise ConfigError(
                f"entry point {point.name!r} of {dist} ({ENTRY_POINT_GROUP}) has the name of a built-in method; rename it"
            )
        found[point.name] = (point.value.partition(":")[0], dist)
    return found


def available_methods() -> tuple[str, ...]:
    return tuple(sorted({*builtin_methods(), *entry_point_methods()}))


def _source_of(module: str, where: str) -> Path:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:  # a parent package is missing, or an empty name
        raise ConfigError(
            f"{where}: cannot find module {module!r} ({err}); is it installed or on PYTHONPATH?"
        ) from None
    if spec is None:
        raise ConfigError(f"{where}: cannot find module {module!r}; is it installed or on PYTHONPATH?")
    if spec.origin is None or not spec.origin.endswith(".py"):
        raise ConfigError(
            f"{where}: module {module!r} has no Python source file (found {spec.origin}); a method is a .py module"
        )
    return Path(spec.origin)


@functools.lru_cache(maxsize=None)
def find_method(name: str, module: str | None = None) -> MethodRef:
    """The method ``name``: a plug-in when ``module`` is given (``methods.<name>.module``), else a
    built-in or an installed entry point."""
    if module is not None:
        if name in builtin_methods():
            raise ConfigError(f"methods.{name}.module: {name!r} is a built-in method; give the plug-in another name")
        ref = MethodRef(name, module, _source_of(module, f"methods.{name}.module"), f"config: {module}")
    elif name in builtin_methods():
        ref = MethodRef(name, f"{BUILTIN_PACKAGE}.{name}", BUILTIN_FOLDER / f"{name}.py", "built-in")
    elif name in entry_point_methods():
        target, dist = entry_point_methods()[name]
        ref = MethodRef(name, target, _source_of(target, f"entry point {name!r} of {dist}"), f"entry point of {dist}")
    else:
        raise ConfigError(
            f"unknown method {name!r}{closest(name, available_methods())}; available: {', '.join(available_methods())} "
            f"(a method of your own: `module: <import path>` in its section of `methods`, see docs/extending.md)"
        )
    _declarations(ref)  # the contract, checked now (DAG time) rather than in a job
    return ref


def load_method(name: str, module: str | None = None) -> ModuleType:
    ref = find_method(name, module)
    loaded = importlib.import_module(ref.module)
    missing = [part for part in CONTRACT if not hasattr(loaded, part)]
    if missing:
        raise ConfigError(f"method {name!r} ({ref.module}): the module lacks {', '.join(missing)}")
    return loaded


def _bound_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (classes, functions, assignments, imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


@functools.lru_cache(maxsize=None)
def _declarations(ref: MethodRef) -> tuple[dict, dict, bool | None]:
    """(DEFAULTS, PARAM_SCHEMA, PERSONALIZED) as literals from the method's source; parsed once per
    process (Snakemake resolves every job's parameters when it builds the DAG)."""
    try:
        tree = ast.parse(ref.path.read_text(), filename=str(ref.path))
    except SyntaxError as err:
        raise ConfigError(f"method {ref.name!r} ({ref.path}:{err.lineno}): syntax error: {err.msg}") from None
    missing = [part for part in CONTRACT if part not in _bound_names(tree)]
    if missing:
        raise ConfigError(
            f"method {ref.name!r} ({ref.module}, {ref.path}): the module lacks {', '.join(missing)} (the contract: {', '.join(CONTRACT)})"
        )
    found: dict = {}
    for node in tree.body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if isinstance(target, ast.Name) and target.id in ("DEFAULTS", "PARAM_SCHEMA", "PERSONALIZED"):
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                raise ConfigError(
                    f"method {ref.name!r} ({ref.path}:{node.lineno}): {target.id} must be a literal (numbers, strings, lists, dicts)"
                ) from None
    if not isinstance(found.get("DEFAULTS"), dict):
        raise ConfigError(f"method {ref.name!r} ({ref.path}): DEFAULTS must be a literal dict")
    return found["DEFAULTS"], found.get("PARAM_SCHEMA", {}), found.get("PERSONALIZED")


def method_defaults(name: str, module: str | None = None) -> dict:
    """A method's ``DEFAULTS`` (a copy)."""
    return dict(_declarations(find_method(name, module))[0])


def is_personalized(name: str, module: str | None = None) -> bool | None:
    return _declarations(find_method(name, module))[2]


@functools.lru_cache(maxsize=None)
def _param_schemas(ref: MethodRef) -> dict[str, dict]:
    defaults, declared, _ = _declarations(ref)
    for key in declared:
        if key not in defaults:
            raise ConfigError(
                f"method {ref.name!r} ({ref.path}): PARAM_SCHEMA declares {key!r}, which is not in DEFAULTS"
            )
    schemas = {}
    for key, default in defaults.items():
        schema = declared.get(key) or values.inferred_schema(default)
        if schema is None:
            raise ConfigError(
                f"method {ref.name!r} ({ref.path}): parameter {key!r} defaults to {default!r}; declare its type in PARAM_SCHEMA"
            )
        schemas[key] = schema
    return schemas


def param_schemas(name: str, module: str | None = None) -> dict[str, dict]:
    """Per parameter, its JSON-Schema declaration (PARAM_SCHEMA, else the default's type)."""
    return dict(_param_schemas(find_method(name, module)))


def check_param(name: str, key: str, value, where: str, module: str | None = None) -> None:
    schemas = _param_schemas(find_method(name, module))
    if key not in schemas:
        raise unknown_key(where, key, schemas)
    values.check(value, schemas[key], f"{where}.{key}")


def merge_params(name: str, given: dict, where: str, module: str | None = None) -> dict:
    """The method's DEFAULTS updated by ``given``; an unknown key, a value of the wrong type or out
    of range is a ConfigError naming ``where.<key>``."""
    for key, value in given.items():
        check_param(name, key, value, where, module)
    return {**_declarations(find_method(name, module))[0], **given}


# The paper of a method: the first parenthesis of its docstring's first line that holds a year.
PAPER = re.compile(r"\s*\(([^()]*\b(?:19|20)\d\d\b[^()]*)\)")


@functools.lru_cache(maxsize=None)
def _docstring_line(ref: MethodRef) -> str:
    doc = ast.get_docstring(ast.parse(ref.path.read_text(), filename=str(ref.path))) or ""
    return doc.strip().split("\n")[0].strip()


def summary(name: str, module: str | None = None) -> tuple[str, str | None]:
    """(what the method is, its paper or None), from the first line of its module's docstring, as
    the built-ins write it: ``FedBN (Li et al., ICLR 2021): batch-norm layers stay local, ...``."""
    line = _docstring_line(find_method(name, module)) or name
    paper = PAPER.search(line)
    if paper is None:
        return line, None
    return (line[: paper.start()] + line[paper.end() :]).strip(), paper.group(1).strip()


def bn_statistics(name: str, module: str | None = None) -> str:
    """Where the method keeps batch-norm statistics, read from its own classes (a plug-in's too):
    whether its ``Server.package`` sends anything after the common start, and which keys of a probe
    model with one BN layer its ``Client.declare_local_keys`` keeps local. Imports torch and the method."""
    from torch import nn  # noqa: PLC0415  (torch: the DAG and the data jobs import this module, torch-free (tests/test_import_graph.py))

    from fedmedbench.ops.aggregate import batchnorm_keys, buffer_keys  # noqa: PLC0415  (imports torch; see above)

    loaded = load_method(name, module)
    params = method_defaults(name, module)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    # The run config's part that key policies read; FedAvg's default, under which only the method decides.
    cfg = types.SimpleNamespace(
        aggregation=types.SimpleNamespace(bn_buffers="average", weighting="uniform"), method_params=params
    )
    server = loaded.Server.__new__(loaded.Server)  # no __init__: it would build the federation
    server.cfg, server.params, server.global_state = cfg, params, model.state_dict()
    try:
        sent = server.package(0, 1)
    except Exception:  # a package built from more than the probe holds: it does send something
        sent = True
    if sent is None:
        return "local (nothing is sent after the common start: each client keeps its whole model)"
    client = loaded.Client.__new__(loaded.Client)
    client.cfg, client.params, client.model = cfg, params, model
    try:
        local = client.declare_local_keys()
    except Exception as err:  # a key policy that needs more of the client than its model
        return f"not known (its Client.declare_local_keys needs more than the model: {type(err).__name__}: {err})"
    norm = batchnorm_keys(model)
    if norm <= local:
        return "local (running statistics and affine weights never leave the client)"
    if norm & buffer_keys(model) <= local:
        return "local running statistics; the affine weights are averaged"
    return "averaged with the model (a task's aggregation.bn_buffers: local keeps them at each client)"


def forget() -> None:
    """Drop what this process has read about methods (for a process that outlives an edit: tests)."""
    for cached in (find_method, _declarations, _param_schemas, entry_point_methods, _docstring_line):
        cached.cache_clear()
    sources.forget()
