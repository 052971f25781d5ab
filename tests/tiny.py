"""The tiny synthetic run shared by the end-to-end test (tests/test_workflow.py) and the SLURM test
(tests/slurm/run_tiny.sh), so the two cannot drift apart: config/config.yaml, then the demo overlay (every
family built from its synthetic twin, no downloads), then tests/tiny.yaml.

`python -m tests.tiny` prints the config files in order, one a line, for the shell."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "workflow" / "profiles" / "demo" / "demo.yaml"
TINY_YAML = ROOT / "tests" / "tiny.yaml"
CONFIGFILES = [ROOT / "config" / "config.yaml", DEMO, TINY_YAML]
TINY = yaml.safe_load(TINY_YAML.read_text())

if __name__ == "__main__":
    print(*CONFIGFILES, sep="\n")
