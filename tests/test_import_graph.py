"""The package's import graph: no circle, and imports point down the layers.

cli -> engine (fl/, federation/) / report / data -> ops / models -> util. In particular the data
layer knows nothing of training (no import of fl/, methods/, federation/ or the method registry), the
engine knows no method (fl/ and federation/ find methods by name through ``fedmedbench.registry``
and import none of ``methods/``), what the engine runs on knows no engine (the round protocol, the
scoring, the selection, the run folder, the federation's apps and the methods import nothing of
``fl/engine.py``), and only ``__main__`` imports the CLI.

(a) is a scan of the source (``ast``): every import counts, at the top of a module or inside a
function, since a function-level import is only a circle postponed. Importing ``pkg.sub`` from
outside ``pkg`` runs ``pkg/__init__.py`` first, so it is an edge to both. (b) imports each module
alone, in a process that has imported no other module of the package.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "fedmedbench"


def module_files(package: Path = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (its file, whether it is a package's __init__)}."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _owner(name: str, modules) -> str | None:
    """The package module that ``name`` (a module, or a name defined in one) lives in."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the package's modules whose import it runs}."""
    modules = module_files(package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                # `from pkg import sub` imports the module pkg.sub; `from mod import name` imports mod
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names
                ]
            else:
                continue
            for target in targets:
                target = _owner(target, modules)
                if target is None:
                    continue
                # pkg.sub imported from outside pkg runs pkg/__init__.py first (and its parents')
                chain = target.split(".")
                for depth in range(1, len(chain) + 1):
                    step = ".".join(chain[:depth])
                    if step != name and not (name == step or name.startswith(step + ".")):
                        graph[name].add(step)
    return graph


@functools.lru_cache(maxsize=1)
def package_graph() -> dict[str, frozenset[str]]:
    """The package's graph, scanned once for all the tests here (read only)."""
    return {name: frozenset(targets) for name, targets in import_graph().items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def _under(module: str, *folders: str) -> bool:
    return any(module == f"fedmedbench.{f}" or module.startswith(f"fedmedbench.{f}.") for f in folders)


# Every module of fl/, federation/ and methods/ lies below the engine: the engine runs them, none
# runs the engine (Flower's simulation route picks its device in fl/placement.py, as the engine does).


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _under(module, "data") and (
                _under(target, "fl", "methods", "federation") or target == "fedmedbench.registry"
            ):
                wrong.append(f"{module} imports {target}: the data layer knows nothing of training")
            if _under(module, "fl", "federation") and _under(target, "methods"):
                wrong.append(
                    f"{module} imports {target}: the engine knows no method (find it by name: fedmedbench.registry)"
                )
            if (
                target == "fedmedbench.fl.engine"
                and _under(module, "fl", "federation", "methods")
                and module != "fedmedbench.fl.engine"
            ):
                wrong.append(
                    f"{module} imports {target}: it lies below the engine (fl/evaluation.py, fl/selection.py, fl/runfolder.py hold what both use)"
                )
            if target == "fedmedbench.cli" and module != "fedmedbench.__main__":
                wrong.append(f"{module} imports {target}: only __main__ imports the CLI")
    return wrong


def test_the_scan_sees_circles_and_layers(tmp_path):
    """The scan itself, on a hand-made package: a circle through a function-level import and through
    a package's __init__, and each layering rule, are found."""
    pkg = tmp_path / "fedmedbench"
    files = {
        "__init__.py": "",
        "cli.py": "from fedmedbench import jobserver\n",
        "jobserver.py": "def run():\n    from fedmedbench.cli import main\n",  # function level: still a circle
        "data/__init__.py": "",
        "data/store.py": "from ..fl import faults\n",
        "data/digest.py": "def f():\n    from .folders.options import E\n",
        "data/folders/__init__.py": "from ..digest import f\n",
        "data/folders/options.py": "E = 1\n",
        "fl/__init__.py": "",
        "fl/faults.py": "",
        "fl/engine.py": "from fedmedbench.methods import load_method\n",
        "fl/rounds.py": "def f():\n    from fedmedbench.fl.engine import evaluate\n",  # below the engine
        "federation/__init__.py": "",
        "federation/simulation.py": "def f():\n    from fedmedbench.fl.engine import pick_device\n",  # below the engine too
        "methods/__init__.py": "",
        "methods/cffl.py": "from ..fl import engine\n",  # a method, below the engine
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert graph["fedmedbench.data.digest"] == {"fedmedbench.data.folders", "fedmedbench.data.folders.options"}
    assert graph["fedmedbench.data.folders.options"] == set()  # its own package is not re-imported
    cycle = find_cycle(graph)
    assert cycle == ["fedmedbench.cli", "fedmedbench.jobserver", "fedmedbench.cli"]
    del graph["fedmedbench.jobserver"]
    assert find_cycle(graph) == ["fedmedbench.data.digest", "fedmedbench.data.folders", "fedmedbench.data.digest"]
    assert layer_violations(graph) == [
        "fedmedbench.data.store imports fedmedbench.fl: the data layer knows nothing of training",
        "fedmedbench.data.store imports fedmedbench.fl.faults: the data layer knows nothing of training",
        "fedmedbench.federation.simulation imports fedmedbench.fl.engine: it lies below the engine (fl/evaluation.py, fl/selection.py, fl/runfolder.py hold what both use)",
        "fedmedbench.fl.engine imports fedmedbench.methods: the engine knows no method (find it by name: fedmedbench.registry)",
        "fedmedbench.fl.rounds imports fedmedbench.fl.engine: it lies below the engine (fl/evaluation.py, fl/selection.py, fl/runfolder.py hold what both use)",
        "fedmedbench.methods.cffl imports fedmedbench.fl.engine: it lies below the engine (fl/evaluation.py, fl/selection.py, fl/runfolder.py hold what both use)",
    ]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_circle():
    graph = package_graph()
    assert len(graph) > 50  # the scan found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)
    # The last circle, fl.engine <-> fl.rounds, was broken by moving what both use below both:
    # the round protocol imports the engine's old helpers from their new homes, never the engine.
    assert "fedmedbench.fl.rounds" in graph["fedmedbench.fl.engine"]
    assert "fedmedbench.fl.engine" not in graph["fedmedbench.fl.rounds"]


def test_imports_point_down_the_layers():
    assert layer_violations(package_graph()) == []


# Run in a fresh interpreter: each module is imported in a child forked from a parent that has
# imported none of the package, so the module must bring in everything it needs itself (an import
# that only works after another module happened to run first fails here). Third-party libraries are
# imported by the parent before forking (torch alone takes seconds), except for the DAG-time modules,
# which are imported before torch is and must not import it (Snakemake builds the DAG without it).
CHILDREN = textwrap.dedent(
    """
    import importlib, json, os, sys, traceback

    names, torch_free, third_party = json.loads(sys.argv[1])
    HEAVY = ("torch", "torchvision", "monai", "flwr")  # torch, or libraries that import it

    def preload(libs):
        for lib in libs:
            try:
                importlib.import_module(lib)
            except Exception:  # an optional extra that is not installed: its modules are skipped below
                pass

    def start(name):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                importlib.import_module(name)
                result = {"ok": True, "torch": "torch" in sys.modules}
            except ModuleNotFoundError as err:  # an optional extra (flwr) that is not installed
                result = {"ok": err.name is not None and not err.name.startswith("fedmedbench"), "skipped": err.name,
                          "error": traceback.format_exc(limit=3)}
            except BaseException:
                result = {"ok": False, "error": traceback.format_exc(limit=6)}
            os.write(write, json.dumps(result).encode())
            os._exit(0)
        os.close(write)
        return pid, read

    def finish(pid, read):
        chunks = []
        while chunk := os.read(read, 1 << 16):
            chunks.append(chunk)
        os.close(read)
        os.waitpid(pid, 0)
        return json.loads(b"".join(chunks) or b'{"ok": false, "error": "the child died"}')

    def alone(names):
        # each name in its own child, a few children at a time (one per core)
        results, running, waiting = {}, [], list(names)
        while waiting or running:
            while waiting and len(running) < max(1, min(4, os.cpu_count() or 1)):
                name = waiting.pop(0)
                running.append((name, *start(name)))
            name, pid, read = running.pop(0)
            results[name] = finish(pid, read)
        return results

    preload(lib for lib in third_party if lib not in HEAVY)
    assert "torch" not in sys.modules, "a library imported before the DAG-time modules pulled torch in"
    results = alone(torch_free)
    preload(HEAVY)
    assert not any(m == "fedmedbench" or m.startswith("fedmedbench.") for m in sys.modules)
    results.update(alone([name for name in names if name not in results]))
    print(json.dumps(results))
    """
)

# Modules that the Snakefile (DAG time) or a data job imports: no torch.
TORCH_FREE = ("fedmedbench.config", "fedmedbench.registry", "fedmedbench.faults", "fedmedbench.sources")


def _module_level(tree: ast.AST):
    """The nodes that run when the module is imported (not those inside a function)."""
    for node in ast.iter_child_nodes(tree):
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _module_level(node)


def _third_party(modules) -> list[str]:
    """The libraries the package imports at import time (a function's import runs when it is called)."""
    names = set()
    for path, _ in modules.values():
        for node in _module_level(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
    return sorted(n for n in names - {"fedmedbench", "__future__"} if n not in sys.stdlib_module_names)


@pytest.mark.slow  # outside `make test`: a long run; `make test-all` runs it
def test_each_module_imports_alone():
    modules = module_files()
    names = sorted(n for n in modules if n != "fedmedbench.__main__")  # __main__ runs the CLI
    torch_free = sorted(
        n for n in names if n in TORCH_FREE or n.startswith("fedmedbench.data.") or n == "fedmedbench.data"
    )
    payload = json.dumps([names, torch_free, _third_party(modules)])
    result = subprocess.run(
        [sys.executable, "-c", CHILDREN, payload], capture_output=True, text=True, timeout=900, cwd=PACKAGE.parents[1]
    )  # ~15 s of CPU
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(results) == set(names)
    failed = {name: r["error"] for name, r in results.items() if not r["ok"]}
    assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())
    with_torch = [name for name in torch_free if results[name].get("torch")]
    assert with_torch == [], f"imports torch, but runs at DAG time or in a data job: {with_torch}"
