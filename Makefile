# Two commands for users: `make demo` and `make test`. Both build .venv from nothing.
PYTHON ?= python3
VENV ?= .venv
# PyTorch is installed first, from PyTorch's CPU index by default (PyPI's Linux wheel is the CUDA
# build, several GB). For an NVIDIA card name its CUDA build in one word: `make demo GPU=cu128`
# (or cu126, cu118: what `nvidia-smi` says the driver supports), or `make cuda`; any index works
# with TORCH_INDEX=https://download.pytorch.org/whl/cu128, or TORCH_INDEX= (empty) for PyPI's build.
# torch has its own stamp named after TORCH_SPEC and TORCH_INDEX: asking for another build later
# (after a CPU `make demo`, say) replaces torch, and nothing else is reinstalled; a later `make`
# that asks for none keeps the build installed.
GPU ?=
TORCH_SPEC ?= torch==2.13.0
ifneq ($(GPU),)
TORCH_INDEX := https://download.pytorch.org/whl/$(GPU)
endif
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
BIN := $(VENV)/bin
TORCH_ID := $(shell printf '%s' '$(TORCH_SPEC) $(TORCH_INDEX)' | cksum | cut -d ' ' -f 1)
TORCH_STAMP := $(VENV)/.torch-$(TORCH_ID)
TORCH_ASKED := $(GPU)$(filter-out file,$(origin TORCH_INDEX) $(origin TORCH_SPEC))
TORCH_HELD := $(firstword $(wildcard $(VENV)/.torch-*))
ifeq ($(TORCH_ASKED),)
ifneq ($(TORCH_HELD),)
TORCH_STAMP := $(TORCH_HELD)
endif
endif
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint clean browser cuda

install: $(STAMP)

# The CUDA 12.8 build of torch (recent NVIDIA drivers); GPU=cu126 or cu118 for older ones.
cuda:
	$(MAKE) install GPU=$(or $(GPU),cu128)

$(TORCH_STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch alone from TORCH_INDEX (replacing any other build); its own dependencies come with the project
	$(BIN)/python -m pip install --quiet --no-compile --retries 1 --no-deps --force-reinstall "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	rm -f $(VENV)/.torch-* $(STAMP)
	@printf '%s\n' '$(TORCH_SPEC) $(TORCH_INDEX)' > $(TORCH_STAMP)

# then the red team (tests/redteam, its own package): `pulse bench attacks` and `failover` come from it
# pip byte-compiles what it installs on one core; compileall does the same on every core (half
# the install's time on two), and compiles pulse's own packages too: where PYTHONDONTWRITEBYTECODE
# is set nothing else would, and every process of a swarm would compile them again (about a second
# each). Files that are not Python 3 (a few packages ship some) fail there, as they do, unreported,
# under pip. A source edited later is compiled again on import, as always. Then the codec kernels,
# once: compiled on first use instead, every process started before the cache exists compiles them
# again (a node's first round, or each test worker and swarm process of a fresh clone).
$(STAMP): pyproject.toml tests/redteam/pyproject.toml $(TORCH_STAMP)
	$(BIN)/python -m pip install --quiet --no-compile -e ".[test]"
	$(BIN)/python -m pip install --quiet --no-compile --no-deps -e tests/redteam
	-$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))') \
	  node protocol validator tests >/dev/null
	@echo "compiling the codec kernels (numba, cached beside their modules; about 20 s once)"
	$(BIN)/python -c "from protocol.warmup import warm_up; warm_up()"
	touch $(STAMP)

# The main job: a whole swarm (bootstrap, validator, 3 miners, a follower) on loopback with
# configs/tiny.toml; a live table per round, then a report in pulse-demo/ (summary.json, plots).
demo: install
	$(BIN)/pulse demo

# The in-process tier runs on TEST_WORKERS processes (a file stays on one worker: module fixtures are
# shared as before), with the swarm tests marked `light` and lint, import contracts and types beside
# it: the in-process tests leave about a third of two cores idle. `light` swarms have a few
# processes each and no deadline that binds (DHT, transfers, lifetimes, shaped links, the demos,
# the README walkthrough, the home walk: their rounds close once every miner is in, so a busier
# machine only makes them slower). The swarms whose rounds run against deadlines, whose processes
# already fill the machine, run alone after it.
TEST_WORKERS ?= 2

test: install browser
	@$(MAKE) --no-print-directory lint > $(VENV)/lint.log 2>&1 & lint=$$!; \
	$(BIN)/python -m pytest -q -m "not swarm or light" -n $(TEST_WORKERS) --dist loadfile --durations=10; tier=$$?; \
	wait $$lint; linted=$$?; cat $(VENV)/lint.log; test $$tier = 0 && test $$linted = 0
	$(BIN)/python -m pytest -q -m "swarm and not light" --durations=15

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
	$(BIN)/python -m pytest -q -m "not swarm" -n $(TEST_WORKERS) --dist loadfile
	$(MAKE) lint

lint: install
	$(BIN)/ruff check protocol node validator tests
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
