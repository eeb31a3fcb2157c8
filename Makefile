# Two commands for users: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV ?= .venv
# The CPU build by default; GPU users pick their own, e.g. TORCH_SPEC="torch==2.13.0+cu128".
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint clean browser

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

test: install browser
	$(BIN)/python -m pytest -q
	$(MAKE) lint

# The swarm tier's dashboard test drives a real headless Chromium: the system's, installed here from
# Debian/Ubuntu packages where this user may (root with apt-get); elsewhere that one test skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "make browser: could not install chromium; the dashboard browser test will skip"; \
	  else echo "make browser: no chromium and no root apt-get; the dashboard browser test will skip"; fi; }

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
