# Two commands do all the set-up on a fresh machine:
#   make run    the embedded default experiment, trained in run/ (Snakemake workflow, scikit-learn digits, 2 cores)
#   make test   ruff, the import contract, snakemake --lint, then the test suite (real CIFAR-10 from $INCOFL_DATA_DIR,
#               default ../shared/data)

VENV ?= .venv
CORES ?= 2
RUN_DIR ?= run
BIN := $(VENV)/bin

# Where real data sets live (CIFAR-10 JPEG archive for the tests and CIFAR configs).
export INCOFL_DATA_DIR ?= $(abspath ../shared/data)
# glibc allocator settings worth +13% to +50% CPU training throughput (see README "Performance").
export MALLOC_MMAP_THRESHOLD_ ?= 33554432
export MALLOC_TRIM_THRESHOLD_ ?= 4294967296

# pytest's workers: the suite's tests are single-threaded (threads: 1), so one per core.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25

.PHONY: run test test-fast coverage lint bench clean-results

# The venv's Python: 3.11 to 3.13, the versions every pinned dependency supports (pyproject.toml's
# requires-python). Without PYTHON=..., the first of PYTHONS on PATH whose version is one of them.
# Versions are read only when the venv is to be made; a Python of another version, or none, stops
# make in one line before anything is made, saying how to get one.
PYTHONS := python3.13 python3.12 python3.11 python3
SUPPORTED := 3.11 3.12 3.13
python_version = $(word 2,$(shell $(1) --version 2>/dev/null))
supported = $(filter $(addsuffix .%,$(SUPPORTED)),$(call python_version,$(1)))
PYTHON ?= $(firstword $(foreach p,$(PYTHONS),$(if $(call supported,$(p)),$(p))))
PYTHON_VERSION = $(call python_version,$(PYTHON))
NEEDS := this project needs Python 3.11, 3.12 or 3.13

$(BIN)/.installed: pyproject.toml
	$(if $(PYTHON),,$(error none of $(PYTHONS) on PATH is Python 3.11 to 3.13; $(NEEDS) (Debian/Ubuntu: \
		apt install python3; macOS: brew install python@3.13; conda: conda create -n incofl python=3.13), \
		then: PYTHON=/path/to/python3.13 make $(MAKECMDGOALS)))
	$(if $(call supported,$(PYTHON)),,$(error PYTHON=$(PYTHON) $(if $(PYTHON_VERSION),is Python $(PYTHON_VERSION),was \
		not found); $(NEEDS): PYTHON=python3.13 make $(MAKECMDGOALS)))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade --quiet pip
	$(BIN)/pip install --quiet -e '.[test,flower]'
	touch $@

# The default experiment trained for real, in $(RUN_DIR) (results/ under it, not committed): the
# committed results/ are DVC's outputs (`dvc repro`), which a fresh clone holds already and this
# leaves as they are. Rerun, Snakemake does only what is missing. It ends with the verdict of
# `incofl compare` on the rerun against the committed runs (docs/workflow.md, "Did my rerun
# reproduce?"): a cell not reproduced (its exit code 1) fails make; an inconclusive verdict (exit
# code 3: bits that cannot match, e.g. another torch build, and evidence neither way) is reported and is not an error of make.
run: $(BIN)/.installed
	$(BIN)/snakemake --cores $(CORES) --directory $(RUN_DIR) --config experiment=$(CURDIR)/config/config.yaml
	$(BIN)/incofl compare $(RUN_DIR)/results/runs results/runs || [ $$? -eq 3 ]

# Fails fast, in this order: ruff lint, ruff format check, the import contract (pyproject.toml's
# [tool.importlinter]: config validation imports no training code), Snakemake's linter on the workflow
# (parses it with config/config.yaml; no data, no jobs; exit 1 on any lint), the test suite on
# $(TEST_WORKERS) pytest-xdist workers, printing its 25 slowest tests (README "Tests").
# tests/slurm_smoke/Snakefile (a by-hand SLURM check, no test runs it) is not linted: its rules
# are bash and SLURM variables, and the linter's "conda environment or container" lint, which
# has no per-rule switch, cannot be met sensibly there.
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/snakemake --lint

test: lint
	$(PYTEST)

# The inner loop while working (about a minute): lint, then the tests that train nothing
# end to end (`-m "not slow"`).
test-fast: lint
	$(PYTEST) -m "not slow"

# Line coverage of src/incofl, subprocesses (the CLI, Snakemake's jobs) included:
# [tool.coverage] in pyproject.toml. Writes htmlcov/ and prints the per-file table.
coverage: $(BIN)/.installed
	$(BIN)/coverage erase
	COVERAGE_FILE=$(abspath .coverage) $(PYTEST) --cov --cov-report=term --cov-report=html

bench: $(BIN)/.installed
	$(BIN)/incofl bench

# What a run writes that git does not carry (the committed runs, tables and figures are DVC
# outputs recorded in dvc.lock: `git checkout -- results` restores them after a rerun).
clean-results:
	rm -rf $(RUN_DIR) resources/data results/logs results/benchmarks results/plots results/config.yaml results/report.html \
		results/analysis results/studies
