VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean schema system-deps

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/muster up

# PostgreSQL and Chromium from Debian when missing (the history and browser tests).
system-deps:
	.ci/debian-deps

# Style and import order (ruff), types (mypy: strict for wire/ and the pure decision
# modules), and the architecture's import rules (import-linter; contracts in pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The suite in TEST_WORKERS processes (pytest-xdist): most tests wait on the processes
# they start, so a 2-core machine runs several at once; tests marked `heavy` run on one
# worker, one at a time (tests/conftest.py). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 3

test: lint system-deps
	$(PY) -m pytest -q -ra tests -n $(TEST_WORKERS) --dist loadgroup

schema: $(STAMP)
	$(VENV)/bin/muster schema > schema.graphql

clean:
	rm -rf $(VENV) .muster
