# Two commands matter: `make run` (the whole stack with the WeCom emulator) and `make test`.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.installed
PYTHON  ?= python3

.PHONY: run test lint install services migrate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

services:
	@bash scripts/ensure_services.sh

run: install services
	$(PY) scripts/dev_env.py var/dev.env
	$(PY) -m scripts.run_stack

test: install services
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .

migrate: install
	$(PY) -m app.cli migrate

clean:
	rm -rf var/ .pytest_cache .ruff_cache
