# Developer and CI entry points. `make test` is what CI runs (.ci/run).
#
# The virtualenv in $(VENV) is created on first use and (re)installed only when
# pyproject.toml or a file under requirements/ changed since the last install
# (tracked by the stamp file $(STAMP)).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.guarded-installed
REQUIREMENTS := requirements/penguiflow.txt requirements/penguiflow-support.txt
PYTEST_ARGS ?=

.DEFAULT_GOAL := test
.PHONY: test lint docs format install bench demo tools assets clean distclean

## test: install if needed, lint, type-check, build the documentation site, run the test suite
test: lint docs tools
	$(PY) -m pytest $(PYTEST_ARGS)

## demo: the guarded store under a PenguiFlow-shaped workload and injected faults, with a verdict
demo: $(STAMP)
	$(PY) -m guarded demo $(DEMO_ARGS)

## tools: promtool and prometheus for the alert and dashboard tests, pgbouncer for the connection-pooler
## tests, redis-server for the Redis tests (apt-get when missing, as root); TypeScript and
## @grafana/schema for the dashboard schema check (npm ci in tools/grafana-schema)
tools:
	@scripts/ensure-apt-tools.sh
	@scripts/ensure-node-tools.sh

## assets: regenerate grafana/ from dashboards/, then refresh the package's copy in guarded/assets/
## (grafana/ and otel-collector.yaml, which `guarded assets export` ships; tests/assets/ checks it)
assets: $(STAMP)
	$(PY) -m dashboards
	$(PY) -m dashboards --grafana-dir guarded/assets/grafana
	cp otel-collector.yaml guarded/assets/otel-collector.yaml

## lint: ruff check, ruff format --check, mypy --strict
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --strict guarded backends

## docs: the documentation site (MkDocs, Material, the API reference from the docstrings) in site/;
## --strict: a broken link, anchor or API reference fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

## bench: print the benchmark figures the README quotes (side by side with their references)
bench: $(STAMP)
	$(PY) -m benchmarks $(BENCH_ARGS)

## format: apply ruff's formatting and safe fixes
format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

## install: create the virtualenv and install the project with its dev tools
install: $(STAMP)

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "guarded needs Python >= 3.11; set PYTHON=...")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml $(REQUIREMENTS) | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/penguiflow-support.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -r requirements/penguiflow.txt
	touch $@

## clean: remove build outputs and tool caches (keeps the virtualenv)
clean:
	rm -rf build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

## distclean: clean, and remove the virtualenv too
distclean: clean
	rm -rf $(VENV)
