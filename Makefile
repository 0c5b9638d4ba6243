# Everything a fresh machine needs is installed by these targets.
PYTHON ?= python3
VENV := .venv
# BIN follows VENV (set VENV to use another virtualenv).
override BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The oldest PySpark the `spark` extra allows, whose Spark tests `make test` runs in a
# virtualenv of its own (make test-oldest-spark).
OLDEST_SPARK := 4.2.0
OLDEST_VENV := .venv-spark-$(OLDEST_SPARK)
OLDEST_STAMP := $(OLDEST_VENV)/.installed

.PHONY: install demo check test test-oldest-spark lint bench chaos docs clean

# $(call virtualenv,DIR,EXTRA-REQUIREMENTS): poisonq in DIR with every extra.
define virtualenv
	scripts/ensure-java
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet --upgrade pip
	$(1)/bin/pip install --quiet -e '.[dev,spark,connect,server]' $(2)
	touch $(1)/.installed
endef

$(STAMP): pyproject.toml
	$(call virtualenv,$(VENV))

$(OLDEST_STAMP): pyproject.toml
	$(call virtualenv,$(OLDEST_VENV),'pyspark==$(OLDEST_SPARK)')

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/poisonq demo --dir demo

lint: $(STAMP)
	$(BIN)/ruff check poisonq pyspark_poisonq.py tests bench scripts
	$(BIN)/ruff format --check poisonq pyspark_poisonq.py tests bench scripts
	$(BIN)/mypy

# The fast tier: lint, types and the tests that need neither Spark, PostgreSQL nor Chromium,
# the conformance suites through the sync API (their asyncio runs are make test's).
check: lint
	$(BIN)/pytest -q -m "not spark and not postgres and not browser and not slow and not asyncio_variant" --hypothesis-profile=check

test: lint
	scripts/ensure-postgres
	scripts/ensure-chromium
	scripts/ensure-axe
	scripts/ensure-promtool
	$(BIN)/pytest
	$(MAKE) test-oldest-spark

# The tests of PySpark's API (the `pyspark` marker of tests/conftest.py) on the oldest release,
# on the SQLite store: the Spark code is the same on both stores, and the slow runs on a cluster
# and over Spark Connect, and the PostgreSQL variants, are the main run's.
test-oldest-spark: $(OLDEST_STAMP)
	$(OLDEST_VENV)/bin/pytest -m "pyspark and not slow and not postgres"

chaos: $(STAMP)
	scripts/ensure-postgres
	$(BIN)/python -m tests.chaos --runs 50 --jobs 2

bench: $(STAMP)
	$(BIN)/python bench/queue_throughput.py
	scripts/ensure-postgres
	$(BIN)/python bench/queue_throughput.py --postgres
	$(BIN)/python bench/queue_floors.py
	$(BIN)/python bench/queue_floors.py --sqlite
	$(BIN)/python bench/aio_throughput.py --postgres
	$(BIN)/python bench/async_store.py
	$(BIN)/python bench/pipeline_throughput.py
	$(BIN)/python bench/sensor_events.py --batch 100000 --batch 1000000
	$(BIN)/python bench/pipeline_floors.py
	$(BIN)/python bench/lease_cycle.py
	$(BIN)/python bench/failure_letters.py
	$(BIN)/python bench/failure_letters.py --postgres
	$(BIN)/python bench/held_costs.py
	$(BIN)/python bench/store_growth.py
	$(BIN)/python bench/defect_ratio.py
	$(BIN)/python bench/processor_isolation.py

# The reference site from docs/ into site/ (live preview: .venv/bin/mkdocs serve).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(OLDEST_VENV) demo site .cache .pytest_cache .mypy_cache .ruff_cache
