# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv once.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: demo test lint test-slurm clean-demo

# TORCH_INDEX=https://download.pytorch.org/whl/cpu: on a machine without a GPU, torch and torchvision
# (pyproject.toml's pins) from PyTorch's CPU-only index first, instead of PyPI's default wheels and their
# ~5 GB of CUDA libraries. Unset (the default), nothing changes.
TORCH_INDEX ?=
TORCH_PINS = $(shell grep -o '"torch\(vision\)\?==[^"]*"' pyproject.toml | tr -d '"')

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(VENV)/bin/pip install $(TORCH_PINS) --index-url $(TORCH_INDEX))
	$(VENV)/bin/pip install -e ".[dev,flower]"
	touch $(STAMP)

# Training jobs start warm (forked from a process that imported torch once): see src/fedmedbench/jobserver.py.
demo: $(STAMP)
	time python -m fedmedbench with-jobserver snakemake --workflow-profile workflow/profiles/demo
	@echo "Tables, figures and the report are in results/demo/ (start with results/demo/report.md)"

# Three workers, one test file each at a time (--dist loadfile keeps a file's shared fixtures, e.g. the
# one Flower federation of tests/test_federation.py, in one process): the real-federation tests wait on
# Flower's polling most of the time, so the other files run meanwhile (~10 min instead of ~19 on 2 cores).
test: $(STAMP)
	pytest -n 3 --dist loadfile

lint: $(STAMP)
	snakemake --lint
	snakefmt --check .

# The tiny pipeline through workflow/profiles/slurm on a real single-node SLURM with accounting (root,
# Debian; installs the packages when missing; 3-6 min on 2 cores). CI runs it (.ci/run).
test-slurm: $(STAMP)
	tests/slurm/run_tiny.sh

clean-demo:
	rm -rf results/demo
