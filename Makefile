# tb-introspect developer targets. `make demo` and `make test` work on a fresh
# Debian machine: they make the virtual environment and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOGDIR ?= logs/demo
PORT ?= 6006
# pytest-xdist workers of `make test`. Much of the suite waits on subprocesses (training,
# tensorboard, Chromium), so a third worker keeps two cores busy: tests/conftest.py gives each
# process one compute thread, so the workers share the cores instead of spinning against each
# other (on the 2-core machine: 17 m 06 s with two workers, 16 m 11 s with three).
# loadfile: a module and its module-scoped fixtures stay on one worker (built once).
TEST_WORKERS ?= 3
# Some machines set PYTHONDONTWRITEBYTECODE (these reference machines do): then each of the
# suite's hundreds of interpreters compiles every module it imports again, thousands of
# TensorFlow's among them, and pytest rewrites every test module's asserts in each worker.
# Python writes each .pyc once, atomically, and every later import reads it.
unexport PYTHONDONTWRITEBYTECODE
# uv trusts the system's certificate store, as pip and npm do here: a machine whose traffic
# goes through a proxy with its own certificate authority has it there (uv's bundled roots
# alone fail to connect).
export UV_SYSTEM_CERTS := 1

.PHONY: venv frontend demo serve test test-durations test-js test-oldest lint chromium bench clean

# The oldest TensorFlow, Keras, TensorBoard and protobuf that setup.py's ranges allow (keep in step).
OLDEST_VENV := .venv-oldest
# Both test environments: ml_dtypes 0.7.0's import registers its numpy ufunc loops one by one
# (1.07 s against 0.6.0's 0.12 s), in every process that imports TensorFlow, and the suite
# starts about 20 of them. TensorFlow and Keras accept either version.
DEV_PINS := ml_dtypes==0.6.0
OLDEST_PINS := tensorflow-cpu==2.20.0 keras==3.10.0 tensorboard==2.20.0 protobuf==6.31.1
# Collection and plugin tests (not the slow or browser ones): a few minutes.
OLDEST_TESTS := tests/keras/test_keras_callback.py tests/keras/test_introspector.py \
  tests/format/test_summary.py tests/format/test_format.py tests/read/test_read_provider.py \
  tests/plugin/test_plugin_overview.py tests/plugin/test_plugin_routes.py \
  tests/plugin/test_plugin_tensorboard.py tests/plugin/test_plugin_no_tensorflow.py \
  tests/keras/test_implicit_lr.py tests/keras/test_exact_activity.py \
  tests/keras/test_private.py tests/pipeline/test_governor.py tests/keras/test_keras_plan.py

venv: $(STAMP)

$(STAMP): Makefile setup.py pyproject.toml $(wildcard frontend/package.json frontend/package-lock.json)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	# torch first, with pip: the trainers' own requirement on torch must find it installed
	# (PyPI's default build is a CUDA one of several GB; pip takes a machine's own wheel of it
	# where its configuration points to one, uv does not).
	# uv installs the rest: it resolves and downloads in parallel. Nothing is byte-compiled
	# here: of the venv's 23,000 files the tests import about 9,000, and they compile those
	# once, on first import (above). A fresh clone's `make venv`, empty caches: 112 s with pip
	# and compileall on every core, 27 s this way (the same packages).
	$(BIN)/pip install --no-compile 'torch==2.13.0' 'uv==0.13.8'
	$(BIN)/uv pip install --python $(BIN)/python $(DEV_PINS) \
	  -e '.[tf-cpu,demo,test,bench,s3,transformers,lightning,jax]'
	$(BIN)/uv pip install --python $(BIN)/python --no-deps 'tf-keras>=2.16,<2.22'
	touch $(STAMP)

# Rebuild the frontend bundle after editing frontend/src, tb_introspect/metadata.py, slots.py or
# tb_introspect/schema.py: frontend/src/schema.js (the names and chart texts the tab imports)
# is generated from them.
frontend: $(STAMP)
	$(BIN)/python -m tb_introspect.schema_js
	cd frontend && { test -d node_modules || npm ci --no-audit --no-fund; } && npm run build

# Train the demo models, then serve TensorBoard with the Introspect tab.
demo: $(STAMP)
	$(BIN)/tb-introspect demo --logdir $(LOGDIR) --serve --port $(PORT)

# Debian's headless shell of Chromium: the browser tests' engine without the full browser's
# UI process (a quarter fewer CPU-seconds in them).
chromium:
	@command -v chromium-headless-shell >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium-headless-shell for the browser tests"; \
	  apt-get update -qq && \
	  apt-get install -y -qq --no-install-recommends chromium-headless-shell \
	    fonts-dejavu-core; }

lint: $(STAMP)
	$(BIN)/ruff check .

# Longest module first (tests/schedule.py): our order, not xdist's (by number of tests).
PYTEST_XDIST := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: $(STAMP) chromium lint test-js
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_XDIST) tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 1; fi; exit $$rc

# The same run, writing each module's seconds to tests/durations.json (the order of the next).
test-durations: $(STAMP) chromium
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_XDIST) --record-durations tests

# The frontend's pure modules under node's own test runner: only node, no node_modules.
# The shell expands the glob: node 20 reads no glob patterns itself.
test-js:
	cd frontend && node --test test/*.test.js

# The collection and plugin tests on the oldest dependencies the ranges allow, in a second
# virtual environment (it reuses the frontend bundle when one is built).
test-oldest: $(STAMP)
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	TB_INTROSPECT_SKIP_FRONTEND=1 $(BIN)/uv pip install -q --python $(OLDEST_VENV)/bin/python \
	  $(OLDEST_PINS) $(DEV_PINS) -e '.[test]'
	$(OLDEST_VENV)/bin/python -m pip check
	$(OLDEST_VENV)/bin/python -m pytest -q -p no:cacheprovider -m 'not slow and not browser' \
	  $(OLDEST_TESTS)

bench: $(STAMP)
	$(BIN)/python benchmarks/stats_bench.py
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/plugin_bench.py
	$(BIN)/python benchmarks/frontend_bench.py

clean:
	rm -rf $(VENV) $(OLDEST_VENV) frontend/node_modules tb_introspect/static build *.egg-info
