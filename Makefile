# Two commands set everything up on a fresh machine:
#   make serve   installs the service and serves the default model on port 8000
#   make test    installs everything (training, dev tools, the browser and the Redis the
#                tests drive) and runs lint + the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: serve test lint smoke bench-decode bench-load clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Stamp files re-run the install only when pyproject.toml changes.
$(VENV)/.serve-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[train,dev]'
	touch $@ $(VENV)/.serve-installed

serve: $(VENV)/.serve-installed
	$(BIN)/translate-serve

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check .

test: lint
	bash scripts/install-test-tools.sh
	$(BIN)/python -m pytest

smoke:
	bash scripts/smoke.sh

bench-decode: $(VENV)/.dev-installed
	$(BIN)/python bench/decode.py --checkpoint runs/en-de/train/checkpoint_avg.pt --bundle models/en-de --test runs/en-de/data/test.tsv

bench-load: $(VENV)/.dev-installed
	$(BIN)/python bench/load.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
