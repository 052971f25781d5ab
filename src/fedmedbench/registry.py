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
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from fedmedbench import values
from fedmedbench.errors import ConfigError, closest, unknown_key

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
        from fedmedbench.sources import source_digest

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
            raise ConfigError(f"entry point {point.name!r} of {dist} ({ENTRY_POINT_GROUP}) has the name of a built-in method; rename it")
        found[point.name] = (point.value.partition(":")[0], dist)
    return found


def available_methods() -> tuple[str, ...]:
    return tuple(sorted({*builtin_methods(), *entry_point_methods()}))


def _source_of(module: str, where: str) -> Path:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as err:  # a parent package is missing, or an empty name
        raise ConfigError(f"{where}: cannot find module {module!r} ({err}); is it installed or on PYTHONPATH?") from None
    if spec is None:
        raise ConfigError(f"{where}: cannot find module {module!r}; is it installed or on PYTHONPATH?")
    if spec.origin is None or not spec.origin.endswith(".py"):
        raise ConfigError(f"{where}: module {module!r} has no Python source file (found {spec.origin}); a method is a .py module")
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
        raise ConfigError(f"method {ref.name!r} ({ref.module}, {ref.path}): the module lacks {', '.join(missing)} (the contract: {', '.join(CONTRACT)})")
    found: dict = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id in ("DEFAULTS", "PARAM_SCHEMA", "PERSONALIZED"):
            try:
                found[target.id] = ast.literal_eval(node.value)
            except ValueError:
                raise ConfigError(f"method {ref.name!r} ({ref.path}:{node.lineno}): {target.id} must be a literal (numbers, strings, lists, dicts)") from None
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
            raise ConfigError(f"method {ref.name!r} ({ref.path}): PARAM_SCHEMA declares {key!r}, which is not in DEFAULTS")
    schemas = {}
    for key, default in defaults.items():
        schema = declared.get(key) or values.inferred_schema(default)
        if schema is None:
            raise ConfigError(f"method {ref.name!r} ({ref.path}): parameter {key!r} defaults to {default!r}; declare its type in PARAM_SCHEMA")
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


def forget() -> None:
    """Drop what this process has read about methods (for a process that outlives an edit: tests)."""
    from fedmedbench import sources

    for cached in (find_method, _declarations, _param_schemas, entry_point_methods):
        cached.cache_clear()
    sources.forget()
