VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: run test install clean schema system-deps

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

test: $(STAMP) system-deps
	$(PY) -m pytest -q -ra tests

schema: $(STAMP)
	$(VENV)/bin/muster schema > schema.graphql

clean:
	rm -rf $(VENV) .muster
