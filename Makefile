# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint docs docs-serve bench chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# The whole suite in three runs that together select every test: what needs nothing beyond the
# pytest process, on four workers (test-fast; its tests wait as much as they compute); then what
# starts processes or uses services, two modules at a time (a module's fleet starts once, on one
# worker); then what times things or loads the machine (marked `alone`), one test at a time with
# nothing beside it. Each run runs even when one before it fails (one CI run shows every failure);
# any failing fails `make test`.
test: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks tools docs/examples
	$(VENV)/bin/ruff format --check src tests examples benchmarks tools docs/examples
	$(VENV)/bin/mypy --strict src examples docs/examples
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -n 4 --dist worksteal -m "$(FAST)"; fast=$$?; \
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not ($(FAST)) and not alone"; shared=$$?; \
	$(PY) -m pytest -q -m "not ($(FAST)) and alone"; alone=$$?; \
	[ $$fast -eq 0 ] && [ $$shared -eq 0 ] && [ $$alone -eq 0 ]

# The quick loop: every test that needs nothing beyond this process, over the whole tree (no
# processes, brokers or foreign clients): the markers are in pyproject.toml and tests/support/markers.py.
FAST := not spawns and not needs_redis and not needs_postgres and not needs_temporal and not needs_node and not needs_haproxy and not needs_chromium
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 4 --dist worksteal -m "$(FAST)"

# The static checks of `make test` alone: lint, format, types, import contracts (pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks tools docs/examples
	$(VENV)/bin/ruff format --check src tests examples benchmarks tools docs/examples
	$(VENV)/bin/mypy --strict src examples docs/examples
	$(VENV)/bin/lint-imports

# The docs site under site/, offline and strict: a broken link, a missing reference or a docstring
# griffe cannot read fails it. `make test` builds it too (tests/integration/test_docs_examples.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict

bench: $(STAMP)
	$(PY) benchmarks/rounds.py

# Flows and tasks behind HAProxy while instances are SIGKILLed (needs Redis; installs haproxy as root).
chaos: $(STAMP)
	$(PY) benchmarks/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache site
