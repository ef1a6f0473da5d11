# The two commands of the README. Each sets up what it needs first (idempotent, quick when done):
# train only the core (torch, torchvision, Hydra, TensorBoard, the dataset); test everything, engines included.
.PHONY: setup setup-all setup-core setup-gpu-tests train test test-gpu
PY := .venv/bin/python

setup setup-all:
	bash scripts/setup.sh all

setup-core:
	bash scripts/setup.sh core

setup-gpu-tests:
	bash scripts/setup.sh gpu-tests

train: setup-core
	$(PY) train.py $(ARGS)

# Two test files at a time (pytest-xdist; a file's tests stay together, so its module fixtures run once).
test: setup
	$(PY) -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

# On a GPU machine: the gpu-marked tests plus every strategy x precision, killed and resumed (scripts/gpu_smoke.py).
# It needs the core and the test tools only (no engine build: nvcc and the network may be missing there); an engine
# `make setup` did not install skips its tests and cells with one line.
test-gpu: setup-gpu-tests
	$(PY) scripts/gpu_smoke.py
