# Two commands for users: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV ?= .venv
# PyTorch is installed first, from PyTorch's CPU index by default (PyPI's Linux wheel is the CUDA
# build, several GB). GPU users pick theirs: TORCH_INDEX=https://download.pytorch.org/whl/cu128,
# or TORCH_INDEX= (empty) for PyPI's default build.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint clean browser

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch alone from TORCH_INDEX; its own dependencies come with the project, from PyPI
	$(BIN)/python -m pip install --quiet --retries 1 --no-deps "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
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
