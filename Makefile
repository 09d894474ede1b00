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
	$(BIN)/ruff check broker runtime functions tests images scripts examples
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

# The bridges to other ecosystems (functions/reasoning_gym, nemo_gym_bridge, verifiers_bridge,
# openenv_bridge): their extras into .venv, NeMo Gym into an environment of its own (Python 3.13,
# $(NEMO_VENV)), then every bridge test, those marked `bridges` included. A part that cannot be had
# here (no Python 3.13, no Docker engine) makes its tests skip, saying why.
NEMO_VENV ?= .venv-nemo-gym
.PHONY: test-bridges
test-bridges: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[reasoning_gym,verifiers,openenv]'
	bash scripts/nemo_gym_env.sh $(NEMO_VENV)
	GYMBUS_NEMO_GYM_PYTHON=$$([ -x $(NEMO_VENV)/bin/python ] && echo $(CURDIR)/$(NEMO_VENV)/bin/python) \
		$(BIN)/pytest -m '' functions/reasoning_gym functions/nemo_gym_bridge functions/verifiers_bridge \
		functions/openenv_bridge tests/test_env_lost.py
