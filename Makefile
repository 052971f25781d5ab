# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv once (`make install` alone),
# from constraints.txt's exact versions.
PYTHON ?= python3
# The recipes' `time` is bash's keyword: /bin/sh (dash) has none, and /usr/bin/time may be absent.
SHELL := /bin/bash
VENV := .venv
STAMP := $(VENV)/.installed
export PATH := $(abspath $(VENV))/bin:$(PATH)

install: $(STAMP)

.PHONY: install demo test test-slow test-both-tiers test-without-shared test-kernels test-all lint test-slurm clean-demo

# torch and torchvision (constraints.txt's pins) first, by scripts/install_torch.py: without an NVIDIA GPU
# (no working nvidia-smi) from PyTorch's CPU-only index (~0.2 GB instead of ~3 GB of CUDA wheels),
# falling back to PyPI's default wheels in seconds where that index cannot be reached; with a GPU, PyPI's.
# TORCH_INDEX=URL installs them from URL; TORCH_INDEX=default (or TORCH_INDEX=) from PyPI.
$(STAMP): pyproject.toml constraints.txt scripts/install_torch.py
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python scripts/install_torch.py $(if $(filter undefined,$(origin TORCH_INDEX)),,--index "$(TORCH_INDEX)")
	$(VENV)/bin/pip install -c constraints.txt -e ".[dev,flower]"
	touch $(STAMP)

# Training jobs start warm (forked from a process that imported torch once): see src/fedmedbench/jobserver.py.
# DEMO_ARGS: more Snakemake options and targets (tests/test_workflow.py runs this command on tiny settings).
demo: $(STAMP)
	time python -m fedmedbench with-jobserver snakemake --workflow-profile workflow/profiles/demo $(DEMO_ARGS)
	@echo "Tables, figures and the report are in results/demo/ (start with results/demo/report.md)"

# The tiers (pytest markers, registered in pyproject.toml and tests/conftest.py; README: "Tests").
# Three workers, one test file each at a time (--dist loadfile keeps a file's shared fixtures, e.g. the
# one Flower federation of each half of tests/federation_matrix.py, in one process): a real federation or a Snakemake
# run waits on its subprocesses most of the time, so the other files run meanwhile. Each tier prints
# its 25 slowest tests (pyproject's --durations=25), so growth shows when it happens.
PYTEST_TIER = pytest -n 3 --dist loadfile

# The fast tier, for every change: units, invariants, hand-computed cases, the tiny end-to-end
# Snakemake run and one real federation. Everything not marked `slow`.
test: $(STAMP)
	$(PYTEST_TIER) -m "not slow"

# The rest: every federation of the equivalence matrix, Flower's simulation runtime, the longer
# Snakemake and install runs.
test-slow: $(STAMP)
	$(PYTEST_TIER) -m slow

# The tests of ../shared (marker `shared`) once more as a clone without ../shared runs them: they skip
# or fall back to synthetic data (tests/conftest.py: FEDMEDBENCH_SHARED).
test-without-shared: $(STAMP)
	FEDMEDBENCH_SHARED=/nonexistent/fedmedbench-shared pytest -q -m shared

# The numeric tests again under another set of CPU kernels (ATen's portable ones instead of
# AVX2/AVX-512): every assertion with a tolerance, between two code paths (a transcription of the
# official code, a hand computation, a closed form), must hold on any CPU. The byte-for-byte tests
# compare one code path with itself in one process, on one kernel set, and are not repeated.
NUMERIC_TESTS = $(addprefix tests/test_,$(addsuffix .py,aggregate cka fourier perturb metrics pfa precision \
	fedadam fednova fedbn moon fair_baselines harmofl_official fedlwr_official prrfl_official fair_official fedce_official))
test-kernels: $(STAMP)
	ATEN_CPU_CAPABILITY=default python -c "import torch; print('torch CPU kernels:', torch.backends.cpu.get_cpu_capability())"
	ATEN_CPU_CAPABILITY=default $(PYTEST_TIER) -m "not slow" $(NUMERIC_TESTS)

# Everything, as CI runs it: both tiers in one pytest run (the real federations wait on Flower's
# polling most of the time, so the other files run meanwhile: one run is much shorter than the two
# tiers one after the other), then the tests of ../shared without it, the numeric tests under the
# other kernels and the SLURM run. Each step's time is printed after it.
test-all: $(STAMP)
	@set -e; for step in test-both-tiers test-without-shared test-kernels test-slurm; do \
		start=$$(date +%s); $(MAKE) --no-print-directory $$step; \
		echo "make $$step: passed in $$(( $$(date +%s) - start )) s"; done

test-both-tiers: $(STAMP)
	$(PYTEST_TIER)

# The Python formatted and checked by ruff (pyproject.toml: pyflakes, import order, bugbear, imports at
# module top), the workflow by Snakemake's linter and snakefmt. CI runs it before the tests.
lint: $(STAMP)
	ruff format --check .
	ruff check .
	snakemake --lint
	snakefmt --check .

# The tiny pipeline through workflow/profiles/slurm on a real single-node SLURM with accounting (root,
# Debian; installs the packages when missing; 3-6 min on 2 cores). CI runs it (.ci/run).
test-slurm: $(STAMP)
	tests/slurm/run_tiny.sh

clean-demo:
	rm -rf results/demo

# The measured numbers quoted in README.md and docs/, rewritten from their result files under
# benchmarks/results/ (tests/test_docs.py fails when a page and its file disagree).
.PHONY: docs
docs:
	python3 scripts/docs_numbers.py
