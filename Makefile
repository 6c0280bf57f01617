# Two commands for a new user: `make demo` and `make test`. While working: `make test-fast` (unit tests,
# no statistical audits, Spark, PostgreSQL or browser) and `make lint`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP_RUN := $(VENV)/.installed-run
STAMP_DEV := $(VENV)/.installed-dev

.PHONY: demo test test-fast lint docs bench bench-smoke clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The demo needs the command line, the service and the analytics engine; not torch or Spark.
$(STAMP_RUN): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[analytics,ml,cli,server]"
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@ $(STAMP_RUN)

demo: $(STAMP_RUN)
	$(BIN)/dpkit demo --out out/demo
	bash examples/census_queries.sh out/demo
	$(BIN)/python examples/curator_service.py out/demo

# The service's tests need a PostgreSQL server and a headless Chromium: the scripts install
# (Debian packages, as root) and start them; without them those tests skip and say why.
test: lint bench-smoke
	@pg=$$(bash scripts/postgres.sh start) || echo "make test: PostgreSQL could not be started; its tests will be skipped" >&2; \
	chromium=$$(bash scripts/chromium.sh) || echo "make test: no Chromium; the dashboard test will be skipped" >&2; \
	DPKIT_TEST_POSTGRES_URL="$$pg" DPKIT_CHROMIUM="$$chromium" $(BIN)/python -m pytest -n 2 --dist worksteal --doctest-modules src tests

# The markers are applied in tests/conftest.py; a fresh clone needs no service for this target.
FAST_MARKERS := not (slow or statistical or spark or postgres or browser)
test-fast: $(STAMP_DEV)
	DPKIT_TEST_POSTGRES_URL= DPKIT_CHROMIUM= $(BIN)/python -m pytest -n 2 --dist worksteal -m "$(FAST_MARKERS)" tests

# ruff (lint and format) on every folder of Python we write, mypy on the library; part of `make test`.
LINTED := src tests benchmarks examples
lint: $(STAMP_DEV)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

# The documentation site (mkdocs.yml): the pages under docs/ and the API reference from the
# docstrings, into out/site. Strict: a broken link or docstring reference fails the build.
docs: $(STAMP_DEV)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir out/site

# Peer libraries live in their own environment: their pins clash with dpkit's.
bench: $(STAMP_RUN)
	bash benchmarks/setup_env.sh
	.venv-bench/bin/python benchmarks/bench_noise.py
	.venv-bench/bin/python benchmarks/bench_accounting.py
	.venv-bench/bin/python benchmarks/bench_statistics.py
	.venv-bench/bin/python benchmarks/bench_groupby.py
	.venv-bench/bin/python benchmarks/bench_side_channels.py
	.venv-bench/bin/python benchmarks/bench_analytics_utility.py
	.venv-bench/bin/python benchmarks/bench_kmeans.py
	.venv-bench/bin/python benchmarks/bench_logistic.py
	.venv-bench/bin/python benchmarks/bench_dpsgd.py
	.venv-bench/bin/python benchmarks/bench_reconstruction.py
	.venv-bench/bin/python benchmarks/bench_server.py
	.venv-bench/bin/python benchmarks/bench_bins.py
	.venv-bench/bin/python benchmarks/bench_reading.py
	.venv-bench/bin/python benchmarks/bench_scale.py
	.venv-bench/bin/python benchmarks/bench_joins.py
	.venv-bench/bin/python benchmarks/bench_synth.py
	$(BIN)/python benchmarks/bench_import.py

# Every benchmark at a tiny size (seconds each) in dpkit's own environment, peers it lacks skipped:
# a benchmark that no longer runs fails `make test` rather than the next full run. bench_dpsgd_gpu.py
# runs its GPU rows only where there is a CUDA device (else `bash benchmarks/gpu_dpsgd.sh` on one).
bench-smoke: $(STAMP_DEV)
	$(BIN)/python benchmarks/run_smoke.py

clean:
	rm -rf $(VENV) .venv-bench out
