# The two commands of the README. Both set everything up first (idempotent, quick when done).
.PHONY: setup train test
PY := .venv/bin/python

setup:
	bash scripts/setup.sh

train: setup
	$(PY) train.py $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)
