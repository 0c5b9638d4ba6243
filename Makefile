# Everything a fresh machine needs is installed by these targets.
PYTHON ?= python3
VENV := .venv
# BIN follows VENV (set VENV to use another virtualenv).
override BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo check test lint bench chaos docs clean

$(STAMP): pyproject.toml
	scripts/ensure-java
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,spark,connect,server]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/poisonq demo --dir demo

lint: $(STAMP)
	$(BIN)/ruff check poisonq pyspark_poisonq.py tests bench scripts
	$(BIN)/ruff format --check poisonq pyspark_poisonq.py tests bench scripts
	$(BIN)/mypy

# The fast tier: lint, types and the tests that need neither Spark, PostgreSQL nor Chromium.
check: lint
	$(BIN)/pytest -q -m "not spark and not postgres and not browser and not slow"

test: lint
	scripts/ensure-postgres
	scripts/ensure-chromium
	scripts/ensure-axe
	scripts/ensure-promtool
	$(BIN)/pytest

chaos: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m tests.chaos --runs 50 --jobs 2

bench: $(STAMP)
	$(BIN)/python bench/queue_throughput.py
	scripts/ensure-postgres
	$(BIN)/python bench/queue_throughput.py --postgres
	$(BIN)/python bench/queue_floors.py
	$(BIN)/python bench/queue_floors.py --sqlite
	$(BIN)/python bench/pipeline_throughput.py
	$(BIN)/python bench/pipeline_floors.py
	$(BIN)/python bench/lease_cycle.py
	$(BIN)/python bench/held_costs.py
	$(BIN)/python bench/defect_ratio.py
	$(BIN)/python bench/processor_isolation.py

# The reference site from docs/ into site/ (live preview: .venv/bin/mkdocs serve).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) demo site .cache .pytest_cache .mypy_cache .ruff_cache
