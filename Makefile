# Two commands for users: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV ?= .venv
# The CPU build by default; GPU users pick their own, e.g. TORCH_SPEC="torch==2.13.0+cu128".
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# The main job: a whole swarm (bootstrap, validator, 3 miners, a follower) on loopback with
# configs/tiny.toml; a live table per round, then a report in pulse-demo/ (summary.json, plots).
demo: install
	$(BIN)/pulse demo

test: install
	$(BIN)/python -m pytest -q
	$(MAKE) lint

# The inner loop: the in-process tier (no real swarms), lint, import contracts and types.
test-fast: install
	$(BIN)/python -m pytest -q -m "not swarm"
	$(MAKE) lint

lint: install
	$(BIN)/ruff check protocol node validator tests
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
