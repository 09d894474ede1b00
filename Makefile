# Two commands on a fresh clone: `make quickstart` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install quickstart test lint faults clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "gymbus needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,math,ray]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

quickstart: $(STAMP)
	$(BIN)/gymbus collect configs/quickstart.yaml

test: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check broker runtime functions tests images scripts examples

faults: $(STAMP)
	$(BIN)/python scripts/faults.py

clean:
	rm -rf $(VENV) runs .pytest_cache
