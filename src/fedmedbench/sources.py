"""The user's source files a plug-in module depends on, and one digest of them.

A plug-in method's digest is part of its runs' config (``method_digest``), so an edit of any file its
code runs re-runs exactly its jobs. The files are

- every ``.py`` file of the plug-in's top-level package (``my_lab`` for ``my_lab.fedxyz``), wherever
  it is installed: the package is the plug-in;
- the local modules those files import, transitively: imports are read from the source (``ast``,
  nothing is imported) and resolved the way Python would (``importlib.util.find_spec`` for a top-level
  name, ``PathFinder`` inside a package found so), keeping only files that are neither the standard
  library, nor a third-party install (a ``site-packages`` or ``dist-packages`` folder), nor fedmedbench
  itself. A helper module beside a plug-in that is not in a package, a sibling package, or a package
  of the user's installed in editable mode (which resolves to its source tree) is such a file.

What an AST scan cannot see (``importlib.import_module`` of a computed name, data files the code
reads) is not covered. Snakemake resolves every job's params when it builds the DAG, so the scan runs
once per process and module (``forget`` drops it).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

THIRD_PARTY_FOLDERS = ("site-packages", "dist-packages")


@functools.lru_cache(maxsize=1)
def _system_roots() -> tuple[str, ...]:
    """Folders whose files are never the user's: the standard library and fedmedbench itself."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib") if paths.get(key)}
    roots.add(str(Path(__file__).parent))  # the fedmedbench package
    return tuple(sorted({os.path.realpath(r) for r in roots}))


def is_local(path: str | os.PathLike) -> bool:
    """A file of the user's own (not the standard library, a third-party install or fedmedbench)."""
    real = os.path.realpath(path)
    if any(part in THIRD_PARTY_FOLDERS for part in Path(real).parts):
        return False
    return not any(real == root or real.startswith(root + os.sep) for root in _system_roots())


@functools.lru_cache(maxsize=None)
def _locate(name: str) -> tuple[Path | None, tuple[str, ...] | None] | None:
    """(source file, package search folders) of the module ``name`` if it is local, else None.
    Never imports anything: a package's submodules are looked up in the package's folders."""
    parent, _, _ = name.rpartition(".")
    try:
        if not parent:
            if name in sys.stdlib_module_names or name in sys.builtin_module_names:
                return None
            spec = importlib.util.find_spec(name)  # a top-level name: found, not imported
        else:
            found = _locate(parent)
            if found is None or found[1] is None:
                return None  # a non-local package's submodule, or an attribute of a module
            spec = importlib.machinery.PathFinder.find_spec(name, list(found[1]))
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None:
        return None
    origin = spec.origin if spec.has_location and spec.origin and spec.origin.endswith(".py") else None
    locations = tuple(spec.submodule_search_locations) if spec.submodule_search_locations is not None else None
    if origin is not None and not is_local(origin):
        return None
    if origin is None and (locations is None or not any(is_local(p) for p in locations)):
        return None  # built-in or compiled, or a namespace package of third-party folders
    return (Path(origin) if origin else None), locations


def _imported_names(tree: ast.AST, package: str) -> list[str]:
    """Every module an import statement of ``tree`` may load, parents included (importing ``a.b.c``
    runs ``a`` and ``a.b`` too); ``package``: the module's package, for relative imports."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:
                base = (
                    importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                    if node.level
                    else node.module
                )
            except (ImportError, ValueError):
                continue  # a relative import beyond the top-level package: Python refuses it too
            if not base:
                continue
            # `from a import b`: b is a submodule or a name in a; both are tried.
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            names.extend(".".join(parts[: i + 1]) for i in range(len(parts)))
    return names


def _key(module: str, path: Path) -> str:
    """A file's name relative to its sys.path folder (``my_lab/helpers.py``): digests do not depend
    on where the checkout lies."""
    return module.replace(".", "/") + ("/__init__.py" if path.name == "__init__.py" else ".py")


@functools.lru_cache(maxsize=None)
def local_sources(module: str, path: str) -> tuple[tuple[str, Path], ...]:
    """``(name, file)`` of every source file the module ``module`` (its file: ``path``) depends on,
    sorted by name; see the module docstring."""
    files: dict[Path, str] = {}
    top = module.partition(".")[0]
    top_spec = importlib.util.find_spec(top)
    if top_spec is not None and top_spec.submodule_search_locations is not None:
        for folder in top_spec.submodule_search_locations:
            for file in sorted(Path(folder).rglob("*.py")):
                relative = file.relative_to(folder)
                if any(part == "__pycache__" or part.startswith(".") for part in relative.parts):
                    continue
                files.setdefault(file.resolve(), f"{top}/{relative.as_posix()}")
    parts = module.split(".")
    queue = [(module, Path(path))]
    for i in range(1, len(parts)):  # importing a.b.c runs the __init__ of a and of a.b
        found = _locate(".".join(parts[:i]))
        if found is not None and found[0] is not None:
            queue.append((".".join(parts[:i]), found[0]))
    scanned: set[Path] = set()
    while queue:
        name, file = queue.pop()
        real = file.resolve()
        if real in scanned:
            continue
        scanned.add(real)
        files.setdefault(real, _key(name, file))
        try:
            tree = ast.parse(file.read_bytes(), filename=str(file))
        except (SyntaxError, ValueError, OSError):
            continue  # hashed as it is; importing it will say what is wrong
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        for imported in _imported_names(tree, package):
            found = _locate(imported)
            if found is not None and found[0] is not None:
                queue.append((imported, found[0]))
    return tuple(sorted((key, real) for real, key in files.items()))


@functools.lru_cache(maxsize=None)
def source_digest(module: str, path: str) -> str:
    """One digest of the names and contents of ``local_sources(module, path)``."""
    digest = hashlib.sha256()
    for key, file in local_sources(module, path):
        digest.update(f"{key}\0{hashlib.sha256(file.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()[:16]


def forget() -> None:
    """Drop what this process found (for a process that outlives an edit: tests)."""
    for cached in (_locate, local_sources, source_digest):
        cached.cache_clear()
    importlib.invalidate_caches()
