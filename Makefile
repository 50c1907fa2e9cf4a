VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: run test install clean schema

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/muster up

test: $(STAMP)
	$(PY) -m pytest -q -ra tests

schema: $(STAMP)
	$(VENV)/bin/muster schema > schema.graphql

clean:
	rm -rf $(VENV) .muster
