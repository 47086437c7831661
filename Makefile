# tb-introspect developer targets. `make demo` and `make test` work on a fresh
# Debian machine: they make the virtual environment and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOGDIR ?= logs/demo
PORT ?= 6006

.PHONY: venv frontend demo serve test lint chromium bench clean

venv: $(STAMP)

$(STAMP): setup.py pyproject.toml $(wildcard frontend/package.json frontend/package-lock.json)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[tf-cpu,demo,test,bench]'
	$(BIN)/pip install --no-deps 'tf-keras>=2.16,<2.22'
	touch $(STAMP)

# Rebuild the frontend bundle after editing frontend/src.
frontend: $(STAMP)
	cd frontend && { test -d node_modules || npm ci --no-audit --no-fund; } && npm run build

# Train the demo models, then serve TensorBoard with the Introspect tab.
demo: $(STAMP)
	$(BIN)/tb-introspect demo --logdir $(LOGDIR) --serve --port $(PORT)

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && apt-get install -y -qq chromium fonts-dejavu-core; }

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) chromium lint
	$(BIN)/python -m pytest -q -p no:cacheprovider tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python benchmarks/stats_bench.py
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/plugin_bench.py
	$(BIN)/python benchmarks/frontend_bench.py

clean:
	rm -rf $(VENV) frontend/node_modules tb_introspect/static build *.egg-info
