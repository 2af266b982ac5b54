# Two entry points, each setting itself up on a machine with nothing but Python:
#   make serve   serve the bundled default models
#   make test    run the whole test suite
#
# PyTorch is installed first and pinned, so pip never resolves an unpinned torch
# (which would pull several GB of CUDA packages on a CPU-only machine).
# Pick another build with TORCH_SPEC / TORCH_INDEX, for example a CUDA build:
#   make serve TORCH_INDEX="--index-url <PyTorch wheel index for your CUDA version>"
# Everything else comes at the versions in constraints.txt, those CI last tested (CONSTRAINTS= lifts them);
# `make constraints` re-resolves the newest that pyproject.toml allows and writes them there.

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=
CONSTRAINTS ?= constraints.txt
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
FRESH       := .venv-constraints

.PHONY: serve test setup clean constraints

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX)
	$(PY) -m pip install --quiet -e ".[test]" $(if $(CONSTRAINTS),--constraint $(CONSTRAINTS))
	touch $@

# A fresh environment with the newest versions pyproject.toml allows, frozen into constraints.txt (torch apart:
# TORCH_SPEC pins it). Run `make test` after it, and commit the file if the tests pass.
constraints:
	rm -rf $(FRESH)
	$(PYTHON) -m venv $(FRESH)
	$(FRESH)/bin/python -m pip install --quiet --upgrade pip
	$(FRESH)/bin/python -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX)
	$(FRESH)/bin/python -m pip install --quiet -e ".[test]"
	{ sed -n '/^#/p' constraints.txt; $(FRESH)/bin/python -m pip freeze --exclude-editable | grep -iv '^torch=='; } \
		> constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(FRESH)

serve: $(STAMP)
	$(VENV)/bin/quill serve

# Two test processes (pytest-xdist), each test file in one of them: most live-server tests wait on their servers.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

clean:
	rm -rf $(VENV) .pytest_cache
