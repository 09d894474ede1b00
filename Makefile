# Two commands on a fresh clone: `make quickstart` and `make test`. Both install into .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: install quickstart test test-all lint faults powercut clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "gymbus needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,math,ray,envs,sandbox,docker]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

quickstart: $(STAMP)
	$(BIN)/gymbus collect configs/quickstart.yaml

test: $(STAMP)
	$(BIN)/pytest

test-all: $(STAMP)
	$(BIN)/pytest -m ''

lint: $(STAMP)
	$(BIN)/ruff check broker runtime functions tests images scripts
	$(BIN)/lint-imports
	$(BIN)/mypy broker runtime functions

faults: $(STAMP)
	$(BIN)/python scripts/faults.py

powercut: $(STAMP)
	$(BIN)/python scripts/powercut.py

clean:
	rm -rf $(VENV) runs .pytest_cache

.PHONY: test-slow
test-slow: $(STAMP)  # the tests marked slow alone (CI runs them as a step of their own)
	$(BIN)/pytest -m slow
