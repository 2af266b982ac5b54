# Two entry points, each setting itself up on a machine with nothing but Python:
#   make serve   serve the bundled default models
#   make test    run the whole test suite
#
# PyTorch is installed first and pinned, so pip never resolves an unpinned torch
# (which would pull several GB of CUDA packages on a CPU-only machine).
# Pick another build with TORCH_SPEC / TORCH_INDEX, for example a CUDA build:
#   make serve TORCH_INDEX="--index-url <PyTorch wheel index for your CUDA version>"

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed

.PHONY: serve test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX)
	$(PY) -m pip install --quiet -e ".[test]"
	touch $@

serve: $(STAMP)
	$(VENV)/bin/quill serve

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
