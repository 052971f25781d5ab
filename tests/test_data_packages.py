"""Each built-in dataset family is a package whose files show its parts, behind one registry."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fedmedbench.data import FAMILIES, load_family

DATA = Path(__file__).resolve().parents[1] / "src" / "fedmedbench" / "data"
BUILT_IN = [f for f in FAMILIES if f != "folders"]
PARTS = ("sites", "download", "raw", "splits", "synthetic")
# A part's own helpers, each imported by that part only.
HELPERS = {"fundus": ("opencv_resize",)}
INTERFACE = {"DOWNLOADS", "PROTOCOLS", "write_synthetic", "preprocess", "split"}


@pytest.mark.parametrize("family", BUILT_IN)
def test_family_is_a_package_of_its_parts(family):
    files = sorted(p.stem for p in (DATA / family).glob("*.py"))
    assert files == sorted(("__init__",) + PARTS + HELPERS.get(family, ()))
    assert not (DATA / f"{family}.py").exists()
    module = load_family(family)
    assert module.__name__ == f"fedmedbench.data.{family}"
    for name in ("DOWNLOADS", "PROTOCOLS", "write_synthetic", "preprocess", "split"):
        assert hasattr(module, name), f"{family} lacks {name}"
    # Each part holds what its name says: the download specs in download.py, the twin in synthetic.py.
    download = __import__(f"fedmedbench.data.{family}.download", fromlist=["DOWNLOADS"])
    assert download.DOWNLOADS == module.DOWNLOADS and len(module.DOWNLOADS) >= 1
    sites = __import__(f"fedmedbench.data.{family}.sites", fromlist=["PROTOCOLS"])
    assert sites.PROTOCOLS is module.PROTOCOLS


@pytest.mark.parametrize("family", BUILT_IN)
def test_a_family_exports_its_interface_only(family):
    """Everything else is reached through its part (``prostate.raw.read_volume``): one name, one place."""
    tree = ast.parse((DATA / family / "__init__.py").read_text())
    from_parts = {
        a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module for a in n.names
    }
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert from_parts | defined | assigned - {"__all__"} <= INTERFACE
    assert set(load_family(family).__all__) == INTERFACE


@pytest.mark.parametrize("family", BUILT_IN)
def test_parts_import_each_other_without_cycles(family):
    """sites and download import no other part; the import graph of the parts has no cycle."""
    imports = {}
    for part in PARTS:
        tree = ast.parse((DATA / family / f"{part}.py").read_text())
        imports[part] = {
            n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module in PARTS
        }
    assert imports["sites"] == set() and imports["download"] <= {"sites"}
    done: set[str] = set()

    def visit(part, path):
        assert part not in path, f"{family}: import cycle {' -> '.join(path + (part,))}"
        if part not in done:
            for other in imports[part]:
                visit(other, path + (part,))
            done.add(part)

    for part in PARTS:
        visit(part, ())


def test_families_load_without_torch():
    code = "import sys, fedmedbench.data as d\nfor f in d.FAMILIES: d.load_family(f)\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
