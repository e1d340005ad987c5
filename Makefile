# Two commands on a fresh machine:
#   make demo   - set up (venv, dependencies) and run the main job on a built-in topology
#   make test   - set up and run the whole test suite (fast tests + end-to-end tests)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
#: Spark's JVMs' class archives (actors/jvm_archive.py): 60-80 s once, then each
#: cold run's first message comes 1.6-3.6 s sooner (docs/benchmarks.md)
ARCHIVES := $(VENV)/.jvm-archives

.PHONY: setup demo test test-fast test-e2e lint bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/python -m runtime.sim.warm
	touch $(STAMP)

$(ARCHIVES): $(STAMP) actors/jvm_archive.py
	$(BIN)/python -m actors.jvm_archive
	touch $(ARCHIVES)

setup: $(STAMP) $(ARCHIVES)

demo: setup
	$(BIN)/python -m runtime.run topologies/demo.yaml

# the fast tests on two processes (pytest-xdist), then the end-to-end tests
# in one: they share one Ray + Spark session and want both cores each
test: setup
	$(BIN)/python -m pytest -q -m "not e2e" -n 2
	$(BIN)/python -m pytest -q -m e2e --durations=20

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not e2e" -n 2

test-e2e: setup
	$(BIN)/python -m pytest -q -m e2e --durations=20

lint: $(STAMP)
	$(BIN)/ruff check runtime actors scripts tests
	$(BIN)/mypy runtime

bench: $(STAMP)
	$(BIN)/python scripts/bench_routing.py

clean:
	rm -rf $(VENV) runs
