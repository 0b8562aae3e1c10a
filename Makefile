# The README's commands. Every target creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
QUICK ?=

.PHONY: setup test demo lint bench clean

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

bench: setup
	$(PY) -m benchmarks $(if $(QUICK),--quick,)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
