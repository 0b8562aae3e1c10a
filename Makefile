# The README's commands. Every target creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
QUICK ?=

.PHONY: setup test demo lint bench engines clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# pypaimon's metadata pins pyarrow<20 although it works with ours: install it without its
# declared dependencies; the `paimon` extra (in `all`) lists the ones it really needs.
PYPAIMON := pypaimon==2.1.0

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet -e ".[all,dev]"
	$(PY) -m pip install --quiet --no-deps "$(PYPAIMON)"
	touch $(STAMP)

setup: $(STAMP)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(PY) examples/demo.py

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check flight_gateway planners clients pipelines spark_datasource
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports  # the layer contracts of pyproject.toml (docs/architecture.md)

# JVM engines the tests use (Trino, the Flight SQL JDBC driver), from Maven Central into
# ~/.cache/dataharness (HARNESS_ENGINES_DIR), checksums verified; `make test` fetches them too.
engines: setup
	$(PY) -m flight_gateway.local.engines

bench: setup
	$(PY) -m benchmarks $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
