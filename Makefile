# The two commands of the README. Both set everything up first (idempotent, quick when done).
.PHONY: setup train test test-gpu
PY := .venv/bin/python

setup:
	bash scripts/setup.sh

train: setup
	$(PY) train.py $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# On a GPU machine: the gpu-marked tests plus every strategy x precision, killed and resumed (scripts/gpu_smoke.py).
test-gpu: setup
	$(PY) scripts/gpu_smoke.py
